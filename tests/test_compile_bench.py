"""Host-side costs (pytest-benchmark; informative, no pass/fail on time):
trace + passes, per-call dispatch of a compiled function, per-op eager dispatch."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.passes.pipeline import run_pipeline

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


class _NoReplay:
    """Stands in for a captured graph: the benchmark then times the host side of a call
    alone (guard, binding, output arrays), which is the same Python on every backend."""

    reads_values = False  # like a CUDA graph: the values list is not set for it

    def replay(self) -> None:
        pass


def _host_only(f) -> None:
    for e in f._cache.values():
        prog = e.program
        for k in prog._captures:
            prog._captures[k] = _NoReplay()
        prog._replay = _NoReplay()
        for which in ("_hot", "_cold"):  # the last two graphs, replayed without a lookup
            key, replay = getattr(prog, which)
            if replay is not None:
                setattr(prog, which, (key, _NoReplay()))


def test_bench_compiled_dispatch_host_only(benchmark):
    f = gpk.compile(block)
    for _ in range(4):
        f(X)
    _host_only(f)
    benchmark(f, X)
    assert f.stats()["fast_hits"] >= 3


@pytest.mark.parametrize("static", [False, True], ids=["fresh", "static"])
def test_bench_dispatch_gelu_scalar(benchmark, static):
    """scripts/graph_profile.py's dispatch_us workload (and bench `dispatch`'s): one
    small linear + GELU with a device scalar, its replay stubbed out, so what is timed
    is the per-call host path the CUDA backend runs too."""
    w = gpk.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    f = gpk.compile(lambda x, s: gpk.nn.gelu(x @ w + s) * 0.5, static_outputs=static)
    x = gpk.from_numpy(rng.standard_normal((8, 64)).astype(np.float32))
    s = gpk.scalar(0.25)
    for _ in range(4):
        f(x, s)
    _host_only(f)
    benchmark(f, x, s)
    assert f.stats()["misses"] == 1 and f.stats()["fast_hits"] >= 3


def test_bench_llm_decode_dispatch_host_only(benchmark, monkeypatch):
    """The tiny model's decode step (pygpukit/llm/tiny.py config, random weights): ~10
    arguments, its weights and KV caches captured through `self`."""
    from pygpukit.bench.llm import random_model
    from pygpukit.compile import CompiledFunction
    from pygpukit.llm.sampling import SamplingParams
    from pygpukit.llm.tiny import tiny_config

    model = random_model(tiny_config(384), "float32")
    prompt = [list(range(3, 19))]
    model.generate_ids(prompt, 6, SamplingParams(), max_seq_len=64, stop_at_eos=False)
    gen = next(g for g in _generators(model))
    dec = gen._decode
    seen = {}
    real = CompiledFunction.__call__

    # On the class: the compiled step scans the generator's attributes for arrays, and a
    # spy there (holding the arguments) would be part of its cache key.
    def spy(self, *args, **kwargs):
        if self is dec:
            seen["call"] = (args, kwargs)
        return real(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(CompiledFunction, "__call__", spy)
        model.generate_ids(prompt, 3, SamplingParams(), max_seq_len=64, stop_at_eos=False)
    args, kwargs = seen["call"]
    for _ in range(4):
        dec(*args, **kwargs)
    _host_only(dec)
    benchmark(dec, *args, **kwargs)
    st = dec.stats()
    assert st["misses"] == 1 and st["fast_hits"] >= 4, st["reasons"]


def _generators(model):
    for v in vars(model).values():
        if hasattr(v, "_decode"):
            yield v
        if isinstance(v, dict):
            yield from (g for g in v.values() if hasattr(g, "_decode"))


def _decode_step_22_layers():
    """The 22-layer TinyLlama decode step (pygpukit/llm/generate.py Generator._decode_fn) at
    tiny widths, random weights, batch 1, and its call arguments (greedy sampling)."""
    import dataclasses

    from pygpukit.bench.llm import random_model, tinyllama_config
    from pygpukit.llm.sampling import NoiseSource

    cfg = dataclasses.replace(tinyllama_config(), vocab_size=256, hidden_size=64,
                              intermediate_size=128, num_heads=4, num_kv_heads=2,
                              head_dim=16, max_position_embeddings=64)  # fmt: skip
    assert cfg.num_layers == 22
    gen = random_model(cfg, "float32").generator(1, 64)
    noise, noise_idx = NoiseSource(1, 1, 0).next()
    i64 = np.zeros(1, np.int64)
    one = np.array(1.0, np.float32)
    args = (gpk.from_numpy(i64), gpk.scalar(16), gpk.from_numpy(i64), gpk.from_numpy(one),
            gpk.from_numpy(one), noise, noise_idx, True, 0, False)  # fmt: skip
    return gen, args


def test_bench_trace_and_passes_decode_22_layers(benchmark):
    """trace + run_pipeline + lower of the 22-layer decode step, as CompiledFunction._compile
    runs them on a cache miss (argument flattening and the capture scan done beforehand)."""
    from collections import Counter

    from pygpukit import runtime
    from pygpukit.compile.trace import trace
    from pygpukit.passes import lower

    gen, args = _decode_step_22_layers()
    dec = gen._decode
    _, tree, arrays, captured, _ = dec._key(args, {})
    pending = [a._node for _, a in arrays + captured if a._node.realized is None]
    if pending:
        runtime.realize(pending)
    given = [a for _, a in arrays]

    def trace_passes_lower():
        traced = trace(dec.__wrapped_fn__, args, {}, given, tree, captured, dec.__name__)
        return traced, lower(run_pipeline(traced.graph))

    traced, schedule = benchmark.pedantic(trace_passes_lower, rounds=3, iterations=1)
    ops = Counter(n.op for n in schedule.graph.nodes)
    # Each layer's ropes, KV-cache stores and attention: one sdpa_append node.
    assert ops["sdpa_append"] == 22 and ops["sdpa"] == 0 and ops["rope"] == 0, ops
    # Per layer: qkv, o, gate_up and down projections (the norms folded in); plus lm_head.
    assert ops["linear"] == 4 * 22 + 1, ops
    # embed, norm, lm_head, the rope tables, 6 weights and the K and V caches per layer
    assert len(traced.persistent) == 5 + 8 * 22
    assert len(traced.writeback_persistent) == 2 * 22  # the K and V caches, written back
    # The kernels a replay launches (views excluded): the compiled program's own list.
    dec(*args)
    program = list(dec._cache.values())[-1].program
    kernels = Counter(st.op for _, st in program.kernels)
    assert kernels["linear"] == 89 and kernels["sdpa_append"] == 22, kernels
    # The rest: the embedding gather, the mask and greedy sampling, a few kernels in all.
    assert 89 + 22 < sum(kernels.values()) <= 89 + 22 + 8, kernels
