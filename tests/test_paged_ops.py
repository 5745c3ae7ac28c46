"""The paged KV-cache ops on the NumPy backend against float64 references: paged_write with
its keys rotated on the way (RoPE fused into the store, the serving model's path), and
paged_attention over the key and value halves of one pool."""

from __future__ import annotations

import numpy as np
import pytest
from attention_ref import paged_sdpa_ref

import pygpukit as gpk


def _rope64(x, cos, sin, interleaved):
    """rope of x [T, H, D] by per-row tables [T, D/2], in float64."""
    x = x.astype(np.float64)
    c, s = cos[:, None, :].astype(np.float64), sin[:, None, :].astype(np.float64)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x2 * c + x1 * s
        return out
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _tables(rng, t, d):
    ang = rng.uniform(0, 6.3, size=(t, d // 2))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 1e-2)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rope_heads", [2, 4])
def test_paged_write_rotates_the_first_heads(dtype, tol, interleaved, rope_heads):
    """Heads [0, rope_heads) of each row are stored rotated by the row's tables, the rest as
    they are; negative slots store nothing; the pool's other slots keep their values."""
    rng = np.random.default_rng(11)
    nb, kv, bs, d, t = 6, 4, 4, 8, 5
    pool_np = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    new = rng.standard_normal((t, kv, d)).astype(np.float32)
    cos, sin = _tables(rng, t, d)
    slots = np.array([3, -1, 22, 9, 0], np.int64)
    pool = gpk.asarray(pool_np).astype(dtype)
    start = pool.astype("float32").to_numpy()
    gpk.nn.paged_write(pool, gpk.asarray(new).astype(dtype), slots, cos=cos, sin=sin,
                       rope_heads=rope_heads, interleaved=interleaved)  # fmt: skip
    got = pool.astype("float32").to_numpy()
    rows = gpk.asarray(new).astype(dtype).astype("float32").to_numpy().astype(np.float64)
    c = gpk.asarray(cos).astype(dtype).astype("float32").to_numpy()
    s = gpk.asarray(sin).astype(dtype).astype("float32").to_numpy()
    rows[:, :rope_heads] = _rope64(rows[:, :rope_heads], c, s, interleaved)
    want = start.astype(np.float64)
    for i, slot in enumerate(slots):
        if slot >= 0:
            want[slot // bs, :, slot % bs] = rows[i]
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


def test_paged_write_rope_arguments_are_checked():
    pool = gpk.zeros((2, 2, 4, 8), "float32")
    new = np.ones((3, 2, 8), np.float32)
    cos = np.ones((3, 4), np.float32)
    slots = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="cos and sin go together"):
        gpk.nn.paged_write(pool, new, slots, cos=cos)
    with pytest.raises(ValueError, match="need cos and sin"):
        gpk.nn.paged_write(pool, new, slots, rope_heads=1)
    with pytest.raises(ValueError, match="rope_heads 3 must be in"):
        gpk.nn.paged_write(pool, new, slots, cos=cos, sin=cos, rope_heads=3)
    with pytest.raises(ValueError, match=r"cos float32\[2, 4\] must be"):
        gpk.nn.paged_write(pool, new, slots, cos=cos[:2], sin=cos[:2])
    with pytest.raises(TypeError, match="rope_heads must be an int"):
        gpk.nn.paged_write(pool, new, slots, cos=cos, sin=cos, rope_heads=1.5)


def test_paged_attention_over_the_halves_of_one_pool():
    """Keys and values as the two halves of one pool [n_blocks, 2 KV, block, D] (views,
    blocks 2 KV block D elements apart) attend as separate pools do."""
    rng = np.random.default_rng(12)
    nb, kv, bs, d, h, b = 12, 2, 4, 16, 4, 3
    both = rng.standard_normal((nb, 2 * kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
    table = rng.permutation(nb)[: b * 4].reshape(b, 4).astype(np.int32)
    lens = np.array([16, 5, 0], np.int32)
    pool = gpk.asarray(both)
    got = gpk.nn.paged_attention(q, pool[:, :kv], pool[:, kv:], table, lens).to_numpy()
    ref = paged_sdpa_ref(q, both[:, :kv], both[:, kv:], table, lens)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_paged_attention_pieces_flag():
    """pieces=False (a step with no prompt pieces: the CUDA backend skips the piece
    kernel) gives the same attention, rows of one prompt included; pieces must be a bool."""
    rng = np.random.default_rng(13)
    nb, kv, bs, d, h = 12, 2, 4, 16, 4
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((4, h, 1, d)).astype(np.float32)
    own = rng.permutation(nb)[:8].reshape(2, 4).astype(np.int32)
    table = own[[0, 1, 1, 1]]  # a decode row, then a three-token prompt piece
    lens = np.array([9, 3, 4, 5], np.int32)
    got = gpk.nn.paged_attention(q, kp, vp, table, lens, pieces=False).to_numpy()
    np.testing.assert_allclose(got, paged_sdpa_ref(q, kp, vp, table, lens), atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    with pytest.raises(TypeError, match="pieces must be a bool"):
        gpk.nn.paged_attention(q, kp, vp, table, lens, pieces=1)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_paged_attention_rotates_q(dtype, tol, interleaved):
    """With cos and sin [B, D/2], each row's query is attended rotated by its own tables
    (the serving step's query rotation done by the attention): as the attention of q
    rotated in float64 (q and the tables rounded to the dtype first)."""
    rng = np.random.default_rng(14)
    nb, kv, bs, d, h, b = 12, 2, 4, 16, 4, 5
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
    cos, sin = _tables(rng, b, d)
    own = rng.permutation(nb)[:8].reshape(2, 4).astype(np.int32)
    table = own[[0, 1, 1, 1, 0]]
    lens = np.array([9, 3, 4, 5, 0], np.int32)
    cast = [gpk.asarray(a).astype(dtype) for a in (kp, vp, q)]
    got = gpk.nn.paged_attention(cast[2], cast[0], cast[1], table, lens, cos=cos, sin=sin,
                                 interleaved=interleaved).astype("float32").to_numpy()  # fmt: skip
    k64, v64, q64 = (a.astype("float32").to_numpy().astype(np.float64) for a in cast)
    c = gpk.asarray(cos).astype(dtype).astype("float32").to_numpy()
    s = gpk.asarray(sin).astype(dtype).astype("float32").to_numpy()
    q_rot = _rope64(q64[:, :, 0], c, s, interleaved)[:, :, None]  # [B, H, 1, D]
    np.testing.assert_allclose(got, paged_sdpa_ref(q_rot, k64, v64, table, lens), atol=tol,
                               rtol=tol)  # fmt: skip


def test_paged_attention_rope_arguments_are_checked():
    kp = gpk.zeros((2, 2, 4, 8), "float32")
    q = np.ones((3, 4, 1, 8), np.float32)
    table = np.zeros((3, 2), np.int32)
    lens = np.ones(3, np.int32)
    cos = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="cos and sin go together"):
        gpk.nn.paged_attention(q, kp, kp, table, lens, cos=cos)
    with pytest.raises(ValueError, match="interleaved needs cos and sin"):
        gpk.nn.paged_attention(q, kp, kp, table, lens, interleaved=True)
    with pytest.raises(ValueError, match=r"cos float32\[2, 4\] must be float32\[3, 4\]"):
        gpk.nn.paged_attention(q, kp, kp, table, lens, cos=cos[:2], sin=cos[:2])
    with pytest.raises(ValueError, match="rope takes one query a row"):
        gpk.nn.paged_attention(np.ones((3, 4, 2, 8), np.float32), kp, kp, table, lens,
                               cos=cos, sin=cos)  # fmt: skip


@pytest.mark.parametrize("bad, kind", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                       (True, TypeError), ("8", TypeError)])  # fmt: skip
def test_paged_attention_decode_rows_must_be_a_positive_int(bad, kind):
    q = gpk.asarray(np.ones((2, 4, 1, 8), np.float32))
    kp = gpk.asarray(np.ones((3, 2, 4, 8), np.float32))
    with pytest.raises(gpk.GPUKitError, match="decode_rows") as info:
        gpk.nn.paged_attention(q, kp, kp, np.zeros((2, 2), np.int32), np.ones(2, np.int32),
                               decode_rows=bad)  # fmt: skip
    assert isinstance(info.value, kind)


def test_paged_attention_decode_rows_hint_leaves_the_result():
    """decode_rows is a launch hint: the same attention with and without it (CPU backend
    here; the CUDA kernels' rows against float64 in tests/gpu)."""
    rng = np.random.default_rng(5)
    q = gpk.asarray(rng.standard_normal((6, 4, 1, 8)).astype(np.float32))
    kp = gpk.asarray(rng.standard_normal((5, 2, 4, 8)).astype(np.float32))
    table = np.array([[0, 1], [2, 3], [2, 3], [2, 3], [4, 0], [1, 2]], np.int32)
    lens = np.array([5, 6, 7, 8, 3, 0], np.int32)
    want = gpk.nn.paged_attention(q, kp, kp, table, lens).to_numpy()
    got = gpk.nn.paged_attention(q, kp, kp, table, lens, decode_rows=2).to_numpy()
    np.testing.assert_array_equal(got, want)
