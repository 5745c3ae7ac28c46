"""rope_kv_write on the GPU (passes/fuse_rope_kv_write.py, rope.cuh's pgk_rope_kv_write):
a compiled prefill chunk's rope and its two cache stores in one kernel, against float64
NumPy and bit for bit against the same step without the pass, over both rope layouts,
float tables with half inputs, batches with left padding and chunk positions out of
order; float64 takes the composed path (the rope and two stores); a bad position is an
index error that names the op and stores nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from chunk_step import ChunkCase, ChunkStep

import pygpukit as gpk
from pygpukit import settings

pytestmark = pytest.mark.gpu

TOL = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 1e-4, "float64": 1e-10}


def _close(out: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    out64, ref64 = out.astype(np.float64), np.asarray(ref, np.float64)
    err = np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30)
    assert np.isfinite(out64).all() and err < TOL[dtype], f"relative error {err:.3g}"


CASES = [
    # TinyLlama's heads, one sequence
    ChunkCase(batch=1, heads=32, kv_heads=4, chunk=64, max_seq=256, head_dim=64,
              dtype="bfloat16"),
    # batches with left padding, D=128, interleaved, float tables with half inputs
    ChunkCase(batch=3, heads=16, kv_heads=2, chunk=32, max_seq=160, head_dim=128,
              dtype="float16", interleaved=True, tables="float32"),
    # float32, an odd chunk length
    ChunkCase(batch=2, heads=8, kv_heads=8, chunk=17, max_seq=64, head_dim=64,
              dtype="float32"),
    # float64: no fused kernel; the rope and the two stores it was fused from
    ChunkCase(batch=2, heads=4, kv_heads=2, chunk=8, max_seq=32, head_dim=16,
              dtype="float64"),
]  # fmt: skip


def _id(c: ChunkCase) -> str:
    return f"{c.dtype}-d{c.head_dim}-t{c.chunk}-b{c.batch}-i{int(c.interleaved)}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_compiled_chunk_step(cuda: Any, rng: np.random.Generator, case: ChunkCase) -> None:
    step = ChunkStep(case, rng)
    s, t = case.max_seq, case.chunk
    for pos in (t, 0, s - t, s // 2 + 1):
        arrays, start = step.inputs(pos)
        out = step(arrays, pos, start)
        _close(out, step.reference(arrays, pos, start), case.dtype)
        _close(step.cache_k.to_numpy(), step.k_ref, case.dtype)
        _close(step.cache_v.to_numpy(), step.v_ref, case.dtype)
    assert "rope_kv_write" in step.program_ops()
    assert step.fn.stats()["misses"] == 1
    replay = step.fn.stats()["entries"][0]["replay"]
    assert replay["captured"], replay


def test_bit_for_bit_as_without_the_pass(cuda: Any) -> None:
    """The fused kernel rounds as the rope kernel does: the attention and the caches are
    the unfused step's, bit for bit."""
    case = ChunkCase(batch=2, heads=32, kv_heads=4, chunk=64, max_seq=192, head_dim=64,
                     dtype="bfloat16")  # fmt: skip
    fused = ChunkStep(case, np.random.default_rng(5))
    with settings.also_skipping(["fuse_rope_kv_write"]):
        plain = ChunkStep(case, np.random.default_rng(5))
    for pos in (0, 64, 100):
        arrays, start = fused.inputs(pos)
        a = fused(arrays, pos, start)
        with settings.also_skipping(["fuse_rope_kv_write"]):
            b = plain(arrays, pos, start)
        np.testing.assert_array_equal(a, b)
    assert "rope_kv_write" in fused.program_ops()
    assert "rope_kv_write" not in plain.program_ops()
    np.testing.assert_array_equal(fused.cache_k.to_numpy(), plain.cache_k.to_numpy())
    np.testing.assert_array_equal(fused.cache_v.to_numpy(), plain.cache_v.to_numpy())


def test_bad_position_is_an_index_error(cuda: Any, rng: np.random.Generator) -> None:
    case = ChunkCase(batch=1, heads=8, kv_heads=2, chunk=16, max_seq=64, head_dim=64,
                     dtype="bfloat16")  # fmt: skip
    step = ChunkStep(case, rng)
    arrays, start = step.inputs(3)
    _close(step(arrays, 3, start), step.reference(arrays, 3, start), case.dtype)
    before_k, before_v = step.cache_k.to_numpy(), step.cache_v.to_numpy()
    bad = case.max_seq - case.chunk + 1
    with pytest.raises(gpk.IndexError) as e:
        step(arrays, bad, start)
    assert "rope_kv_write" in str(e.value) and str(bad) in str(e.value)
    np.testing.assert_array_equal(step.cache_k.to_numpy(), before_k)  # nothing was stored
    np.testing.assert_array_equal(step.cache_v.to_numpy(), before_v)
    _close(step(arrays, 4, start), step.reference(arrays, 4, start), case.dtype)
