"""@gpk.compile on the CUDA backend replays a captured CUDA Graph: results against float64
NumPy on fresh random inputs, device scalars and persistent arrays without re-capture, the
static_outputs staleness error, flat pool memory over many calls, and the re-issue fallback
when a step cannot be captured."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.compile import StaleOutputError
from pygpukit.executor import _CAPTURES_KEPT

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-2.0, 2.0, shape).astype(np.float32)


def close(out: Any, ref: np.ndarray, rtol: float = 2e-5) -> None:
    got = out.to_numpy() if hasattr(out, "to_numpy") else out
    ref = np.asarray(ref, np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol, atol=rtol * scale)


def replay_of(fn: Any) -> Any:
    (entry,) = fn._cache.values()
    return entry.program._replay


def captures_of(fn: Any) -> list[Any]:
    """The graphs kept for fn's entry: one per set of argument/output addresses seen."""
    (entry,) = fn._cache.values()
    return list(entry.program._captures.values())


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_replays_as_graph_with_no_python_launches(cuda: Any, rng: np.random.Generator) -> None:
    @gpk.compile
    def f(x: Any, w: Any, b: Any) -> Any:
        h = gpk.nn.softmax((x @ w.T + b) * 0.5)
        return h.sum(-1), gpk.exp(h) - h

    # Arguments are bound by address (no copies): one capture per input set, then replays.
    sets = [(f32(rng, 16, 64), f32(rng, 32, 64), f32(rng, 32)) for _ in range(3)]
    dev = [tuple(gpk.from_numpy(a) for a in abc) for abc in sets]
    issued: list[int] = []
    for k in range(9):
        (x, w, b), args = sets[k % 3], dev[k % 3]
        before = cuda.launches_issued
        s, e = f(*args)
        issued.append(cuda.launches_issued - before)
        h = softmax64((x.astype(np.float64) @ w.T.astype(np.float64) + b) * 0.5)
        close(s, h.sum(-1), 1e-4)  # tf32 may serve the float32 matmul
        close(e, np.exp(h) - h, 1e-4)
        close(e * 2.0, 2.0 * (np.exp(h) - h), 1e-4)  # a later lazy op sees the result
        del s, e  # the next call's outputs may take these blocks (addresses recur)
    prog = next(iter(f._cache.values())).program
    assert 1 <= len(prog._captures) <= 6
    for rp in prog._captures.values():
        assert rp.captured and rp.fallback is None and rp.num_nodes > 0 and rp.eager_runs == 1
    assert issued[0] > 0 and issued[-3:] == [0, 0, 0]
    assert sum(rp.replays for rp in prog._captures.values()) == 9 - len(prog._captures)
    assert f.stats()["misses"] == 1


@pytest.mark.parametrize("static", [False, True], ids=["fresh", "static"])
def test_kept_captures_replay_view_outputs_and_copied_arguments(
    rng: np.random.Generator, static: bool
) -> None:
    # A kept capture is replayed without the executor's values list being set: outputs
    # that are views of a result (of the new block, or of the arena), an argument that is
    # a strided view (copied into its slot, not bound), and alternating input sets and
    # output blocks must all still come out right.
    @gpk.compile(static_outputs=static)
    def f(x: Any, y: Any, s: Any) -> Any:
        h = gpk.tanh(x) * 2.0 + y * s
        return h, h.reshape(-1), h.T

    sets = [(f32(rng, 6, 10), f32(rng, 10, 6), float(rng.uniform(-2, 2))) for _ in range(3)]
    dev = [(gpk.from_numpy(x), gpk.from_numpy(y).T, gpk.scalar(s)) for x, y, s in sets]
    for k in range(12):
        x, y, s = sets[k % 3]
        ref = np.tanh(x.astype(np.float64)) * 2.0 + y.T.astype(np.float64) * s
        h, flat, t = f(*dev[k % 3])
        close(h, ref)
        close(flat, ref.reshape(-1))
        close(t, ref.T)
    caps = captures_of(f)  # block addresses recur: later calls replay kept captures
    assert f.stats()["misses"] == 1 and all(rp.captured for rp in caps)
    assert sum(rp.replays for rp in caps) > 0


def test_device_scalar_changes_without_recapture(rng: np.random.Generator) -> None:
    table = f32(rng, 20, 8)
    t = gpk.from_numpy(table)

    @gpk.compile
    def row(i: Any, scale: Any) -> Any:
        return t[i] * scale + 1.0

    order = rng.permutation(20)
    for i in order:
        s = float(rng.uniform(-3, 3))
        close(row(gpk.scalar(int(i)), gpk.scalar(s)), table[i].astype(np.float64) * s + 1.0)
    assert row.stats()["misses"] == 1
    # New scalars at recurring addresses: a few captures, within the program's cache (how
    # many depends on the pool's reuse, which the test does not control), each one call.
    caps = captures_of(row)
    assert 1 <= len(caps) <= _CAPTURES_KEPT and all(rp.captured for rp in caps)
    assert sum(rp.replays for rp in caps) == len(order) - len(caps)


