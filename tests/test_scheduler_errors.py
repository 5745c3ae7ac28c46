"""gpk.Scheduler refuses bad arguments with errors that name them, and never hangs once its
dispatcher has failed (CPU backend, simulated GPU time)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _rust
from pygpukit.backends import numpy_backend
from pygpukit.errors import GPUKitError, SchedulerError

MIB = 1 << 20
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> numpy_backend.NumpyBackend:
    from pygpukit import backends

    b = numpy_backend.NumpyBackend(arena_bytes=MIB, quota_bytes=64 * MIB)
    monkeypatch.setattr(backends, "_backend", b)
    return b


@gpk.compile
def affine(x):
    return x * 3.0 + 0.5


def _input(rng: np.random.Generator) -> tuple[gpk.GPUArray, np.ndarray]:
    x = rng.standard_normal((16, 8)).astype(np.float32)
    return gpk.asarray(x), x.astype(np.float64) * 3.0 + 0.5


def _check(exc: pytest.ExceptionInfo[BaseException], builtin: type, *names: str) -> None:
    assert isinstance(exc.value, GPUKitError) and isinstance(exc.value, builtin)
    for name in names:
        assert name in str(exc.value), (name, str(exc.value))


BAD_SCHEDULERS = [
    ({"memory": -1}, ValueError, ["memory", "-1"]),
    ({"memory": 2**70}, OverflowError, ["memory", str(2**70)]),
    ({"memory": 1.5 * MIB}, TypeError, ["memory", "float"]),
    ({"burst_ms": NAN}, ValueError, ["burst_ms", "nan"]),
    ({"burst_ms": INF}, ValueError, ["burst_ms", "inf"]),
    ({"burst_ms": 0.0}, ValueError, ["burst_ms"]),
    ({"guard_ms": -1.0}, ValueError, ["guard_ms"]),
    ({"min_idle_ms": INF}, ValueError, ["min_idle_ms"]),
    ({"sim_gbps": 0.0}, ValueError, ["sim_gbps"]),
    ({"max_inflight": 0}, ValueError, ["max_inflight"]),
    ({"best_effort_duty": 0.0}, ValueError, ["best_effort_duty", "0.0"]),
    ({"best_effort_duty": 1.5}, ValueError, ["best_effort_duty"]),
    ({"best_effort_duty": "half"}, TypeError, ["best_effort_duty", "str"]),
    ({"duty_window_ms": INF}, ValueError, ["duty_window_ms"]),
    ({"partitions": {"p": {"memory": -5}}}, ValueError, ["'p'", "memory"]),
    ({"partitions": {"p": {"memory": 2 * MIB}}}, ValueError, ['"p"', "memory quota"]),
    ({"partitions": {"p": {"bandwidth": NAN}}}, ValueError, ["'p'", "bandwidth"]),
    ({"partitions": {"p": {"bandwidth": 1.5}}}, ValueError, ["'p'", "bandwidth"]),
    ({"partitions": {"p": {"priority": 2**70}}}, OverflowError, ["'p'", "priority"]),
    ({"partitions": {"p": {"priority": "urgent"}}}, ValueError, ["'p'", "priority"]),
    ({"partitions": {"p": 3}}, TypeError, ["'p'"]),
    (
        {"partitions": {"a": {"bandwidth": 0.7}, "b": {"bandwidth": 0.4}}},
        ValueError,
        ['"b"', "bandwidth share", "above 1"],
    ),
    ({"partitions": {"a": {}, "b": {}}}, ValueError, ['"b"', "above 1"]),
]


@pytest.mark.parametrize("kwargs, builtin, names", BAD_SCHEDULERS)
def test_bad_scheduler_arguments_raise_named_errors(backend, kwargs, builtin, names) -> None:
    kwargs = {"memory": MIB, **kwargs}
    with pytest.raises(builtin) as exc:
        gpk.Scheduler(**kwargs)
    _check(exc, builtin, *names)


def test_partitions_within_memory_and_shares_are_accepted(backend) -> None:
    rng = np.random.default_rng()
    x, want = _input(rng)
    parts = {"a": {"memory": MIB, "bandwidth": 0.75}, "b": {"memory": MIB, "bandwidth": 0.25}}
    with gpk.Scheduler(memory=MIB, partitions=parts) as sched:
        t = sched.submit(affine, x, partition="b", sim_ms=1.0)
        np.testing.assert_allclose(t.result(60).to_numpy(), want, rtol=1e-6, atol=1e-6)
        assert sched.stats()["partitions"]["b"]["bandwidth_share"] == 0.25


BAD_SUBMITS = [
    ({"sim_ms": INF}, ValueError, ["sim_ms", "inf"]),
    ({"sim_ms": NAN}, ValueError, ["sim_ms", "nan"]),
    ({"sim_ms": -1.0}, ValueError, ["sim_ms"]),
    ({"sim_ms": "1"}, TypeError, ["sim_ms", "str"]),
    ({"priority": 2**70}, OverflowError, ["priority", str(2**70)]),
    ({"priority": -(2**31) - 1}, OverflowError, ["priority"]),
    ({"priority": 1.0}, TypeError, ["priority", "float"]),
    ({"bandwidth": NAN}, ValueError, ["bandwidth", "nan"]),
    ({"bandwidth": 2.0}, ValueError, ["bandwidth"]),
    ({"deadline": INF}, ValueError, ["deadline", "inf"]),
    ({"qos": 1}, TypeError, ["qos"]),
    ({"qos": "gold"}, ValueError, ["qos", "gold"]),
    ({"partition": None}, TypeError, ["partition"]),
]


def test_bad_submit_arguments_raise_named_errors_and_leave_the_scheduler_working(
    backend,
) -> None:
    rng = np.random.default_rng()
    x, want = _input(rng)
    with gpk.Scheduler(memory=8 * MIB) as sched:
        for kwargs, builtin, names in BAD_SUBMITS:
            with pytest.raises(builtin) as exc:
                sched.submit(affine, x, **kwargs)
            _check(exc, builtin, "Scheduler.submit", *names)
        with pytest.raises(ValueError) as exc:
            sched.at(INF, lambda: None)
        _check(exc, ValueError, "t_ms")
        # Nothing was admitted, and the clock still moves: a finite task runs as usual.
        assert sched.stats()["submitted"] == 0 and math.isfinite(sched.now())
        t = sched.submit(affine, x, sim_ms=2.0)
        np.testing.assert_allclose(t.result(60).to_numpy(), want, rtol=1e-6, atol=1e-6)
        assert t.finished_ms - t.started_ms == pytest.approx(2.0)
    with pytest.raises(SchedulerError, match="closed"):
        sched.submit(affine, x, sim_ms=1.0)


def _close_with_guard(sched: gpk.Scheduler) -> None:
    closer = threading.Thread(target=sched.close, daemon=True)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() hung"
    assert not sched._thread.is_alive()


def test_failed_dispatcher_fails_its_tasks_and_close_returns(backend) -> None:
    rng = np.random.default_rng()
    x, want = _input(rng)
    sched = gpk.Scheduler(memory=8 * MIB)
    with sched.paused():
        first = sched.submit(affine, x, sim_ms=1.0)
        second = sched.submit(affine, x, sim_ms=1.0)
        # The state submit() now refuses to create: a launch that never ends in simulated
        # time. Before, the clock became infinite, and close() waited for ever.
        first.sim_ms = INF
    with pytest.raises(SchedulerError, match="stopped") as exc:
        first.result(60)
    assert isinstance(exc.value, RuntimeError)
    with pytest.raises(SchedulerError, match="stopped"):
        second.result(60)
    assert first.state == second.state == "failed"
    with pytest.raises(SchedulerError, match="stopped"):
        sched.submit(affine, x, sim_ms=1.0)
    _close_with_guard(sched)
    st = sched.stats()
    assert st["reserved_bytes"] == 0 and st["arena_bytes_held"] == 0 and not st["tasks"]
    assert st["launches"]["failed"] == 2
    # The backend is fine: the same call runs directly.
    np.testing.assert_allclose(affine(x).to_numpy(), want, rtol=1e-6, atol=1e-6)


def test_core_binding_raises_gpk_errors() -> None:
    core = _rust.SchedulerCore(10 * MIB)
    with pytest.raises(OverflowError) as exc:
        core.submit("t", 1, now=0.0, priority=2**70)
    _check(exc, OverflowError, "priority")
    with pytest.raises(OverflowError) as exc:
        core.add_partition("p", 1, 0.5, 2**40)
    _check(exc, OverflowError, "stream_priority")
    with pytest.raises(ValueError) as exc:
        core.submit("t", -1, now=0.0)
    _check(exc, ValueError, "reservation_bytes")
    with pytest.raises(ValueError) as exc:
        core.submit("t", 1, now=INF)
    _check(exc, ValueError, "time must be finite")
    with pytest.raises(ValueError) as exc:
        core.add_partition("p", 11 * MIB, 0.5)
    _check(exc, ValueError, '"p"', "memory quota")
    with pytest.raises(ValueError) as exc:
        core.set_best_effort_duty(0.0, 10.0, 0.0)
    _check(exc, ValueError, "best_effort_duty")
    core.add_partition("p", MIB, 0.6)
    with pytest.raises(ValueError) as exc:
        core.add_partition("q", MIB, 0.6)
    _check(exc, ValueError, '"q"', "above 1")
