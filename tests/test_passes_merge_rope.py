"""merge_rope: the q and k rotary embeddings cut from one fused QKV buffer run as one rope
over both head ranges; checked against float64 NumPy on fresh random inputs, and left
alone where the slices are not neighbours or the tables differ."""

from __future__ import annotations

import numpy as np
import pytest
from passes_util import arr, close, f64, fused, ops, rope64, run_lazy, run_unfused

import pygpukit as gpk

B, T, HQ, HK, D = 2, 3, 4, 2, 8


def _split(qkv, lo, heads):
    return qkv[:, :, lo : lo + heads * D].reshape(B, T, heads, D).swapaxes(1, 2)


def _ref(qkv64, lo, heads, c, s):
    x = qkv64[:, :, lo : lo + heads * D].reshape(B, T, heads, D).swapaxes(1, 2)
    return rope64(x, c, s, False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_q_and_k_share_one_rope(dtype):
    rng = np.random.default_rng()
    qkv = arr(rng, B, T, (HQ + 2 * HK) * D, dtype=dtype)
    c, s = arr(rng, T, D // 2, dtype=dtype), arr(rng, T, D // 2, dtype=dtype)

    def f(qkv, c, s):
        q = gpk.nn.rope(_split(qkv, 0, HQ), c, s)
        k = gpk.nn.rope(_split(qkv, HQ * D, HK), c, s)
        return q * 2.0, k + 1.0

    g = fused(f, qkv, c, s)
    assert ops(g).count("rope") == 1, ops(g)
    q64 = _ref(f64(qkv), 0, HQ, f64(c), f64(s))
    k64 = _ref(f64(qkv), HQ * D, HK, f64(c), f64(s))
    q, k = run_lazy(f, qkv, c, s)
    close(q, q64 * 2, dtype)
    close(k, k64 + 1, dtype)
    uq, uk = run_unfused(f, qkv, c, s)
    close(q, uq, dtype)
    close(k, uk, dtype)


def test_not_neighbours_or_other_tables_stay_apart():
    rng = np.random.default_rng()
    qkv = arr(rng, B, T, (HQ + 2 * HK) * D)
    c, s = arr(rng, T, D // 2), arr(rng, T, D // 2)
    c2 = arr(rng, T, D // 2)

    def gap(qkv, c, s):  # q and v: k's range lies between them
        return gpk.nn.rope(_split(qkv, 0, HQ), c, s), gpk.nn.rope(_split(qkv, (HQ + HK) * D,
                                                                         HK), c, s)  # fmt: skip

    def tables(qkv, c, s, c2):
        return gpk.nn.rope(_split(qkv, 0, HQ), c, s), gpk.nn.rope(_split(qkv, HQ * D, HK), c2, s)

    assert ops(fused(gap, qkv, c, s)).count("rope") == 2
    assert ops(fused(tables, qkv, c, s, c2)).count("rope") == 2
    q, k = run_lazy(tables, qkv, c, s, c2)
    close(q, _ref(f64(qkv), 0, HQ, f64(c), f64(s)))
    close(k, _ref(f64(qkv), HQ * D, HK, f64(c2), f64(s)))
