"""Host-side costs (pytest-benchmark; informative, no pass/fail on time):
trace + passes, per-call dispatch of a compiled function, per-op eager dispatch."""

from __future__ import annotations

import numpy as np
import pytest
from pygpukit.passes.pipeline import run_pipeline

import pygpukit as gpk

pytest.importorskip("pytest_benchmark")

rng = np.random.default_rng(0)
W = gpk.from_numpy(rng.standard_normal((64, 32)).astype(np.float32))
B = gpk.from_numpy(rng.standard_normal(64).astype(np.float32))
G = gpk.from_numpy(rng.standard_normal(64).astype(np.float32))


def block(x):
    h = gpk.nn.gelu(x @ W.T + B, approximate="tanh")
    h = h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * G
    e = gpk.exp(h - h.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) * 2.0 + 1.0


X = gpk.from_numpy(rng.standard_normal((4, 32)).astype(np.float32))


def test_bench_trace_and_passes(benchmark):
    def trace_compile():
        f = gpk.compile(block)
        f(X)
        return f

    f = benchmark(trace_compile)
    assert f.stats()["misses"] == 1


def test_bench_passes_only(benchmark):
    from pygpukit import runtime

    graph = runtime.pending_graph([block(X).node], "block")
    out = benchmark(run_pipeline, graph)
    assert {n.op for n in out.nodes} >= {"linear", "rms_norm", "softmax"}


def test_bench_compiled_dispatch(benchmark):
    f = gpk.compile(block)
    f(X)
    benchmark(f, X)
    assert f.stats()["misses"] == 1


def test_bench_compiled_dispatch_static_outputs(benchmark):
    f = gpk.compile(block, static_outputs=True)
    f(X)
    benchmark(f, X)


def test_bench_eager_op_dispatch(benchmark):
    a = gpk.from_numpy(np.ones((4, 32), np.float32))

    def op():
        with gpk.eager():
            return a + a

    benchmark(op)
