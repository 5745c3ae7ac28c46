"""DCE, CSE, constant folding and algebraic simplification: each rewrites the graph, keeps
it valid, and keeps the numbers (float64 NumPy references, lazy runs through the pipeline)."""

from __future__ import annotations

import numpy as np
import pytest
from passes_util import arr, close, f64, ops, record, run_lazy, run_unfused

import pygpukit as gpk
from pygpukit.passes.cse import common_subexpression_elimination
from pygpukit.passes.dce import dead_code_elimination
from pygpukit.passes.fold import constant_folding
from pygpukit.passes.pipeline import PIPELINE, pass_named, run_pipeline
from pygpukit.passes.simplify import algebraic_simplification, exact_cast


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_pipeline_is_a_list_of_named_passes():
    names = [p.__name__ for p in PIPELINE]
    assert names[0] == "dead_code_elimination" and "fuse_elementwise" in names
    assert pass_named("constant_folding") is constant_folding
    with pytest.raises(KeyError):
        pass_named("nope")


def test_provenance_records_each_pass(rng):
    g, _ = record(lambda x: gpk.exp(x) * 2.0 + 1.0, arr(rng, 4, 4))
    out = run_pipeline(g)
    assert [p["pass"] for p in out.provenance] == [p.__name__ for p in PIPELINE]
    assert all(p["ms"] >= 0 and p["nodes_before"] >= p["nodes_after"] - 2 for p in out.provenance)


def test_dce_drops_overwritten_stores(rng):
    x, a, b = arr(rng, 4, 6), arr(rng, 4, 2), arr(rng, 4, 2)

    def f(x, a, b):
        y = x + 1.0
        y[:, 1:3] = a
        y[:, 1:3] = b  # kills the first store
        z = x * 2.0
        z[:] = 5.0  # kills every earlier value of z
        return y, z

    g, _ = record(f, x, a, b)
    out = dead_code_elimination(g)
    out.validate()
    assert ops(g).count("setitem") == 3 and ops(out).count("setitem") == 1
    assert "mul" not in ops(out)
    y, z = run_lazy(f, x, a, b)
    ref = f64(x) + 1
    ref[:, 1:3] = f64(b)
    close(y, ref)
    close(z, np.full((4, 6), 5.0))


def test_cse_merges_repeats_commutative_and_keeps_signed_zeros(rng):
    x, y = arr(rng, 3, 5), arr(rng, 3, 5)

    def f(x, y):
        a = gpk.exp(x) * y
        b = y * gpk.exp(x)  # same, operands swapped
        c = 1.0 / gpk.full((3,), 0.0)
        d = 1.0 / gpk.full((3,), -0.0)  # -0.0 must not merge with 0.0
        return a + b, c, d

    g, _ = record(f, x, y)
    out = common_subexpression_elimination(g)
    out.validate()
    assert ops(out).count("exp") == 1 and ops(g).count("exp") == 2
    zeros = [n for n in out.nodes if n.op == "full" and n.attrs["value"] == 0]
    assert len(zeros) == 2
    s, c, d = run_lazy(f, x, y)
    close(s, 2 * np.exp(f64(x)) * f64(y))
    assert np.all(np.isposinf(c)) and np.all(np.isneginf(d))


def test_constant_folding_folds_full_subgraphs_into_one_full(rng):
    def f(x):
        c = (gpk.full((4, 1), 3.0) * 2.0 + 1.0).reshape(1, 4) + gpk.ones((3, 4)).sum(0)
        k = gpk.arange(6) * 3 + 2  # integer affine map of arange stays an arange
        return x + c, k

    x = arr(rng, 3, 4)
    g, _ = record(f, x)
    out = constant_folding(g)
    out.validate()
    assert [n.op for n in out.nodes if n.op not in ("input",)].count("full") == 1
    assert "mul" not in ops(out) and "sum" not in ops(out)
    ar = [n for n in out.nodes if n.op == "arange"]
    assert ar and ar[0].attrs["start"] == 2 and ar[0].attrs["step"] == 3
    assert all(len(repr(n.attrs)) < 200 for n in out.nodes)  # nothing big in attrs
    y, k = run_lazy(f, x)
    close(y, f64(x) + 10.0)
    np.testing.assert_array_equal(k, np.arange(6) * 3 + 2)


def test_constant_folding_leaves_errors_to_run_time():
    from pygpukit.ir import Graph, Node

    a = Node("full", (), {"shape": (), "dtype": "int64", "value": 2}, (), gpk.int64)
    b = Node("full", (), {"shape": (), "dtype": "int64", "value": -1}, (), gpk.int64)
    p = Node.make("pow", (a, b))
    out = constant_folding(Graph([], [p]))
    assert ops(out) == ["full", "full", "pow"]


def test_algebraic_simplification(rng):
    x = arr(rng, 2, 3, 4)

    def f(x):
        a = (x * 1.0 + 0.0) / 1.0
        b = a.transpose(1, 0, 2).transpose(1, 0, 2)  # double transpose: identity
        c = b.reshape(6, 4).reshape(24).reshape(2, 12)  # reshape chain: one reshape
        d = c.astype("float64").astype("float32")  # exact round trip
        e = gpk.broadcast_to(d, (2, 12))  # expand that does nothing
        return gpk.negative(gpk.negative(e))

    g, _ = record(f, x)
    out = algebraic_simplification(g)
    out.validate()
    assert ops(out) == ["reshape"], ops(out)
    close(run_lazy(f, x)[0], f64(x).reshape(2, 12))


def test_simplification_keeps_inexact_casts_and_caller_buffers(rng):
    x = arr(rng, 8)

    def f(x):
        return x.astype("bfloat16").astype("float32"), x.copy()

    g, _ = record(f, x)
    out = algebraic_simplification(g)
    assert ops(out).count("cast") == 3
    a, b = run_lazy(f, x)
    assert not np.array_equal(a, x) and np.array_equal(b, x)
    assert exact_cast(gpk.float16, gpk.float32) and not exact_cast(gpk.float32, gpk.float16)


def test_pipeline_matches_unfused_on_a_mixed_program(rng):
    x, w = arr(rng, 4, 8), arr(rng, 8, 8)

    def f(x, w):
        h = gpk.tanh(x @ w.T) * 1.0 + 0.0
        h = h - h.mean(-1, keepdims=True)
        return gpk.exp(h).sum(-1) + gpk.full((4,), 2.0) * 0.5

    (out,) = run_lazy(f, x, w)
    (unf,) = run_unfused(f, x, w)
    h = np.tanh(f64(x) @ f64(w).T)
    h = h - h.mean(-1, keepdims=True)
    close(out, np.exp(h).sum(-1) + 1.0)
    close(out, unf)
