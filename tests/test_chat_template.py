"""Chat templates rendered as transformers' apply_chat_template renders them (fixtures made
with transformers by scripts/make_chat_template_fixtures.py, and live where it is
installed), generation_config.json defaults, model names through huggingface_hub, and
`pygpukit generate --prompt-ids / --chat`."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from pygpukit import errors, llm
from pygpukit.cli import main
from pygpukit.llm.chat_template import ChatTemplate, ChatTemplateError
from pygpukit.llm.generation_config import GenerationConfig

jinja2 = pytest.importorskip("jinja2")
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "chat_templates.json")
with open(FIXTURE, encoding="utf-8") as _f:
    DATA = json.load(_f)
CASES = DATA["cases"]


def _render(case: dict) -> str:
    t = DATA["templates"][case["family"]]
    extra = {"tools": case["tools"]} if case["tools"] else {}
    return ChatTemplate(t["template"], t["special"]).render(
        DATA["chats"][case["chat"]], case["add_generation_prompt"], **extra
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['family'].split()[0]}-{c['chat']}-"
                         f"{c['add_generation_prompt']}-{bool(c['tools'])}")  # fmt: skip
def test_renders_as_transformers(case):
    if "error" in case:  # the template raised under transformers: it raises here too
        with pytest.raises(ChatTemplateError, match="roles must alternate"):
            _render(case)
    else:
        assert _render(case) == case["text"]


def test_at_least_three_families():
    fams = {c["family"] for c in CASES if "text" in c}
    assert len(fams) >= 3


def test_live_against_transformers():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    chat = [{"role": "system", "content": "S \u00fc <x>"}, {"role": "user", "content": " q "}]
    for fam in ("zephyr (TinyLlama-1.1B-Chat)", "llama3 (Llama-3-Instruct)",
                "qwen2 (Qwen2.5-Instruct)"):  # fmt: skip
        t = DATA["templates"][fam]
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, "x")), **t["special"]
        )
        want = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                       chat_template=t["template"])  # fmt: skip
        assert ChatTemplate(t["template"], t["special"]).render(chat) == want


def test_sandboxed_and_errors_are_clear():
    bad = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        bad.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="cannot compile"):
        ChatTemplate("{% for %}").render([])
    assert isinstance(ChatTemplateError("x"), ValueError)


def test_from_tokenizer_config_forms():
    cfg = {"chat_template": [{"name": "tool_use", "template": "T"},
                             {"name": "default", "template": "{{ bos_token }}D"}],
           "bos_token": {"content": "<s>", "lstrip": False}}  # fmt: skip
    t = ChatTemplate.from_tokenizer_config(cfg, "tokenizer_config.json")
    assert t is not None and t.render([]) == "<s>D"
    assert ChatTemplate.from_tokenizer_config({}, "x") is None
    with pytest.raises(errors.LoadError, match="chat_template"):
        ChatTemplate.from_tokenizer_config({"chat_template": 3}, "x")


# -- generation_config.json -------------------------------------------------------------------


def test_generation_config_fields():
    g = GenerationConfig.from_dict({"eos_token_id": [2, 5], "do_sample": True,
                                    "temperature": 0.6, "top_p": 0.9}, "g.json", 10)  # fmt: skip
    assert g.eos_token_ids == (2, 5)
    p = g.sampling()
    assert (p.temperature, p.top_k, p.top_p) == (0.6, 50, 0.9)
    assert GenerationConfig.from_dict({"temperature": 0.6}, "g", 10).sampling().greedy
    for bad in ({"eos_token_id": 10}, {"do_sample": "yes"}, {"top_p": 2}, {"top_k": -1},
                {"temperature": "hot"}, {"max_new_tokens": 1.5}):  # fmt: skip
        with pytest.raises(errors.LoadError, match=next(iter(bad))):
            GenerationConfig.from_dict(bad, "g.json", 10)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from pygpukit.llm.tiny import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny")))


def test_generation_config_eos_stops_generation(tiny_dir, tmp_path):
    """An EOS id only generation_config.json names (a chat model's end of turn) stops
    generation: the first token greedy generation makes is declared an EOS."""
    model = llm.load(tiny_dir)
    ids = model.encode("Alice was")
    free = model.generate_ids([ids], 6, stop_at_eos=False).tokens[0]
    d = tmp_path / "m"
    shutil.copytree(tiny_dir, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, free[2]]}))
    stopped = llm.load(str(d)).generate_ids([ids], 6).tokens[0]
    assert stopped == free[: free.index(free[2]) + 1]


def test_model_chat_ids_match_the_template(tiny_dir):
    model = llm.load(tiny_dir)
    msgs = [{"role": "user", "content": "Alice was"}]
    text = model.chat_template.render(msgs)
    assert text == "<|user|>\nAlice was</s>\n<|assistant|>\n"
    ids = model.chat_ids(msgs)
    assert ids == model.tokenizer.encode(text, add_special_tokens=False)
    assert 2 in ids  # </s> is the special token, not its characters


# -- model names -----------------------------------------------------------------------------


def test_repo_id_from_the_local_cache_offline(tiny_dir, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    snap = cache / "models--someorg--tiny-chat" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_dir, snap)
    (cache / "models--someorg--tiny-chat" / "refs").mkdir()
    (cache / "models--someorg--tiny-chat" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    model = llm.load("someorg/tiny-chat")
    assert os.path.realpath(model.path) == os.path.realpath(str(snap))
    with pytest.raises(errors.LoadError, match="not in the local Hugging Face cache"):
        llm.load("someorg/absent-model")


# -- the CLI ---------------------------------------------------------------------------------


def test_generate_prompt_ids_equals_text(tiny_dir, capsys):
    model = llm.load(tiny_dir)
    ids = model.encode("Alice was")
    assert main(["generate", "--model", tiny_dir, "--prompt-ids", ",".join(map(str, ids)),
                 "--max-new-tokens", "8", "--ignore-eos"]) == 0  # fmt: skip
    by_ids = capsys.readouterr().out
    assert main(["generate", "--model", tiny_dir, "--prompt", "Alice was",
                 "--max-new-tokens", "8", "--ignore-eos"]) == 0  # fmt: skip
    assert by_ids == capsys.readouterr().out


def test_generate_prompt_ids_without_tokenizer(tiny_dir, tmp_path, capsys):
    d = tmp_path / "notok"
    shutil.copytree(tiny_dir, d)
    os.remove(d / "tokenizer.json")
    ids = [1, 40, 41, 42]
    assert main(["generate", "--model", str(d), "--prompt-ids", "1 40 41 42",
                 "--max-new-tokens", "5", "--ignore-eos"]) == 0  # fmt: skip
    out = capsys.readouterr().out.split()
    want = llm.load(str(d)).generate_ids([ids], 5, stop_at_eos=False).tokens[0]
    assert [int(t) for t in out] == ids + want
    assert main(["generate", "--model", str(d), "--prompt", "x"]) == 1
    assert "--prompt-ids" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, message",
    [
        ("1,x", "expected integers"),
        ("", "no token ids"),
        ("1,99999", "outside the model's vocabulary"),
    ],
)
def test_generate_bad_prompt_ids(tiny_dir, capsys, flag, message):
    assert main(["generate", "--model", tiny_dir, "--prompt-ids", flag]) == 1
    assert message in capsys.readouterr().err


def test_generate_chat_applies_the_template(tiny_dir, capsys):
    assert main(["generate", "--model", tiny_dir, "--prompt", "Alice was", "--chat",
                 "--max-new-tokens", "4", "--ignore-eos"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("<|user|>\nAlice was</s>\n<|assistant|>\n") or "Alice was" in out
    model = llm.load(tiny_dir)
    ids = model.chat_ids([{"role": "user", "content": "Alice was"}])
    want = model.generate_ids([ids], 4, stop_at_eos=False).tokens[0]
    assert out.endswith(model.tokenizer.decode(want) + "\n")
    assert np.all(np.array(want) >= 0)
