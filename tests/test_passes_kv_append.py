"""fuse_kv_append: a compiled decode step's ropes, cache stores and attention become one
sdpa_append node, which gives what the unfused step gives (float64 reference), stores the
rotated row into the caller's caches, and is refused where the caches are not the
caller's to overwrite."""

from __future__ import annotations

import numpy as np
import pytest
from kv_step import DecodeStep, StepCase
from passes_util import close, report

import pygpukit as gpk
from pygpukit import settings
from pygpukit.passes.pipeline import run_pipeline


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2026)


@pytest.mark.parametrize("layout", ["half", "interleaved", "none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_step_fuses_and_matches_float64(rng, layout, dtype):
    case = StepCase(dtype=dtype, layout=layout)
    step = DecodeStep(case, rng)
    for pos in (5, 6, 0, 31):  # positions out of order: each call stores one row
        arrays, start = step.inputs(pos)
        out = step(arrays, pos, start)
        close(out, step.reference(arrays, pos, start), dtype, factor=2)
        # The caller's caches hold the new rows (bf16: rounded once, as the reference's).
        close(step.cache_k.to_numpy(), step.k_ref, dtype)
        close(step.cache_v.to_numpy(), step.v_ref, dtype)
    ops = step.program_ops()
    assert ops.count("sdpa_append") == 1 and ops.count("after") == 2
    assert "setitem" not in ops and "sdpa" not in ops
    assert ("rope" in ops) is False  # q's and k's rotations happen in the attention
    assert step.fn.stats()["misses"] == 1  # one trace serves every position


def test_lazy_step_keeps_the_stores_and_agrees(rng):
    """Lazy graphs never overwrite their inputs: the stores stay, same numbers."""
    case = StepCase()
    lazy = DecodeStep(case, np.random.default_rng(7), compiled=False)
    comp = DecodeStep(case, np.random.default_rng(7))
    for pos in (3, 4):
        arrays, start = comp.inputs(pos)
        a = comp(arrays, pos, start)
        b = lazy(arrays, pos, start)
        close(a, b, "float32")
    close(comp.cache_k.to_numpy(), lazy.cache_k.to_numpy(), "float32")
    out = lazy._step(*[gpk.from_numpy(x) for x in arrays], gpk.scalar(4), gpk.from_numpy(start))
    g = run_pipeline(gpk.runtime.pending_graph([out.node]))
    assert "sdpa_append" not in [n.op for n in g.nodes]
    assert not report(g, "kv_append", "missed")  # nothing to report without caller memory


def _traced(fn, *arrays):
    """The fused graph of a compiled fn on these arguments, through its own trace."""
    fn(*arrays)
    entry = list(fn._cache.values())[-1]
    return entry.program.schedule.graph


def test_refused_when_the_old_cache_is_read(rng):
    """A step that also reads the cache before the store keeps the store (and says why)."""
    case = StepCase(batch=1)
    step = DecodeStep(case, rng, compiled=False)

    def f(q, k, v, cos, sin, pos, start):
        before = step.cache_k.sum()  # the old contents: cannot be overwritten in place
        return step._step(q, k, v, cos, sin, pos, start), before

    fn = gpk.compile(f)
    arrays, start = step.inputs(4)
    g = _traced(fn, *[gpk.from_numpy(a) for a in arrays], gpk.scalar(4), gpk.from_numpy(start))
    assert "sdpa_append" not in [n.op for n in g.nodes]
    (miss,) = report(g, "kv_append", "missed")
    assert "old value" in miss["reason"] and "model.py" in miss["loc"]  # the attention line
    old = step.cache_k.to_numpy().astype(np.float64).sum()
    out, before = fn(*[gpk.from_numpy(a) for a in arrays], gpk.scalar(4), gpk.from_numpy(start))
    close(out.to_numpy(), step.reference(arrays, 4, start), "float32", factor=2)
    close(before.to_numpy(), old, "float32")


def test_rope_with_other_tables_stays_outside(rng):
    """q and k rotated by different tables: the cache work fuses, the ropes stay."""
    case = StepCase(batch=1)
    step = DecodeStep(case, rng, compiled=False)

    def f(q, k, v, cos, sin, pos, start):
        q = gpk.nn.rope(q, cos, sin)
        k = gpk.nn.rope(k, sin, cos)  # swapped tables: not one rotation
        step.cache_k[:, :, pos] = k[:, :, 0]
        step.cache_v[:, :, pos] = v[:, :, 0]
        from pygpukit.llm.model import attention, decode_mask

        return attention(q, step.cache_k, step.cache_v, decode_mask(start, pos, case.max_seq))

    fn = gpk.compile(f)
    arrays, start = step.inputs(9)
    g = _traced(fn, *[gpk.from_numpy(a) for a in arrays], gpk.scalar(9), gpk.from_numpy(start))
    (node,) = [n for n in g.nodes if n.op == "sdpa_append"]
    assert node.attrs["rope"] == "none" and [n.op for n in g.nodes].count("rope") == 2


def test_position_out_of_range_is_an_index_error(rng):
    case = StepCase(batch=1)
    step = DecodeStep(case, rng)
    arrays, start = step.inputs(2)
    close(step(arrays, 2, start), step.reference(arrays, 2, start), "float32", factor=2)
    with pytest.raises(gpk.IndexError, match="sdpa_append") as e:
        step(arrays, case.max_seq, start)
    assert "out of bounds" in str(e.value)
    # A negative position stores from the end, as NumPy's setitem does; the mask
    # (keys j <= pos) then shows no key, so the output is zeros, fused or not.
    out = step(arrays, -1, start)
    step.reference(arrays, case.max_seq - 1, start)
    np.testing.assert_array_equal(out, np.zeros_like(out))
    close(step.cache_k.to_numpy(), step.k_ref, "float32")


def test_op_rule_checks_shapes():
    from pygpukit.ir import ops
    from pygpukit.ir.dtypes import bfloat16, float32, int64
    from pygpukit.ir.shapes import ShapeRuleError

    q, c, n = ((1, 8, 1, 16), bfloat16), ((1, 2, 32, 16), bfloat16), ((1, 2, 1, 16), bfloat16)
    row, pos = ((1, 8), float32), ((), int64)
    attrs = {"rope": "half", "kv_len": True, "kv_start": False}
    shape, dt = ops.infer("sdpa_append", [q, c, c, n, n, pos, row, row, pos], attrs)
    assert shape == (1, 8, 1, 16) and dt == bfloat16
    with pytest.raises(ShapeRuleError, match="one float row of 8"):
        ops.infer("sdpa_append", [q, c, c, n, n, pos, ((2, 8), float32), row, pos], attrs)
    with pytest.raises(ShapeRuleError, match="k_new"):
        ops.infer("sdpa_append", [q, c, c, c, n, pos, row, row, pos], attrs)


def test_llm_decode_step_fuses():
    """A Llama decode step from the model file: each layer's attention is one sdpa_append."""
    import dataclasses

    from pygpukit.bench.llm import random_model, tinyllama_config
    from pygpukit.llm.sampling import SamplingParams

    small = {"num_layers": 2, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
             "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}  # fmt: skip
    cfg = dataclasses.replace(tinyllama_config(), **small)
    model = random_model(cfg, dtype="float32")
    model.generate_ids([[3, 4, 5, 6]], 3, SamplingParams(), max_seq_len=32, stop_at_eos=False)
    gen = next(g for v in vars(model).values() if isinstance(v, dict) for g in v.values()
               if hasattr(g, "_decode"))  # fmt: skip
    graph = list(gen._decode._cache.values())[-1].program.schedule.graph
    ops = [n.op for n in graph.nodes]
    assert ops.count("sdpa_append") == 2 and "setitem" not in ops and "rope" not in ops


def test_skipping_the_pass_keeps_the_stores(rng, monkeypatch):
    """PYGPUKIT_SKIP_PASSES=fuse_kv_append (for measuring it): the same numbers, unfused."""
    monkeypatch.setenv("PYGPUKIT_SKIP_PASSES", "fuse_kv_append")
    settings.reload()  # kept from its first read
    step = DecodeStep(StepCase(), rng)
    arrays, start = step.inputs(7)
    close(step(arrays, 7, start), step.reference(arrays, 7, start), "float32", factor=2)
    ops = step.program_ops()
    assert "sdpa_append" not in ops and ops.count("setitem") == 2 and "sdpa" in ops
    monkeypatch.setenv("PYGPUKIT_SKIP_PASSES", "no_such_pass")
    settings.reload()  # kept from its first read
    with pytest.raises(gpk.SettingError, match="PYGPUKIT_SKIP_PASSES names no pass.*no_such_pass"):
        DecodeStep(StepCase(), rng)(arrays, 7, start)