def test_kv_cache_setitem_at_dynamic_position(rng: np.random.Generator) -> None:
    ref = f32(rng, 2, 16, 4).astype(np.float64)
    cache = gpk.from_numpy(ref.astype(np.float32))
    addr = cache.node.realized.storage.addr

    @gpk.compile
    def step(k: Any, pos: Any) -> Any:
        cache[:, pos] = k
        return cache.sum(1) * 2.0

    for pos in rng.permutation(16)[:10]:
        k = f32(rng, 2, 4)
        out = step(gpk.from_numpy(k), gpk.scalar(int(pos)))
        ref[:, pos] = k
        close(out, ref.sum(1) * 2.0)
        close(cache, ref)  # the user's persistent array, written inside the graph
    assert step.stats()["misses"] == 1
    assert cache.node.realized.storage.addr == addr
    caps = captures_of(step)  # as above: a few captures, within the cache, each one call
    assert 1 <= len(caps) <= _CAPTURES_KEPT and all(rp.captured for rp in caps)
    assert sum(rp.replays for rp in caps) == 10 - len(caps)


def test_out_of_bounds_index_in_replay_is_reported(rng: np.random.Generator) -> None:
    table = gpk.from_numpy(f32(rng, 5, 3))

    @gpk.compile
    def pick(idx: Any) -> Any:
        return gpk.take(table, idx, axis=0) + 1.0

    for _ in range(2):
        pick(gpk.from_numpy(rng.integers(0, 5, 4))).to_numpy()
    assert replay_of(pick).captured
    with pytest.raises(gpk.errors.GPUKitError, match="out of bounds"):
        pick(gpk.from_numpy(np.array([0, 7, 1, 2]))).to_numpy()
    good = rng.integers(0, 5, 4)
    close(pick(gpk.from_numpy(good)), table.to_numpy()[good].astype(np.float64) + 1.0)


def test_static_outputs_go_stale(rng: np.random.Generator) -> None:
    s = gpk.compile(lambda x: gpk.tanh(x) + 1.0, static_outputs=True)
    xs = [f32(rng, 7, 5) for _ in range(3)]
    y0 = s(gpk.from_numpy(xs[0]))
    close(y0, np.tanh(xs[0].astype(np.float64)) + 1.0)
    y1 = s(gpk.from_numpy(xs[1]))
    with pytest.raises(StaleOutputError, match="static_outputs=True"):
        y0.to_numpy()
    close(y1, np.tanh(xs[1].astype(np.float64)) + 1.0)
    y2 = s(gpk.from_numpy(xs[2]))
    close(y2, np.tanh(xs[2].astype(np.float64)) + 1.0)
    assert replay_of(s).captured


def test_many_calls_do_not_grow_pool_memory(cuda: Any, rng: np.random.Generator) -> None:
    w = gpk.from_numpy(f32(rng, 32, 32))

    @gpk.compile
    def f(x: Any, i: Any) -> Any:
        return gpk.nn.rms_norm(x @ w, w[i]) * 0.25

    x = gpk.from_numpy(f32(rng, 4, 32))
    for k in range(5):
        f(x, gpk.scalar(k)).to_numpy()
    gc.collect()
    cuda.synchronize()
    before = cuda.pool_stats()
    for k in range(10_000):
        y = f(x, gpk.scalar(k % 32))
    last = y.to_numpy()
    del y
    gc.collect()
    after = cuda.pool_stats()
    assert after["in_use_bytes"] <= before["in_use_bytes"]
    assert after["reserved_bytes"] <= before["reserved_bytes"]
    xw = x.to_numpy().astype(np.float64) @ w.to_numpy().astype(np.float64)
    g = w.to_numpy().astype(np.float64)[9999 % 32]
    ref = xw / np.sqrt((xw**2).mean(-1, keepdims=True) + 1e-6) * g * 0.25
    close(last, ref, 2e-3)
    # y from the call before is alive, so outputs alternate blocks; how many address sets
    # the warm-up and the scalars' blocks add, and whether one of them first appears inside
    # the loop, depends on the pool's reuse (H200: 6 sets, one of them new at one run's call
    # 9,999). What must hold: the captures fit the program's cache (no re-capture churn,
    # which would evict captures and their replay counts) and replays served every call but
    # the few that made a capture.
    caps = captures_of(f)
    assert len(caps) <= _CAPTURES_KEPT
    assert sum(rp.replays for rp in caps) >= 10_000 - len(caps)


