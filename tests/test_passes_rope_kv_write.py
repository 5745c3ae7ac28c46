"""fuse_rope_kv_write: a compiled prefill chunk's rope and its two KV-cache stores become
one rope_kv_write node, which gives what the unfused step gives (float64 reference and
the program without the pass), stores the rotated keys and the values into the caller's
caches, and is refused where the caches are not the caller's to overwrite."""

from __future__ import annotations

import numpy as np
import pytest
from chunk_step import ChunkCase, ChunkStep
from passes_util import close, report

import pygpukit as gpk
from pygpukit import settings
from pygpukit.ir import ops as irops
from pygpukit.ir.dtypes import DTypeRuleError, as_dtype
from pygpukit.ir.shapes import ShapeRuleError
from pygpukit.passes.pipeline import run_pipeline


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunk_step_fuses_and_matches_float64(rng, interleaved, dtype):
    step = ChunkStep(ChunkCase(dtype=dtype, interleaved=interleaved), rng)
    for pos in (8, 0, 24, 13):  # chunk positions out of order, one unaligned
        arrays, start = step.inputs(pos)
        out = step(arrays, pos, start)
        close(out, step.reference(arrays, pos, start), dtype, factor=2)
        close(step.cache_k.to_numpy(), step.k_ref, dtype)
        close(step.cache_v.to_numpy(), step.v_ref, dtype)
    ops = step.program_ops()
    assert ops.count("rope_kv_write") == 1 and ops.count("after") == 2, ops
    assert "setitem" not in ops and "rope" not in ops, ops
    assert step.fn.stats()["misses"] == 1  # one trace serves every position


def test_same_as_without_the_pass():
    """The fused step and the step with the pass skipped give the same attention and
    leave the same caches."""
    case = ChunkCase(batch=3, heads=6, kv_heads=3, chunk=4, max_seq=16)
    fused = ChunkStep(case, np.random.default_rng(11))
    arrays, start = fused.inputs(5)
    a = fused(arrays, 5, start)
    with settings.also_skipping(["fuse_rope_kv_write"]):
        plain = ChunkStep(case, np.random.default_rng(11))
        b = plain(arrays, 5, start)
    assert "rope_kv_write" not in plain.program_ops()
    assert plain.program_ops().count("setitem") == 2
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fused.cache_k.to_numpy(), plain.cache_k.to_numpy())
    np.testing.assert_array_equal(fused.cache_v.to_numpy(), plain.cache_v.to_numpy())


def test_negative_and_bad_positions(rng):
    """A negative start counts the possible starts from the end, as the unfused store's
    dynamic slice; one out of range is an IndexError naming the step's line."""
    case = ChunkCase()
    step = ChunkStep(case, rng)
    arrays, start = step.inputs(4)
    step.reference(arrays, case.max_seq - case.chunk, start)  # the rows the stores write
    step(arrays, -1, start)  # (its attention's kv_len, pos + T, is the caller's to get right)
    close(step.cache_k.to_numpy(), step.k_ref)
    close(step.cache_v.to_numpy(), step.v_ref)
    with pytest.raises(IndexError) as e:
        step(arrays, case.max_seq - case.chunk + 1, start)
    assert "out of bounds" in str(e.value)


def test_lazy_step_keeps_the_stores_and_agrees(rng):
    """Lazy graphs never overwrite their inputs: the stores stay, same numbers."""
    case = ChunkCase()
    lazy = ChunkStep(case, np.random.default_rng(3), compiled=False)
    comp = ChunkStep(case, np.random.default_rng(3))
    arrays, start = comp.inputs(6)
    close(comp(arrays, 6, start), lazy(arrays, 6, start))
    close(comp.cache_k.to_numpy(), lazy.cache_k.to_numpy())
    close(comp.cache_v.to_numpy(), lazy.cache_v.to_numpy())
    out = lazy.step(*[gpk.from_numpy(x) for x in arrays], gpk.scalar(6), gpk.from_numpy(start))
    g = run_pipeline(gpk.runtime.pending_graph([out.node]))
    assert "rope_kv_write" not in [n.op for n in g.nodes]
    assert not report(g, "rope_kv_write", "missed")  # nothing to report without caller memory


