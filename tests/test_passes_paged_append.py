"""fuse_paged_append: a compiled decode-only serving step's paged_write and paged_sdpa
(pieces False) over a captured pool become one paged_sdpa_append node, which stores the
rotated keys and the values into the caller's pool and attends as the two steps do
(float64 reference); steps with prompt pieces, or lazy ones, keep the store."""

from __future__ import annotations

import numpy as np
import pytest
from paged_append_case import AppendStep
from passes_util import report

import pygpukit as gpk
from pygpukit.passes.pipeline import run_pipeline


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 3e-2)])
def test_decode_only_step_fuses_and_matches_float64(dtype, tol):
    rng = np.random.default_rng(11)
    case = AppendStep(rng, dtype, h=8, kv=2, d=16, bs=4, m=6, nb=40, lens=[7, 1, 24, 0, 13])
    out = case.run()
    ref, pool = case.reference()
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)
    got_pool = case.pool.astype("float32").to_numpy()
    np.testing.assert_allclose(got_pool, pool, atol=tol, rtol=tol)
    ops = case.program_ops()
    assert ops.count("paged_sdpa_append") == 1 and ops.count("after") == 1
    assert "paged_write" not in ops and "paged_sdpa" not in ops


def test_slot_off_the_last_position_is_what_the_store_then_attend_gives():
    """A row whose slot is one of its earlier keys (not its newest position) attends over
    the stored value there, as the two unfused steps would."""
    rng = np.random.default_rng(12)
    case = AppendStep(rng, "float32", h=4, kv=2, d=8, bs=4, m=4, nb=20, lens=[9, 5])
    case.slots[0] = int(case.table[0, 1]) * 4 + 2  # row 0's position 6, not 8
    out = case.run()
    ref, _ = case.reference()
    np.testing.assert_allclose(out, ref, atol=1e-6, rtol=1e-6)


def test_steps_with_pieces_and_lazy_steps_keep_the_store():
    """pieces True (a prompt's rows read keys the same launch stores) keeps paged_write;
    a lazy graph (no caller memory to write into) fuses nothing and reports nothing."""
    rng = np.random.default_rng(13)
    case = AppendStep(rng, "float32", h=4, kv=2, d=8, bs=4, m=4, nb=20, lens=[5, 3])
    kv = case.kv
    pool = case.pool

    @gpk.compile
    def with_pieces(q, new, slots, table, lens, cos, sin):  # type: ignore[no-untyped-def]
        gpk.nn.paged_write(pool, new, slots, cos=cos, sin=sin, rope_heads=kv)
        return gpk.nn.paged_attention(q, pool[:, :kv], pool[:, kv:], table, lens,
                                      cos=cos, sin=sin)  # fmt: skip

    args = [gpk.from_numpy(a) for a in (case.q, case.new, case.slots, case.table, case.lens,
                                        case.cos, case.sin)]  # fmt: skip
    with_pieces(*args)
    graph = list(with_pieces._cache.values())[-1].program.schedule.graph
    ops = [n.op for n in graph.nodes]
    assert "paged_sdpa_append" not in ops and "paged_write" in ops
    lazy_pool = gpk.from_numpy(case.pool_np.copy())
    gpk.nn.paged_write(lazy_pool, args[1], args[2], cos=args[5], sin=args[6], rope_heads=kv)
    y = gpk.nn.paged_attention(args[0], lazy_pool[:, :kv], lazy_pool[:, kv:], args[3],
                               args[4], pieces=False, cos=args[5], sin=args[6])  # fmt: skip
    g = run_pipeline(gpk.runtime.pending_graph([y.node]))
    assert "paged_sdpa_append" not in [n.op for n in g.nodes]
    assert not report(g, "paged_append", "missed")


def test_bad_slot_is_an_index_error():
    """A slot past the pool is the store's IndexError, fused as unfused."""
    rng = np.random.default_rng(14)
    case = AppendStep(rng, "float32", h=4, kv=2, d=8, bs=4, m=4, nb=20, lens=[5, 3])
    case.slots[1] = 20 * 4 + 3
    with pytest.raises(IndexError):
        case.run()
