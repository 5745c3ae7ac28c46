"""The device sampler against NumPy float64 references, with fresh random logits."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.llm.sampling import SamplingParams, sample, top_k_filter, top_p_filter


def _logits(rng: np.random.Generator, b: int, v: int, scale: float = 3.0) -> np.ndarray:
    return (scale * rng.standard_normal((b, v))).astype(np.float32)


def _allowed_top_k(x: np.ndarray, k: int) -> np.ndarray:
    kth = np.sort(x.astype(np.float64), axis=-1)[:, -k][:, None]
    return x >= kth


def _allowed_top_p(x: np.ndarray, p: float) -> np.ndarray:
    """HF's rule: keep a token while the mass of more likely tokens is below p."""
    x64 = x.astype(np.float64)
    probs = np.exp(x64 - x64.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1)
    sorted_p = np.take_along_axis(probs, order, -1)
    before = np.cumsum(sorted_p, -1) - sorted_p
    keep_sorted = before < p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return keep


def _sample(x: np.ndarray, params: SamplingParams, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).random(x.shape, dtype=np.float32)
    out = sample(gpk.from_numpy(x), params, uniform=gpk.from_numpy(u))
    return out.to_numpy()


@pytest.mark.parametrize("k", [1, 5, 17])
def test_top_k_filter_matches_sort(k):
    x = _logits(np.random.default_rng(k), 6, 97)
    got = top_k_filter(gpk.from_numpy(x), k).to_numpy()
    want = _allowed_top_k(x, k)
    assert (np.isfinite(got) == want).all()
    assert (got[want] == x[want]).all()
    assert (want.sum(-1) == k).all()


@pytest.mark.parametrize("p", [0.3, 0.75, 0.95])
def test_top_p_filter_matches_sort(p):
    x = _logits(np.random.default_rng(int(p * 100)), 8, 131, scale=2.0)
    got = top_p_filter(gpk.from_numpy(x), gpk.from_numpy(np.array(p, np.float32))).to_numpy()
    assert (np.isfinite(got) == _allowed_top_p(x, p)).all()


def test_greedy_is_argmax():
    x = _logits(np.random.default_rng(3), 5, 64)
    got = sample(gpk.from_numpy(x), SamplingParams()).to_numpy()
    np.testing.assert_array_equal(got, x.argmax(-1))


def test_samples_stay_inside_top_k_and_top_p():
    rng = np.random.default_rng(11)
    row = _logits(rng, 1, 50, scale=1.5)
    x = np.repeat(row, 400, axis=0)  # 400 independent draws of one distribution
    params = SamplingParams(temperature=1.3, top_k=8, top_p=0.6, seed=0)
    allowed = _allowed_top_k(row / 1.3, 8)
    masked = np.where(allowed, row / 1.3, -np.inf)
    allowed &= _allowed_top_p(masked, 0.6)
    got = _sample(x, params, seed=5)
    assert allowed[0, got].all()
    assert len(set(got.tolist())) > 1  # it does sample


def test_distribution_matches_softmax():
    """Gumbel-max over many rows reproduces softmax(logits / T) (a loose chi-square)."""
    rng = np.random.default_rng(21)
    row = _logits(rng, 1, 12, scale=1.0)
    n = 6000
    got = _sample(np.repeat(row, n, axis=0), SamplingParams(temperature=0.7), seed=9)
    z = row[0].astype(np.float64) / 0.7
    p = np.exp(z - z.max())
    p /= p.sum()
    counts = np.bincount(got, minlength=12)
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 40, (counts, n * p)  # 11 dof: p < 1e-4 of failing by chance


def test_seeded_determinism():
    x = _logits(np.random.default_rng(4), 4, 80)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9)
    a = _sample(x, params, seed=123)
    b = _sample(x, params, seed=123)
    c = [_sample(x, params, seed=s) for s in range(124, 130)]
    np.testing.assert_array_equal(a, b)
    assert any((a != ci).any() for ci in c)


def test_generate_seeded_and_constrained():
    from pygpukit import llm
    from pygpukit.llm.tiny import write_tiny_model

    model = llm.load(write_tiny_model(), progress=False)
    ids = model.encode("Alice was")
    p = SamplingParams(temperature=1.0, top_k=3, seed=7)
    a = model.generate_ids([ids] * 4, 12, p, stop_at_eos=False).tokens
    b = model.generate_ids([ids] * 4, 12, p, stop_at_eos=False).tokens
    assert a == b
    c = model.generate_ids([ids] * 4, 12, SamplingParams(1.0, 3, 1.0, 8), stop_at_eos=False)
    assert c.tokens != a
    # top_k 1 is greedy whatever the temperature
    g = model.generate_ids([ids], 12, SamplingParams(), stop_at_eos=False).tokens
    k1 = model.generate_ids([ids], 12, SamplingParams(2.0, 1, 1.0, 3), stop_at_eos=False).tokens
    assert g == k1


def test_bad_params():
    with pytest.raises(gpk.GPUKitError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)
    with pytest.raises(gpk.GPUKitError, match="temperature"):
        SamplingParams(temperature=-1.0)