def test_a_graph_keeps_the_scratch_its_steps_need_at_once(
    cuda: Any, rng: np.random.Generator
) -> None:
    """Eight int8 linears on 64 rows (the prefill path: each dequantizes its weight into
    a scratch block, then multiplies): the captured graph reuses one scratch block where
    it had kept all eight (a 7B int8 prefill's dequantized weights: 14.8 GB)."""
    from pygpukit.quant import quantize

    n = k = 1024
    ws = [quantize(f32(rng, n, k), "int8") for _ in range(8)]

    @gpk.compile
    def f(x: Any) -> Any:
        for q in ws:
            x = gpk.nn.linear(x, q) * (1.0 / 32)
        return x

    x = gpk.from_numpy(f32(rng, 64, k))
    gpk.nn.linear(x, ws[0]).to_numpy()  # the backend's cuBLASLt workspace (32 MiB), kept
    gc.collect()
    cuda.synchronize()
    before = cuda.pool_stats()["in_use_bytes"]
    for _ in range(3):  # the eager first call, the capture, a replay
        y = f(x)
    got = y.to_numpy()
    del y
    gc.collect()
    grown = cuda.pool_stats()["in_use_bytes"] - before
    scratch = n * k * 4  # one dequantized float32 weight
    assert grown < 2 * scratch, grown
    ref = x.to_numpy().astype(np.float64)
    for q in ws:
        ref = ref @ q.dequantize().astype(np.float64).T / 32
    close(got, ref, 1e-4)


def test_uncapturable_step_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    import warnings

    from pygpukit.backends.cuda import plan, planned

    real = plan.PLANNERS["softmax"]

    def syncing(ctx: Any, step: Any, ins: Any, tag: int) -> Any:
        run = real(ctx, step, ins, tag)

        def go(v: Any) -> Any:
            stream = ctx.stream
            if stream is not None:
                stream.synchronize()  # a host sync on the capturing stream: refused
            return run(v)

        return go

    monkeypatch.setitem(plan.PLANNERS, "softmax", syncing)
    monkeypatch.setattr(planned, "_warned_ops", set())

    @gpk.compile
    def f(x: Any) -> Any:
        return gpk.nn.softmax(x * 2.0) + 1.0

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(4):
            x = f32(rng, 6, 10)
            close(f(gpk.from_numpy(x)), softmax64(2.0 * x.astype(np.float64)) + 1.0)
    ours = [w for w in seen if "CUDA Graph" in str(w.message)]
    assert len(ours) == 1 and "softmax" in str(ours[0].message), [str(w.message) for w in seen]
    rp = replay_of(f)
    assert not rp.captured and rp.fallback and "softmax" in rp.fallback
    assert rp.eager_runs == 4 and rp.replays == 0


@pytest.mark.parametrize("rows", [64, 256])
def test_kernels_after_cublaslt_start_early_and_still_wait(
    rng: np.random.Generator, rows: int
) -> None:
    """bf16 linears (cuBLASLt) each followed by our RMSNorm: where PDL is on and the GEMM
    has at most cublaslt.EARLY_MAX_ROWS rows, the captured graph lets each RMSNorm start
    once its GEMM's blocks have all begun (early_edges); it must still read the GEMM's
    whole output. The graph rewrites its input in place each call (x -> 0.5 - x), so a
    norm that ran ahead would read the last call's products."""
    from pygpukit.backends.cuda import cublaslt
    from pygpukit.backends.cuda.kernels import loader

    bf16 = gpk.bfloat16
    dims = (rows, 2048, 4096, 1024)  # rows, K, N1, N2: cuBLASLt GEMMs of several us
    w1 = rng.uniform(-1, 1, (dims[2], dims[1])).astype(np.float32)
    w2 = rng.uniform(-1, 1, (dims[3], dims[2])).astype(np.float32)
    g1 = rng.uniform(0.5, 1.5, dims[2]).astype(np.float32)
    g2 = rng.uniform(0.5, 1.5, dims[3]).astype(np.float32)
    dev = [gpk.from_numpy(a).astype(bf16) for a in (w1, w2, g1, g2)]
    xs = gpk.from_numpy(rng.uniform(-1, 1, dims[:2]).astype(np.float32)).astype(bf16)

    @gpk.compile(static_outputs=True)
    def f(w1: Any, w2: Any, g1: Any, g2: Any) -> Any:
        h = gpk.nn.rms_norm(gpk.nn.linear(xs, w1), g1)
        out = gpk.nn.rms_norm(gpk.nn.linear(h, w2), g2)
        xs[...] = 0.5 - xs
        return out

    def bf(a: np.ndarray) -> np.ndarray:
        return gpk.from_numpy(a).astype(bf16).astype(gpk.float32).to_numpy().astype(np.float64)

    def rms64(a: np.ndarray, g: np.ndarray) -> np.ndarray:
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * g

    w1b, w2b, g1b, g2b = (bf(a) for a in (w1, w2, g1, g2))
    for _ in range(6):
        x = xs.astype(gpk.float32).to_numpy().astype(np.float64)  # this call's input
        out = f(*dev).astype(gpk.float32).to_numpy()
        h = bf(rms64(x @ w1b.T, g1b).astype(np.float32))
        want = rms64(h @ w2b.T, g2b)
        np.testing.assert_allclose(out, want, rtol=0, atol=0.05 * float(np.abs(want).max()))
    caps = captures_of(f)
    assert caps and all(rp.captured for rp in caps)
    assert sum(rp.replays for rp in caps) == 6 - len(caps) >= 3  # the graphs ran, not eager
    early = loader.pdl_enabled() and rows <= cublaslt.EARLY_MAX_ROWS
    assert all((rp.early_edges >= 2) if early else rp.early_edges == 0 for rp in caps)
