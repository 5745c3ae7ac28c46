"""A small Llama trained on text, for measuring quantization where the logits mean something.

Random weights give near-tied logits (quant_accuracy's median top-1 gap of 0.15 standard
deviations at the TinyLlama shape), so any rounding flips the argmax of many prompts and
top-1 agreement says little about a format. A trained model predicts most next tokens with
a clear margin, as the checkpoints users quantize do. No network is needed: the model is a
byte-level Llama (vocab 256; GQA, SwiGLU, RMSNorm, RoPE as TinyLlama) trained with torch and
transformers' LlamaForCausalLM for a minute on the source files of the running Python's
standard library, then saved as a Hugging Face checkpoint (config.json, safetensors) that
gpk.llm.load reads like any other. Every twentieth file is held out: prompts are random
spans of those.

Needs torch and transformers (the bench extra; the GPU machine has both).
"""

from __future__ import annotations

import math
import os
import sysconfig
import time
from typing import Any

import numpy as np

CORPUS_BYTES = 16 << 20  # the first 16 MB of the sorted standard library sources
HOLD_OUT_EVERY = 20  # every twentieth file is held out
SEQ = 256  # training sequence length

# The model: TinyLlama's structure at a size that trains in a minute.
CONFIG = {
    "vocab_size": 256, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


def corpus(limit: int = CORPUS_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) uint8 byte streams of the standard library's .py files, in sorted
    path order, every HOLD_OUT_EVERY-th file held out, `limit` bytes in all."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "__pycache__"))
        paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
    paths.sort(key=lambda p: os.path.relpath(p, root))
    train: list[bytes] = []
    held: list[bytes] = []
    total = 0
    for i, p in enumerate(paths):
        with open(p, "rb") as f:
            data = f.read()
        (held if i % HOLD_OUT_EVERY == 0 else train).append(data)
        total += len(data)
        if total >= limit:
            break
    if not held or not train:
        raise RuntimeError(f"trained_llm: too few Python sources under {root}")
    return np.frombuffer(b"".join(train), np.uint8), np.frombuffer(b"".join(held), np.uint8)


def spans(data: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    """int64 [count, length]: spans of `data` at random offsets."""
    starts = np.random.default_rng(seed).integers(0, len(data) - length, count)
    return np.stack([data[s : s + length] for s in starts]).astype(np.int64)


def train(
    out_dir: str,
    steps: int = 1500,
    batch: int = 64,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    device: str | None = None,
) -> dict[str, float]:
    """Train the byte-level Llama and save it to `out_dir` as a bfloat16 Hugging Face
    checkpoint. Returns {train_s, heldout_bits_per_byte, heldout_top1} (the last two over
    64 held-out spans of SEQ bytes, every position)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**(config or CONFIG))).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, steps // 15)

    def lr(i: int) -> float:  # linear warm-up, then cosine down to a tenth
        if i < warm:
            return (i + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (i - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr)
    text, held = corpus()
    rng = np.random.default_rng(seed)
    amp = torch.autocast(dev, torch.bfloat16, enabled=dev == "cuda")
    t0 = time.perf_counter()
    model.train()
    for _ in range(steps):
        starts = rng.integers(0, len(text) - SEQ - 1, batch)
        ids = torch.from_numpy(np.stack([text[s : s + SEQ + 1] for s in starts]).astype(np.int64))
        ids = ids.to(dev)
        with amp:
            logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    model.eval()
    ev = torch.from_numpy(spans(held, 64, SEQ + 1, seed + 7)).to(dev)
    with torch.no_grad(), amp:
        logits = model(ev[:, :-1]).logits.float()
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ev[:, 1:].flatten())
    top1 = (logits.argmax(-1) == ev[:, 1:]).float().mean()
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    return {
        "train_s": train_s,
        "heldout_bits_per_byte": float(nll) / math.log(2),
        "heldout_top1": float(top1),
    }
