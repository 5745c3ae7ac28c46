"""A Guaranteed step launched at submission in its program's own arena (the scheduler's
spare) is checked and run by the compiled function's native hit, as the direct call is:
the reservation is taken on the hit's native check of the arguments, the launch is the
hit itself (quick call and result array in one native call), and no Python guard match
runs per step. Without a GPU: the CUDA planned hooks over a host pool with the replay
stubbed (test_compile_quick_call's HostCuda) and the scheduler's CUDA device with fake
events; every result checked against float64 NumPy."""

from __future__ import annotations

import math
import time
import types
from typing import Any

import numpy as np
import pytest
from test_compile_quick_call import HostCuda, N, _compiled, _read, _ref

import pygpukit as gpk
from pygpukit import backends, memory
from pygpukit.backends.cuda.planned import contiguous
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.compile import function as compile_function

MIB = 1 << 20


class _Event:
    def __init__(self, timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream: Any) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:  # the stand-in's launch has run by the time it returns
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


class _Stream:
    def __init__(self, priority: int, non_blocking: bool) -> None:
        self.priority = priority


def _scheduler_backend(b: HostCuda, monkeypatch: pytest.MonkeyPatch) -> HostCuda:
    """`b` as the process's backend, with what the scheduler and a clone ask of it."""
    b.name = "cpu"  # type: ignore[attr-defined]  # the scheduler's host stream priorities
    b.ordinal = 0  # type: ignore[attr-defined]

    def alloc(shape: tuple[int, ...], dtype: Any, what: str, launch: Any = None) -> Any:
        st = memory.block(b.pool, max(1, math.prod(shape) * dtype.itemsize))
        return DeviceValue(st, shape, contiguous(shape), 0, dtype)

    b.alloc = alloc  # type: ignore[attr-defined]
    b.pool_stats = lambda: dict(b.pool.stats())  # type: ignore[attr-defined]
    monkeypatch.setattr(backends, "_backend", b)
    return b


def test_steps_in_the_programs_arena_take_the_native_hit(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:  # fmt: skip
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    backend = HostCuda()
    f, full = _compiled(backend, monkeypatch)  # traced on the NumPy backend
    _scheduler_backend(backend, monkeypatch)
    rng = np.random.default_rng()
    hs = [rng.standard_normal(N).astype(np.float32) for _ in range(3)]
    xs = [backend.array(h) for h in hs]
    for x in xs:  # the direct calls settle the guard on its native hit
        f(x)
    assert f._fast is not None and f._fast.native is not None and f._hit is f._fast.native
    matched = [0]  # Python guard matches
    real_match = compile_function._Guard.match

    def match(self: Any, args: Any, kwargs: Any) -> Any:
        matched[0] += 1
        return real_match(self, args, kwargs)

    monkeypatch.setattr(compile_function._Guard, "match", match)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    dev._native = types.SimpleNamespace(Stream=_Stream, Event=_Event)
    sched._device = dev
    hits0 = f.stats()["fast_hits"]
    steps = 24
    try:
        ys = []
        for k in range(steps):
            # Results held: each step writes a fresh block, not one a later step reuses.
            i = k % 3
            t = sched.submit(f, xs[i], qos="guaranteed", bandwidth=0.3, tenant="g")
            if k == 1:
                matched[0] = 0  # the first step binds the new arena (the full call)
            ys.append((i, t.result()))
        st = sched.stats()
    finally:
        sched.close(timeout=60)
    assert st["completed"] == steps
    # After the first step: the native check reserves, the native hit runs; no Python match.
    assert matched[0] == 0, matched
    assert f.stats()["fast_hits"] - hits0 >= steps - 1
    for i, y in ys:
        np.testing.assert_allclose(_read(y), _ref(hs[i]), rtol=1e-5, atol=1e-5)
    assert full[0] < steps  # the quick call, not the full run, served the later steps
