"""Chunked prefill (issue 23): a prompt runs as chunks written into the static KV cache at a
device position. Logits and cached keys against the float64 reference forward pass
(llm_ref.py) for prompts of 1, 15, 16, 17 and 1000 tokens, batches of different lengths, a
prompt that fills the cache exactly and a sliding-window model; greedy tokens against the
unchunked (one-chunk) path; the compiled chunk step attends through sdpa."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from llm_ref import Reference, _rope

import pygpukit as gpk
from pygpukit import llm
from pygpukit.llm.config import inv_freq
from pygpukit.llm.generate import PREFILL_TOKENS, prefill_chunk_for, prefill_plan
from pygpukit.llm.model import CacheBounds, chunk_mask, left_pad
from pygpukit.llm.tiny import random_weights

CHUNK = 256


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def _config(window: int | None = None) -> llm.ModelConfig:
    return llm.ModelConfig(
        arch="mistral" if window else "llama", vocab_size=97, hidden_size=64,
        intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1536,
        bos_token_id=1, eos_token_ids=(2,), pad_token_id=0, sliding_window=window,
    )  # fmt: skip


def _write(path: str, cfg: llm.ModelConfig, seed: int) -> str:
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    save_file(random_weights(cfg, seed), os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[llm.Model, Reference]:
    path = _write(str(tmp_path_factory.mktemp("chunked")), _config(), 5)
    return llm.load(path, progress=False), Reference(path)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[llm.Model, Reference]:
    path = _write(str(tmp_path_factory.mktemp("windowed")), _config(window=40), 6)
    return llm.load(path, progress=False), Reference(path)


def _prompt(n: int, seed: int, vocab: int = 97) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def chunked_logits(
    model: llm.Model, prompts: list[list[int]], chunk: int, max_seq: int
) -> tuple[np.ndarray, np.ndarray]:
    """Logits [B, L, V] of the left-padded prompts prefilled chunk by chunk through one
    compiled step (as Generator runs it), and the start offsets."""
    t = model.transformer
    t.setup_cache(len(prompts), max_seq)
    plan = prefill_plan(max(map(len, prompts)), chunk, max_seq)
    ids, start_np = left_pad(prompts, sum(plan), 0)
    start = gpk.from_numpy(start_np)
    window = model.config.sliding_window

    def step(tokens: gpk.GPUArray, pos: gpk.GPUArray) -> gpk.GPUArray:
        mask = chunk_mask(start, pos, tokens.shape[1], max_seq, window)
        return t(tokens, mask, pos, last_only=False)

    fn = gpk.compile(step)
    outs, at = [], 0
    for n in plan:
        outs.append(fn(gpk.from_numpy(ids[:, at : at + n]), gpk.scalar(at)).to_numpy())
        at += n
    return np.concatenate(outs, axis=1), start_np


def _check_rows(model, ref, prompts, chunk, max_seq):
    got, start = chunked_logits(model, prompts, chunk, max_seq)
    for b, p in enumerate(prompts):
        want, keys = ref.forward(p)
        assert rel_err(got[b, start[b] :], want) < 1e-4, (b, len(p))
        # The row's keys sit start[b] positions on: rotated that much further.
        ang = start[b] * inv_freq(model.config).astype(np.float64)
        for layer, k in zip(model.transformer.layers, keys, strict=True):
            assert layer.attn.cache is not None
            cached = layer.attn.cache.k.to_numpy()[b, :, start[b] : start[b] + len(p)]
            assert rel_err(cached, _rope(k, np.cos(ang), np.sin(ang))) < 1e-5


def test_prefill_plan():
    assert prefill_plan(1, 256, 1 << 30) == [16]
    assert prefill_plan(17, 256, 1 << 30) == [32]
    assert prefill_plan(256, 256, 1 << 30) == [256]
    assert prefill_plan(257, 256, 1 << 30) == [256, 16]
    assert prefill_plan(1000, 256, 1 << 30) == [256, 256, 256, 256]
    assert prefill_plan(1100, 512, 1 << 30) == [512, 512, 128]  # 1152 positions, not 2048
    assert prefill_plan(40, 512, 50) == [50]  # capped by the room the cache leaves
    assert prefill_plan(40, 512, 30) == [40]  # does not fit: generate reports it


def test_default_chunk_holds_the_token_budget():
    """The default chunk: PREFILL_TOKENS over the batch, a power of two, at least 16."""
    assert PREFILL_TOKENS == 2048
    assert [prefill_chunk_for(b) for b in (1, 2, 3, 4, 5, 16, 128, 129, 4096)] == [
        2048, 1024, 512, 512, 256, 128, 16, 16, 16]  # fmt: skip


def test_default_chunk_runs_a_long_prompt_in_one_step(pair):
    """With no prefill_chunk set, a 1500-token prompt is one chunk of 2048 at batch 1 and
    chunks of 512 at batch 4 (the same 2048-token budget); the greedy tokens match the
    float64 reference."""
    model, ref = pair
    assert model.prefill_chunk is None
    prompt = _prompt(1500, 21)
    res = model.generate_ids([prompt], 1, max_seq_len=1536, stop_at_eos=False)
    assert res.stats["chunks"] == [1536]  # its bucket, 2048, capped by the cache
    assert res.tokens == [[int(np.argmax(ref.forward(prompt)[0][-1]))]]
    res = model.generate_ids([prompt[:600]] * 4, 1, max_seq_len=1024, stop_at_eos=False)
    assert res.stats["chunks"] == [512, 128]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000])
def test_chunked_logits_match_reference(pair, n):
    model, ref = pair
    _check_rows(model, ref, [_prompt(n, n)], CHUNK, 1024)


def test_batch_of_different_lengths(pair):
    """Rows of 5, 300 and 600 tokens left-padded to 768: the short row's first chunks are
    all padding (queries that see no key)."""
    model, ref = pair
    _check_rows(model, ref, [_prompt(n, 100 + n) for n in (5, 300, 600)], CHUNK, 1024)


def test_prompt_fills_the_cache(pair):
    model, ref = pair
    _check_rows(model, ref, [_prompt(512, 7)], CHUNK, 512)
    prompt = _prompt(512, 7)
    model.prefill_chunk = CHUNK
    try:
        res = model.generate_ids([prompt], 1, max_seq_len=512, stop_at_eos=False)
    finally:
        model.prefill_chunk = None
    assert res.stats["chunks"] == [CHUNK, CHUNK]
    assert res.tokens == [[int(np.argmax(ref.forward(prompt)[0][-1]))]]


def test_sliding_window(windowed):
    """A window of 40 with chunks of 32: the window reaches back into earlier chunks."""
    model, ref = windowed
    _check_rows(model, ref, [_prompt(100, 3), _prompt(70, 4)], 32, 128)


def test_greedy_chunked_equals_one_chunk(pair):
    """A 600-token prompt in chunks of 256 and in one chunk of 1024: the same tokens, each
    the float64 reference's argmax on its prefix."""
    model, ref = pair
    prompt = _prompt(600, 11)
    tokens = []
    for chunk in (CHUNK, 1024):
        model.prefill_chunk = chunk
        try:
            res = model.generate_ids([prompt], 6, max_seq_len=1024, stop_at_eos=False)
        finally:
            model.prefill_chunk = None
        # One chunk: its bucket (1024) capped where the 5 decode steps still fit.
        assert res.stats["chunks"] == ([CHUNK] * 2 + [128] if chunk == CHUNK else [1019])
        tokens.append(res.tokens[0])
    assert tokens[0] == tokens[1]
    want = ref.forward(prompt + tokens[0][:-1])[0][len(prompt) - 1 :]
    assert tokens[0] == [int(t) for t in np.argmax(want, axis=-1)]


