"""The CUDA paged KV-cache kernels against the float64 reference, and the serving engine on
the GPU: batched greedy output equals each prompt alone (marker gpu)."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import llm

pytestmark = pytest.mark.gpu


def _ref(q, kp, vp, table, lens):
    b, h, t, d = q.shape
    kv, bs = kp.shape[1], kp.shape[2]
    out = np.zeros((b, h, t, d))
    for r in range(b):
        n = int(lens[r])
        keys = np.array([kp[table[r, p // bs], :, p % bs] for p in range(n)], np.float64)
        vals = np.array([vp[table[r, p // bs], :, p % bs] for p in range(n)], np.float64)
        for hh in range(h):
            g = hh // (h // kv)
            for i in range(t):
                last = n - t + i
                if last < 0:
                    continue
                s = keys[: last + 1, g] @ q[r, hh, i].astype(np.float64) / np.sqrt(d)
                p = np.exp(s - s.max())
                out[r, hh, i] = (p / p.sum()) @ vals[: last + 1, g]
    return out


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("t", [1, 6])
def test_paged_attention_gpu(dtype, tol, t):
    rng = np.random.default_rng(3)
    nb, kv, bs, d, h, b = 40, 4, 16, 64, 32, 5
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    table = rng.permutation(nb)[: b * 8].reshape(b, 8).astype(np.int32)
    lens = np.array([128, 1, 37, 0, 3], np.int32)
    kg = gpk.asarray(kp).astype(dtype)
    vg = gpk.asarray(vp).astype(dtype)
    got = gpk.nn.paged_attention(gpk.asarray(q).astype(dtype), kg, vg, table, lens)
    got = got.astype("float32").to_numpy()
    qr = gpk.asarray(q).astype(dtype).astype("float32").to_numpy()
    ref = _ref(qr, kg.astype("float32").to_numpy(), vg.astype("float32").to_numpy(), table, lens)
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("d, h, kv, t", [(64, 32, 4, 1), (128, 16, 2, 1), (64, 8, 8, 3)])
def test_paged_attention_split_kernel_gpu(dtype, tol, d, h, kv, t):
    """Long contexts through scattered blocks: one query per row splits the keys over many
    blocks and merges them (paged_decode.cuh); int64 lengths take the simple kernel and
    agree."""
    rng = np.random.default_rng(6)
    nb, bs, m, b = 300, 16, 48, 4
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    table = rng.permutation(nb)[: b * m].reshape(b, m).astype(np.int32)
    lens = np.array([m * bs, 700, 65, t], np.int32)
    kg = gpk.asarray(kp).astype(dtype)
    vg = gpk.asarray(vp).astype(dtype)
    qg = gpk.asarray(q).astype(dtype)
    got = gpk.nn.paged_attention(qg, kg, vg, table, lens).astype("float32").to_numpy()
    ref = _ref(qg.astype("float32").to_numpy(), kg.astype("float32").to_numpy(),
               vg.astype("float32").to_numpy(), table, lens)  # fmt: skip
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)
    simple = gpk.nn.paged_attention(qg, kg, vg, table, lens.astype(np.int64))
    np.testing.assert_allclose(simple.astype("float32").to_numpy(), ref, atol=tol, rtol=tol)


def test_paged_attention_bad_block_id_gpu():
    """A block id outside the pool is an IndexError, not a read outside it."""
    kp = gpk.asarray(np.ones((4, 2, 16, 64), np.float32))
    q = gpk.asarray(np.ones((1, 4, 1, 64), np.float32))
    table = np.array([[0, 9]], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, np.array([20], np.int32)).to_numpy()


def test_paged_write_gpu():
    rng = np.random.default_rng(4)
    pool_np = rng.standard_normal((6, 2, 4, 8)).astype(np.float32)
    pool = gpk.asarray(pool_np)
    new = rng.standard_normal((3, 2, 8)).astype(np.float32)
    gpk.nn.paged_write(pool, new, np.array([6, -1, 23], np.int64))
    want = pool_np.copy()
    want[1, :, 2], want[5, :, 3] = new[0], new[2]
    np.testing.assert_array_equal(pool.to_numpy(), want)


def test_engine_batched_equals_alone_gpu():
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine

    model = llm.load(write_tiny_model(), dtype="float32")
    e = Engine(model, max_model_len=256, prefill_chunk=64, kv_blocks=400).start()
    try:
        rng = np.random.default_rng(5)
        prompts = [[int(x) for x in rng.integers(3, 300, size=int(rng.integers(4, 100)))]
                   for _ in range(24)]  # fmt: skip
        batched = e.generate(prompts, 12, ignore_eos=True, timeout=600)
        alone = [e.generate([p], 12, ignore_eos=True, timeout=600)[0] for p in prompts[:6]]
        assert batched[:6] == alone
        assert e.stats()["used_blocks"] == 0
    finally:
        e.close()
