"""gpk.Scheduler and eviction on the CUDA backend: measured GPU time, priority streams,
device round trips. Marked gpu (the directory); skipped without a GPU."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.backends as backends
from pygpukit.memory import eviction_stats

pytestmark = pytest.mark.usefixtures("cuda")
MIB = 1 << 20


@pytest.fixture
def small() -> Iterator[Any]:
    from pygpukit.backends.cuda.backend import CudaBackend

    saved = backends._backend
    b = CudaBackend(arena_bytes=MIB, quota_bytes=16 * MIB)
    backends._backend = b
    try:
        yield b
    finally:
        b.synchronize()
        backends._backend = saved
        gc.collect()


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32) + 0.5


def test_results_gpu_time_and_priority_streams() -> None:
    from pygpukit import _native

    rng = np.random.default_rng()
    w_h = _rand(rng, 512, 512)
    w = gpk.asarray(w_h)

    @gpk.compile
    def step(x):
        return gpk.nn.gelu(x @ w) + x

    xs_h = [_rand(rng, 64, 512) for _ in range(6)]
    xs = [gpk.asarray(h) for h in xs_h]
    want = [step(x).to_numpy() for x in xs]
    with gpk.Scheduler(memory=256 * MIB) as sched:
        assert not sched.simulated
        tasks = [sched.submit(step, x, qos=q, bandwidth=0.3, tenant=f"t{k % 2}")
                 for k, (x, q) in enumerate(zip(xs, ["guaranteed", "burstable"] * 3,
                                                strict=True))]  # fmt: skip
        for t, y in zip(tasks, want, strict=True):
            np.testing.assert_allclose(t.result(30).to_numpy(), y, rtol=1e-3, atol=1e-3)
            assert t.gpu_ms is not None and t.gpu_ms > 0
        _, greatest = _native.Stream.priority_range()
        assert tasks[0].stream_priority == greatest
        st = sched.stats()
        assert st["completed"] == 6 and st["reserved_bytes"] == 0
        assert st["tenants"]["t0"]["gpu_time_ms"] > 0


def test_device_eviction_round_trip(small: Any) -> None:
    rng = np.random.default_rng()
    host = [_rand(rng, 512, 512) for _ in range(24)]  # 24 MiB through a 16 MiB quota
    arrays = [gpk.asarray(h) for h in host]
    assert eviction_stats(small.pool)["evictions"] > 0
    np.testing.assert_allclose((arrays[0] * 2.0 + arrays[1]).to_numpy(), host[0] * 2 + host[1],
                               rtol=1e-6)  # fmt: skip
    for a, h in zip(arrays, host, strict=True):
        np.testing.assert_array_equal(a.to_numpy(), h)
    assert eviction_stats(small.pool)["restores"] > 0


def test_scheduler_arena_evicts_idle_device_arrays(small: Any) -> None:
    rng = np.random.default_rng()
    w_h = _rand(rng, 512, 512)
    w = gpk.asarray(w_h)

    @gpk.compile
    def big(x):
        return (x @ w) * 0.5 + x

    x_h = _rand(rng, 512, 512)
    x = gpk.asarray(x_h)
    idle_h = [_rand(rng, 512, 512) for _ in range(10)]
    idle = [gpk.asarray(h) for h in idle_h]
    with gpk.Scheduler(memory=16 * MIB) as sched:
        y = sched.submit(big, x).result(30)
        np.testing.assert_allclose(y.to_numpy(), x_h @ w_h * 0.5 + x_h, rtol=2e-3, atol=2e-3)
        assert sched.stats()["eviction"]["evictions"] > 0
    for a, h in zip(idle, idle_h, strict=True):
        np.testing.assert_array_equal(a.to_numpy(), h)


def test_best_effort_waits_for_guaranteed_work_on_the_gpu() -> None:
    """A GEMM launch cannot be taken back from the GPU, so BestEffort work submitted beside
    Guaranteed work starts only after it has ended, and one BestEffort launch at a time."""
    rng = np.random.default_rng()
    a = gpk.asarray(_rand(rng, 2048, 2048).astype(np.float16))
    w = gpk.asarray(_rand(rng, 256, 256))

    @gpk.compile
    def gemm(x):
        return x @ x

    @gpk.compile
    def step(x):
        return gpk.nn.gelu(x @ w) + x

    x = gpk.asarray(_rand(rng, 1, 256))
    gemm(a), step(x)  # compile before timing
    with gpk.Scheduler(memory=1 << 30) as sched:
        with sched.paused():
            bes = [sched.submit(gemm, a, qos="best_effort", tenant="be") for _ in range(3)]
            g = sched.submit(step, x, qos="guaranteed", bandwidth=0.3, tenant="g")
        g.result(30)
        for t in bes:
            t.result(30)
        g_end = g.stats()["finished_ms"]
        spans = sorted((t.stats()["started_ms"], t.stats()["finished_ms"]) for t in bes)
        assert all(s >= g_end for s, _ in spans)
        assert all(b[0] >= a_[1] for a_, b in zip(spans, spans[1:], strict=False))
        st = sched.stats()
        assert st["held_for_guaranteed"] == 3
        assert st["tenants"]["be"]["expected_ms"] > 0


def test_closed_loop_guaranteed_steps_end_in_order_and_leave_no_garbage() -> None:
    """A closed-loop Guaranteed client on the GPU: each step is launched at submission in
    the last step's arena and ended by its waiter; the core hears of each end after the
    next launch (all told by stats()), and no step leaves a reference cycle behind (its
    task is freed with the garbage collector off)."""
    import weakref

    rng = np.random.default_rng()
    w_h = _rand(rng, 256, 256)
    w = gpk.asarray(w_h)

    @gpk.compile
    def step(x):
        return gpk.nn.gelu(x @ w) + x

    xs_h = [_rand(rng, 1, 256) for _ in range(3)]
    xs = [gpk.asarray(h) for h in xs_h]
    step(xs[0])
    with gpk.Scheduler(memory=256 * MIB) as sched:
        refs = []
        gc.disable()
        try:
            for k in range(30):
                x_h, x = xs_h[k % 3], xs[k % 3]
                t = sched.submit(step, x, qos="guaranteed", bandwidth=0.3, tenant="g")
                y = t.result(30)
                h = x_h.astype(np.float64) @ w_h.astype(np.float64)
                gelu = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
                np.testing.assert_allclose(y.to_numpy(), gelu + x_h, rtol=2e-3, atol=2e-3)
                assert t.state == "done" and t.gpu_ms is not None and t.gpu_ms > 0
                refs.append(weakref.ref(t))
                del t, y
            st = sched.stats()  # tells the core of the last end: nothing holds it now
            assert all(r() is None for r in refs)
        finally:
            gc.enable()
        assert st["completed"] == 30 and st["reserved_bytes"] == 0 and not st["tasks"]
        assert st["tenants"]["g"]["completed"] == 30 and st["tenants"]["g"]["gpu_time_ms"] > 0


def test_best_effort_duty_limit_spaces_gemms_on_the_gpu() -> None:
    """best_effort_duty on the GPU: each best-effort GEMM starts only once the duty
    limit's bucket has refilled from the measured GPU time of those before it, and the
    results are right."""
    rng = np.random.default_rng()
    hs = [_rand(rng, 4096, 4096).astype(np.float16) for _ in range(3)]
    xs = [gpk.asarray(h) for h in hs]

    @gpk.compile
    def gemm(x):
        return x @ x

    gemm(xs[0])
    # A bucket of 0.2 * 0.1 = 0.02 ms: a 4096^3 GEMM (over 0.1 ms) overdraws it.
    with gpk.Scheduler(memory=1 << 30, best_effort_duty=0.2, duty_window_ms=0.1) as sched:
        tasks = [sched.submit(gemm, x, qos="best_effort", tenant="be") for x in xs]
        for t, h in zip(tasks, hs, strict=True):
            want = h.astype(np.float64) @ h.astype(np.float64)
            np.testing.assert_allclose(t.result(30).to_numpy().astype(np.float64), want,
                                       rtol=1e-2, atol=1.0)  # fmt: skip
        st = sched.stats()
    assert st["completed"] == 3 and st["best_effort_duty"] == 0.2
    assert st["held_for_duty"] == 2
    ran = sorted((t.started_ms, t.gpu_ms) for t in tasks)
    assert all(ms is not None and ms > 0.02 for _, ms in ran)
    charged = 0.0
    for (_, ms), (start, _) in zip(ran, ran[1:], strict=False):
        charged += ms
        # 0.02 ms to start with, refilled at 0.2 ms per ms since.
        assert charged <= 0.02 + 0.2 * start + 1e-6, ran


def test_best_effort_waits_sleep_rather_than_spin() -> None:
    """A best-effort task's end is waited on without spinning a CPU core (the driver's
    default with one context): the process's CPU time while a queue of GEMMs runs stays
    well under the wall time, where a spinning waiter costs a whole core throughout; and
    the results are right."""
    rng = np.random.default_rng()
    n = 8192
    a_h = rng.standard_normal((n, n)).astype(np.float16)
    b_h = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float16)
    a, b = gpk.asarray(a_h), gpk.asarray(b_h)

    @gpk.compile
    def gemm(x, y):
        return x @ y

    gemm(a, b)
    gpk.synchronize()
    with gpk.Scheduler(memory=8 << 30) as sched:
        for _ in range(2):  # the first round fills the pool with the blocks; the second is timed
            outs = None
            t0, c0 = time.perf_counter(), time.process_time()
            tasks = [sched.submit(gemm, a, b, qos="best_effort", tenant="be")
                     for _ in range(16)]  # fmt: skip
            outs = [t.result(60) for t in tasks]
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    want = a_h[:4].astype(np.float64) @ b_h.astype(np.float64)
    for y in (outs[0], outs[-1]):
        np.testing.assert_allclose(y[:4].to_numpy().astype(np.float64), want, rtol=2e-2,
                                   atol=5e-2)  # fmt: skip
    assert cpu < 0.5 * wall, (cpu, wall)


def test_blocking_event_waits_and_times() -> None:
    """gpk.Event(blocking=True): synchronize returns once the work recorded before it is
    done, and it times like any event."""
    rng = np.random.default_rng()
    h = rng.standard_normal((2048, 2048)).astype(np.float32)
    x = gpk.asarray(h)
    start, end = gpk.Event(), gpk.Event(blocking=True)
    start.record()
    y = x @ x
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) > 0
    np.testing.assert_allclose(y[:2].to_numpy().astype(np.float64),
                               h[:2].astype(np.float64) @ h.astype(np.float64),
                               rtol=1e-2, atol=1e-1)  # fmt: skip