def test_compiled_chunk_step_uses_sdpa(pair):
    """The chunk step is one trace per chunk length and attends through sdpa: no softmax,
    no materialised [B, 1, 1, T, S] mask; each layer's rope and its two cache stores (at a
    dynamic slice) are one rope_kv_write (passes/fuse_rope_kv_write.py)."""
    model, _ = pair
    gen = model.generator(2, 1024)
    gen.chunk = 64
    gen.generate([_prompt(150, 1), _prompt(90, 2)], 1)
    gen.generate([_prompt(145, 3), _prompt(20, 4)], 1)
    stats = gen._prefill.stats()
    assert stats["misses"] == 2  # chunks of 64, then a last one of 32
    for entry in gen._prefill._cache.values():
        nodes = entry.program.schedule.graph.nodes
        ops = [n.op for n in nodes]
        assert ops.count("sdpa") == model.config.num_layers
        assert "softmax" not in ops
        assert not [n for n in nodes if n.dtype == gpk.bool and len(n.shape) >= 2]
        assert "setitem" not in ops and "rope" not in ops
        assert ops.count("rope_kv_write") == model.config.num_layers
        assert ops.count("after") == 2 * model.config.num_layers


def test_chunk_mask_forms():
    start = gpk.from_numpy(np.zeros(2, np.int64))
    pos = gpk.scalar(32)
    assert chunk_mask(start, pos, 16, 64).window is None
    assert chunk_mask(start, pos, 16, 64, window=64).window is None  # covers the cache
    m = chunk_mask(gpk.from_numpy(np.array([0, 40])), pos, 16, 64, window=8)
    assert isinstance(m, CacheBounds) and m.window == 8
    assert int(m.kv_len.to_numpy()) == 48


def test_bad_chunk(pair):
    model, _ = pair
    for bad in (0, 8, 48, 2.0, True):
        model.prefill_chunk = bad
        try:
            with pytest.raises(gpk.GPUKitError, match="chunk must be a power of two") as e:
                model.generate_ids([[5, 6]], 1)
            assert isinstance(e.value, ValueError)
        finally:
            model.prefill_chunk = None
