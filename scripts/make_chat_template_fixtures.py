"""Write tests/fixtures/chat_templates.json: chat templates of several model families and
conversations, each rendered by transformers' apply_chat_template (the reference that
tests/test_chat_template.py compares pygpukit's renderer with, on machines without it).

    python3 scripts/make_chat_template_fixtures.py   # needs transformers and tokenizers
"""

from __future__ import annotations

import json
import os

ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
QWEN2 = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}\n    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou are provided with function signatures within '
    '<tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n'
    '    {%- endfor %}\n    {{- "\\n</tools><|im_end|>\\n" }}\n'
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) '
    'or (message.role == "assistant") %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{% for _ in range(2) %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endfor %}"
    "{% endif %}{% endfor %}"
)
FAMILIES = {
    "zephyr (TinyLlama-1.1B-Chat)": (
        ZEPHYR,
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
    "qwen2 (Qwen2.5-Instruct)": (QWEN2, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama3 (Llama-3-Instruct)": (
        LLAMA3,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    "mistral (Mistral-7B-Instruct-v0.1)": (
        MISTRAL,
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
}
CHATS = [
    [{"role": "user", "content": "Hello, how are you?"}],
    [
        {"role": "system", "content": "You are a pirate. Answer briefly."},
        {"role": "user", "content": "Where is the treasure?"},
        {"role": "assistant", "content": "  Under the palm tree, matey.  "},
        {"role": "user", "content": 'Which one? \u00e9\u00e8 "quoted" <b>html</b>\nnew line'},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me a joke."},
    ],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now>",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def main() -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    cases = []
    for family, (template, special) in FAMILIES.items():
        tok = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, "x")), **special
        )
        for k, chat in enumerate(CHATS):
            for gen in (True, False):
                for tools in (None, TOOLS) if family.startswith("qwen2") else (None,):
                    try:
                        text = tok.apply_chat_template(
                            chat,
                            tools=tools,
                            tokenize=False,
                            add_generation_prompt=gen,
                            chat_template=template,
                        )
                        expected: dict[str, str] = {"text": text}
                    except Exception as e:  # the template raised: the error is the reference
                        expected = {"error": str(e)}
                    cases.append(
                        {
                            "family": family,
                            "chat": k,
                            "add_generation_prompt": gen,
                            "tools": tools,
                            **expected,
                        }
                    )
    out = {
        "made_with": "transformers apply_chat_template",
        "templates": {f: {"template": t, "special": s} for f, (t, s) in FAMILIES.items()},
        "chats": CHATS,
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "chat_templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print(f"{len(cases)} cases -> {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
