"""gpk.nn ops vs float64 NumPy written out here, lazy and eager."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import FLOATS, assert_close, lazy_and_eager, rand
from hypothesis import given, settings
from hypothesis import strategies as st

import pygpukit as gpk

SETTINGS = settings(max_examples=15, deadline=None)
dtypes_ = st.sampled_from(FLOATS)
seeds = st.integers(0, 2**32 - 1)
rows = st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple)


def f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [x.astype(np.float64) for x in xs]


def erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


@given(lead=rows, n=st.integers(1, 33), seed=seeds, dtype=dtypes_)
@SETTINGS
def test_activations(lead, n: int, seed: int, dtype: str) -> None:
    x = rand(np.random.default_rng(seed), lead + (n,), dtype, low=-5, high=5)
    (x64,) = f64(x)
    refs = {
        "gelu_erf": (lambda a: gpk.nn.gelu(a), 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))),
        "gelu_tanh": (
            lambda a: gpk.nn.gelu(a, approximate="tanh"),
            0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3))),
        ),
        "silu": (gpk.nn.silu, x64 / (1 + np.exp(-x64))),
    }
    for fn, ref in refs.values():
        lazy, eager = lazy_and_eager(fn, x)
        assert_close(lazy, ref, dtype, factor=2)
        np.testing.assert_array_equal(lazy, eager)


@given(lead=rows, n=st.integers(1, 40), seed=seeds, dtype=dtypes_)
@SETTINGS
def test_softmax_log_softmax(lead, n: int, seed: int, dtype: str) -> None:
    x = rand(np.random.default_rng(seed), lead + (n,), dtype, low=-8, high=8)
    (x64,) = f64(x)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    lazy, eager = lazy_and_eager(gpk.nn.softmax, x)
    assert_close(lazy, ref, dtype, factor=2)
    np.testing.assert_array_equal(lazy, eager)
    lazy, _ = lazy_and_eager(gpk.nn.log_softmax, x)
    assert_close(lazy, np.log(ref), dtype, factor=4)
    if x.ndim > 1:
        lazy, _ = lazy_and_eager(lambda a: gpk.nn.softmax(a, axis=0), x)
        e0 = np.exp(x64 - x64.max(0, keepdims=True))
        assert_close(lazy, e0 / e0.sum(0, keepdims=True), dtype, factor=2)


@given(lead=rows, n=st.integers(1, 64), seed=seeds, dtype=dtypes_)
@SETTINGS
def test_rms_norm_layer_norm(lead, n: int, seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    x, w, b = rand(rng, lead + (n,), dtype), rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    x64, w64, b64 = f64(x, w, b)
    ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w64
    lazy, eager = lazy_and_eager(lambda a, g: gpk.nn.rms_norm(a, g, eps=1e-6), x, w)
    assert_close(lazy, ref, dtype, factor=4)
    np.testing.assert_array_equal(lazy, eager)
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    lazy, eager = lazy_and_eager(lambda a, g, c: gpk.nn.layer_norm(a, g, c), x, w, b)
    assert_close(lazy, ref, dtype, factor=8)


@pytest.mark.parametrize("interleaved", [False, True])
@given(seq=st.integers(1, 6), half=st.integers(1, 8), heads=st.integers(1, 3), seed=seeds,
       dtype=dtypes_)  # fmt: skip
@SETTINGS
def test_rope(interleaved: bool, seq: int, half: int, heads: int, seed: int, dtype: str) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, (2, heads, seq, 2 * half), dtype)
    ang = rng.uniform(0, 2 * np.pi, size=(seq, half))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    (x64,) = f64(x)
    c64, s64 = np.cos(ang), np.sin(ang)
    if interleaved:
        ref = np.empty_like(x64)
        a, b = x64[..., 0::2], x64[..., 1::2]
        ref[..., 0::2], ref[..., 1::2] = a * c64 - b * s64, b * c64 + a * s64
    else:
        a, b = x64[..., :half], x64[..., half:]
        ref = np.concatenate([a * c64 - b * s64, b * c64 + a * s64], -1)
    lazy, eager = lazy_and_eager(lambda t, c, s: gpk.nn.rope(t, c, s, interleaved), x, cos, sin)
    assert_close(lazy, ref, dtype, factor=4)
    np.testing.assert_array_equal(lazy, eager)


@pytest.mark.parametrize("causal", [False, True])
@given(sq=st.integers(1, 5), extra=st.integers(0, 4), d=st.sampled_from([4, 8]),
       kv=st.integers(1, 2), groups=st.integers(1, 3), seed=seeds, dtype=dtypes_)  # fmt: skip
@SETTINGS
def test_sdpa_causal_gqa(causal: bool, sq, extra, d, kv, groups, seed, dtype) -> None:
    rng = np.random.default_rng(seed)
    sk = sq + extra
    q = rand(rng, (2, kv * groups, sq, d), dtype)
    k = rand(rng, (2, kv, sk, d), dtype)
    v = rand(rng, (2, kv, sk, d), dtype)
    q64, k64, v64 = f64(q, k, v)
    k64, v64 = np.repeat(k64, groups, 1), np.repeat(v64, groups, 1)
    s = q64 @ k64.swapaxes(-1, -2) / math.sqrt(d)
    if causal:
        for i in range(sq):
            s[..., i, i + extra + 1 :] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    fn = lambda a, b, c: gpk.nn.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    lazy, eager = lazy_and_eager(fn, q, k, v)
    assert_close(lazy, ref, dtype, factor=4)
    np.testing.assert_array_equal(lazy, eager)


@given(m=st.integers(1, 5), k=st.integers(1, 9), n=st.integers(1, 7), seed=seeds, dtype=dtypes_,
       act=st.sampled_from(["none", "gelu_tanh", "gelu_erf", "silu"]))  # fmt: skip
@SETTINGS
def test_linear_and_swiglu(m, k, n, seed, dtype, act) -> None:
    rng = np.random.default_rng(seed)
    x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    x64, w64, b64 = f64(x, w, b)
    y = x64 @ w64.T + b64
    ref = {
        "none": y,
        "gelu_tanh": 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3))),
        "gelu_erf": 0.5 * y * (1 + erf(y / math.sqrt(2))),
        "silu": y / (1 + np.exp(-y)),
    }[act]
    lazy, _ = lazy_and_eager(lambda a, c, e: gpk.nn.linear(a, c, e, activation=act), x, w, b)
    assert_close(lazy, ref, dtype, factor=2 * k)
    g, u = rand(rng, (m, n), dtype), rand(rng, (m, n), dtype)
    g64, u64 = f64(g, u)
    lazy, _ = lazy_and_eager(gpk.nn.swiglu, g, u)
    assert_close(lazy, g64 / (1 + np.exp(-g64)) * u64, dtype, factor=2)


@given(b=st.integers(1, 3), s=st.integers(2, 9), seed=seeds, dtype=dtypes_, causal=st.booleans())
@SETTINGS
def test_sdpa_static_cache_masks(b: int, s: int, seed: int, dtype: str, causal: bool) -> None:
    """kv_len masks the unfilled cache tail, kv_start the left padding of each batch row."""
    rng = np.random.default_rng(seed)
    sq = int(rng.integers(1, s + 1))
    kv_len = int(rng.integers(sq, s + 1))
    start = rng.integers(0, kv_len - sq + 1, size=b)
    q, k, v = (
        rand(rng, (b, 2, sq, 4), dtype),
        rand(rng, (b, 1, s, 4), dtype),
        rand(rng, (b, 1, s, 4), dtype),
    )
    ref = np.zeros((b, 2, sq, 4))
    for i in range(b):
        q64, k64, v64 = f64(q[i], k[i, :, start[i] : kv_len], v[i, :, start[i] : kv_len])
        sc = q64 @ k64.swapaxes(-1, -2) / 2.0
        if causal:
            n = kv_len - start[i]
            sc = np.where(np.arange(n)[None, :] > np.arange(sq)[:, None] + n - sq, -np.inf, sc)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        ref[i] = (p / p.sum(-1, keepdims=True)) @ v64
    fn = lambda a, c, e, n, st_: gpk.nn.scaled_dot_product_attention(  # noqa: E731
        a, c, e, is_causal=causal, kv_len=n, kv_start=st_
    )
    lazy, eager = lazy_and_eager(fn, q, k, v, np.array(kv_len, np.int32), start.astype(np.int32))
    assert_close(lazy, ref, dtype, factor=4)
    np.testing.assert_array_equal(lazy, eager)
