"""Prompts whose prefill bucket is the whole KV cache (issue 23).

The prefill stores `cache[:, :, :T] = k` with T == max_seq_len: a store covering the whole
captured cache. Dead-code elimination used to replace such a store by its value, so the
cache input vanished from the compiled graph and its new contents were copied to no slot
(a raw ValueError on the NumPy backend, a bad broadcast on the GPU). Checked against the
float64 reference forward pass in llm_ref.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from llm_ref import Reference

import pygpukit as gpk
from pygpukit import llm
from pygpukit.llm.model import prefill_mask

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "llm")
MAX_SEQ = 64


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request: pytest.FixtureRequest) -> tuple[llm.Model, Reference]:
    path = os.path.join(FIXTURES, request.param)
    return llm.load(path, progress=False), Reference(path)


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def test_reference_matches_transformers(pair):
    """The float64 reference agrees with the logits transformers saved for the fixture."""
    model, ref = pair
    saved = dict(np.load(os.path.join(model.path, "reference.npz")))
    seq = np.concatenate([saved["prompt_a"], saved["greedy_a"]]).tolist()
    assert rel_err(saved["logits_a"], ref.forward(seq)[0]) < 1e-4


def test_compiled_prefill_fills_the_cache(pair):
    """A compiled prefill of exactly max_seq_len tokens: logits and every cached key."""
    model, ref = pair
    t = model.transformer
    t.setup_cache(1, MAX_SEQ)
    ids = _prompt(MAX_SEQ, 1, model.config.vocab_size)
    start = gpk.from_numpy(np.zeros(1, np.int64))

    def prefill(tokens: gpk.GPUArray) -> gpk.GPUArray:
        return t(tokens, prefill_mask(start, tokens.shape[1]), last_only=False)

    got = gpk.compile(prefill)(gpk.from_numpy(np.array([ids], np.int64))).to_numpy()[0]
    want, keys = ref.forward(ids)
    assert rel_err(got, want) < 1e-4
    for layer, k in zip(t.layers, keys, strict=True):
        assert layer.attn.cache is not None
        assert rel_err(layer.attn.cache.k.to_numpy()[0], k) < 1e-5


@pytest.mark.parametrize("lengths", [[MAX_SEQ], [MAX_SEQ - 1], [MAX_SEQ - 1, MAX_SEQ]])
def test_generate_with_bucket_equal_to_cache(pair, lengths):
    """Prompts of max_seq_len - 1 and max_seq_len tokens (bucket == max_seq_len), alone and
    left-padded in one batch: each row's greedy token is the float64 argmax."""
    model, ref = pair
    prompts = [_prompt(n, 10 + n, model.config.vocab_size) for n in lengths]
    res = model.generate_ids(prompts, 1, max_seq_len=MAX_SEQ, stop_at_eos=False)
    assert res.stats["bucket"] == MAX_SEQ
    for row, p in zip(res.tokens, prompts, strict=True):
        last = ref.forward(p)[0][-1]
        top2 = np.sort(last)[-2:]
        assert top2[1] - top2[0] > 1e-3  # the argmax is not a near-tie
        assert row == [int(np.argmax(last))]


def test_default_cache_capped_by_model_positions(pair):
    """With max_seq_len chosen by generate_ids, a long prompt's bucket is capped at
    max_position_embeddings, which is then also the cache length."""
    model, ref = pair
    n = model.config.max_position_embeddings - 20
    prompt = _prompt(n, 3, model.config.vocab_size)
    res = model.generate_ids([prompt], 1, stop_at_eos=False)
    assert res.stats["bucket"] == model.config.max_position_embeddings
    assert res.tokens == [[int(np.argmax(ref.forward(prompt)[0][-1]))]]


def test_covering_store_into_captured_arrays():
    """The root cause without a model: compiled stores covering two captured arrays."""
    rng = np.random.default_rng(4)
    a = gpk.from_numpy(rng.standard_normal((2, 8, 4)).astype(np.float32))
    b = gpk.from_numpy(rng.standard_normal((2, 8, 4)).astype(np.float32))

    def store(x: gpk.GPUArray) -> gpk.GPUArray:
        a[:, : x.shape[1]] = x
        b[:, : x.shape[1]] = x * 3.0
        return x + 1.0

    step = gpk.compile(store)
    for t in (5, 8, 8):
        x = rng.standard_normal((2, t, 4)).astype(np.float32)
        a_before, b_before = a.to_numpy().astype(np.float64), b.to_numpy().astype(np.float64)
        out = step(gpk.from_numpy(x)).to_numpy()
        np.testing.assert_allclose(out, x.astype(np.float64) + 1.0, rtol=1e-6)
        a_before[:, :t], b_before[:, :t] = x, x.astype(np.float64) * 3.0
        np.testing.assert_allclose(a.to_numpy(), a_before, rtol=1e-6)
        np.testing.assert_allclose(b.to_numpy(), b_before, rtol=1e-6)
