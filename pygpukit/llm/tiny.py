"""`--model tiny`: a tiny random Llama-style model with a BPE tokenizer, for a GPU-less demo.

The tokenizer is trained (with `tokenizers`) on a short public-domain text embedded below
(the opening of Lewis Carroll's Alice's Adventures in Wonderland, 1865), the weights are
random, and the model is written as a normal checkpoint directory and read back through
gpk.llm.load, so the demo runs the same code path as a real model. Its output is
gibberish made of the text's word pieces; its purpose is the pipeline and the timing.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from .config import ModelConfig

TEXT = """\
Alice was beginning to get very tired of sitting by her sister on the bank, and of having
nothing to do: once or twice she had peeped into the book her sister was reading, but it had
no pictures or conversations in it, "and what is the use of a book," thought Alice "without
pictures or conversations?"
So she was considering in her own mind (as well as she could, for the hot day made her feel
very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth the
trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink eyes
ran close by her.
There was nothing so very remarkable in that; nor did Alice think it so very much out of the
way to hear the Rabbit say to itself, "Oh dear! Oh dear! I shall be late!" (when she thought
it over afterwards, it occurred to her that she ought to have wondered at this, but at the
time it all seemed quite natural); but when the Rabbit actually took a watch out of its
waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for it
flashed across her mind that she had never before seen a rabbit with either a
waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran across
the field after it, and fortunately was just in time to see it pop down a large rabbit-hole
under the hedge.
In another moment down went Alice after it, never once considering how in the world she was
to get out again.
"""

SPECIAL = ["<unk>", "<s>", "</s>"]
# Zephyr's template (TinyLlama-Chat's), so `pygpukit chat --model tiny` runs a real one.
CHAT_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
VOCAB = 384
SEED = 0


def train_tokenizer(vocab_size: int = VOCAB) -> object:
    """A byte-level BPE tokenizer trained on TEXT; ids 0..2 are <unk>, <s>, </s>.

    Its alphabet is the text's own characters, not all 256 bytes, so even a random model
    prints word pieces rather than control bytes; other characters encode as <unk>."""
    from .tokenizer import _tokenizers

    lib = _tokenizers()  # a one-line error naming the llm extra when it is not installed
    Tokenizer, decoders, models = lib.Tokenizer, lib.decoders, lib.models
    pre_tokenizers, processors, trainers = lib.pre_tokenizers, lib.processors, lib.trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tok.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def tiny_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        arch="llama",
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=172,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_ids=(2,),
        pad_token_id=0,
    )


def random_weights(cfg: ModelConfig, seed: int = SEED) -> dict[str, np.ndarray]:
    """Hugging Face-named float32 tensors, scaled so activations stay O(1)."""
    from .loader import weight_names

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_names(cfg):
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            std = 1.0 if "embed" in name else 1.0 / np.sqrt(shape[-1])
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_tiny_model(path: str | None = None) -> str:
    """Write config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with a
    chat template) and generation_config.json; return the directory. Each file is written
    under a temporary name and renamed into place: processes sharing the default directory
    (parallel test runs) never read a file another one is still writing."""
    from safetensors.numpy import save_file

    path = path or os.path.join(tempfile.gettempdir(), f"pygpukit-tiny-llama-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    tok = train_tokenizer()
    cfg = tiny_config(tok.get_vocab_size())  # type: ignore[attr-defined]
    tok_cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "chat_template": CHAT_TEMPLATE}  # fmt: skip
    docs = {
        "config.json": cfg.to_dict(),
        "tokenizer_config.json": tok_cfg,
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
    }
    writers: dict[str, Callable[[str], None]] = {
        "tokenizer.json": tok.save,  # type: ignore[attr-defined]
        "model.safetensors": lambda f: save_file(random_weights(cfg), f),
        **{name: functools.partial(_write_json, doc) for name, doc in docs.items()},
    }
    for name, write in writers.items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=path)
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, os.path.join(path, name))
        except BaseException:
            os.unlink(tmp)
            raise
    return path


def _write_json(doc: Any, file: str) -> None:
    with open(file, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