def _traced(fn, *arrays):
    """The fused graph of a compiled fn on these arguments, through its own trace."""
    fn(*arrays)
    entry = list(fn._cache.values())[-1]
    return entry.program.schedule.graph


def test_refused_when_the_old_cache_is_read(rng):
    """A step that also reads the cache before the store keeps the stores (and says why)."""
    step = ChunkStep(ChunkCase(batch=1), rng, compiled=False)

    def f(qkv, cos, sin, pos, start):
        before = step.cache_v.sum()  # the old contents: cannot be overwritten in place
        return step.step(qkv, cos, sin, pos, start), before

    arrays, start = step.inputs(4)
    dev = [gpk.from_numpy(a) for a in arrays]
    g = _traced(gpk.compile(f), *dev, gpk.scalar(4), gpk.from_numpy(start))
    assert "rope_kv_write" not in [n.op for n in g.nodes]
    (miss,) = report(g, "rope_kv_write", "missed")
    assert "old value" in miss["reason"] and "chunk_step.py" in miss["loc"]


def test_refused_when_the_rotated_keys_are_read_too(rng):
    """Keys read before they are stored (besides the store) keep the rope and the stores."""
    step = ChunkStep(ChunkCase(batch=1), rng, compiled=False)
    c = step.case

    def f(qkv, cos, sin, pos, start):
        b, t, _ = qkv.shape
        hq, hk, d = c.heads * c.head_dim, c.kv_heads * c.head_dim, c.head_dim
        k = gpk.nn.rope(qkv[:, :, hq : hq + hk].reshape(b, t, c.kv_heads, d).swapaxes(1, 2),
                        cos, sin)  # fmt: skip
        return step.step(qkv, cos, sin, pos, start), k * 2.0

    arrays, start = step.inputs(4)
    dev = [gpk.from_numpy(a) for a in arrays]
    fn = gpk.compile(f)
    g = _traced(fn, *dev, gpk.scalar(4), gpk.from_numpy(start))
    assert "rope_kv_write" not in [n.op for n in g.nodes]
    (miss,) = report(g, "rope_kv_write", "missed")
    assert "read elsewhere" in miss["reason"]
    out, k2 = (a.to_numpy() for a in fn(*dev, gpk.scalar(4), gpk.from_numpy(start)))
    close(out, step.reference(arrays, 4, start), factor=2)


def test_op_rule():
    f32, i64 = as_dtype("float32"), as_dtype("int64")
    b, h, kv, t, s, d = 2, 6, 2, 5, 9, 8
    ins = [((b, h, t, d), f32), ((t, d // 2), f32), ((t, d // 2), f32), ((b, kv, s, d), f32),
           ((b, kv, s, d), f32), ((b, kv, t, d), f32), ((), i64)]  # fmt: skip
    attrs = {"layout": "half", "q_heads": h - kv}
    assert irops.infer("rope_kv_write", ins, attrs) == ((b, h - kv, t, d), f32)
    with pytest.raises(ShapeRuleError):
        irops.infer("rope_kv_write", ins, {"layout": "half", "q_heads": h - kv + 1})
    with pytest.raises(ShapeRuleError):
        irops.infer("rope_kv_write", ins, {"layout": "none", "q_heads": h - kv})
    short = ins[:3] + [((b, kv, t - 1, d), f32)] * 2 + ins[5:]
    with pytest.raises(ShapeRuleError):
        irops.infer("rope_kv_write", short, attrs)
    with pytest.raises(DTypeRuleError):  # a float position
        irops.infer("rope_kv_write", ins[:6] + [((), f32)], attrs)
