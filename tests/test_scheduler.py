"""gpk.Scheduler on the CPU backend: real compiled calls, simulated GPU time."""

from __future__ import annotations

import concurrent.futures
import gc
import math
import random
import time

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends import numpy_backend

MIB = 1 << 20


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> numpy_backend.NumpyBackend:
    """A fresh CPU backend per test, so pool figures start from zero."""
    from pygpukit import backends

    b = numpy_backend.NumpyBackend(arena_bytes=MIB, quota_bytes=64 * MIB)
    monkeypatch.setattr(backends, "_backend", b)
    return b


def _fns():
    @gpk.compile
    def mlp(x, w):
        return gpk.nn.gelu(x @ w) * 2.0

    @gpk.compile
    def gather(x, idx):
        return gpk.take(x, idx, axis=0) + 1.0

    return mlp, gather


def _data(rng, m=8, k=16, n=32):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    return x, w


def _reserved_zero(sched, backend, in_use_before):
    gc.collect()  # results the test dropped give their blocks back
    st = sched.stats()
    assert st["reserved_bytes"] == 0 and st["arena_bytes_held"] == 0
    assert st["queue_length"] == 0 and not st["tasks"]
    # The last ended task's arena may be kept for the next admission (none once closed).
    assert st["arena_bytes_spare"] == 0 or not sched._closed
    assert backend.pool_stats()["in_use_bytes"] <= in_use_before + st["arena_bytes_spare"]


def test_results_match_direct_calls_and_reservation(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    pairs = [_data(rng) for _ in range(5)]
    args = [(gpk.asarray(x), gpk.asarray(w)) for x, w in pairs]
    want = [mlp(*a).to_numpy() for a in args]
    res = mlp.reservation(*args[0])
    assert res.total == res.arena_bytes + res.input_bytes + res.output_bytes
    assert res.input_bytes == (8 * 16 + 16 * 32) * 4 and res.output_bytes == 8 * 32 * 4
    with gpk.Scheduler(memory=8 * MIB) as sched:
        tasks = [sched.submit(mlp, *a, sim_ms=1.5) for a in args]
        for t, w in zip(tasks, want, strict=True):
            np.testing.assert_allclose(t.result(10).to_numpy(), w, rtol=1e-6)
            st = t.stats()
            assert st["state"] == "done" and st["reservation_bytes"] == res.total
            assert st["gpu_ms"] == 1.5 and st["latency_ms"] >= 1.5
        st = sched.stats()
        assert st["completed"] == 5 and st["tenants"]["mlp"]["gpu_time_ms"] == 7.5
        assert st["simulated"] and st["now_ms"] == pytest.approx(7.5)


def test_reservation_of_a_guard_hit_is_the_entrys_own(backend):
    """reservation() of a call that passes the last call's guard is answered from the
    entry; new shapes get their own, and both equal a fresh function's figures."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    fresh, _ = _fns()
    small = [gpk.asarray(a) for a in _data(rng)]
    big = [gpk.asarray(a) for a in _data(rng, m=24, k=40, n=8)]
    mlp(*small)  # sets the guard
    first = mlp.reservation(*small)
    again = mlp.reservation(*[gpk.asarray(a.to_numpy()) for a in small])  # other arrays
    assert again is first and first == fresh.reservation(*small)
    other = mlp.reservation(*big)
    assert other == fresh.reservation(*big) and other.input_bytes == (24 * 40 + 40 * 8) * 4
    assert other.output_bytes == 24 * 8 * 4 and other != first
    mlp(*big)
    assert mlp.reservation(*big) is other
    np.testing.assert_allclose(mlp(*small).to_numpy(), fresh(*small).to_numpy(), rtol=1e-6)


def test_cost_model_from_bytes_moved(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    traffic = mlp.reservation(x, w).traffic_bytes
    assert traffic > 0
    with gpk.Scheduler(memory=8 * MIB, sim_gbps=0.001) as sched:  # 1e3 bytes per ms
        t = sched.submit(mlp, x, w)
        t.result(10)
        assert t.stats()["gpu_ms"] == pytest.approx(traffic / 1e3)


def test_two_burstable_tenants_get_70_30_of_gpu_time(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    costs = random.Random(int(rng.integers(1 << 30)))
    with gpk.Scheduler(memory=64 * MIB, burst_ms=20.0) as sched:
        with sched.paused():
            tasks = [sched.submit(mlp, x, w, tenant=name, bandwidth=share,
                                  sim_ms=costs.uniform(0.2, 5.0))
                     for _ in range(300) for name, share in (("a", 0.7), ("b", 0.3))]  # fmt: skip
        for t in tasks:
            t.result(30)
        st = sched.stats()
    # Shares while both tenants had work: up to the time the first one ran out.
    end = min(max(t.stats()["finished_ms"] for t in tasks if t.tenant == n) for n in "ab")
    got = {n: sum(t.gpu_ms for t in tasks if t.tenant == n and t.finished_ms <= end) for n in "ab"}
    assert got["a"] / (got["a"] + got["b"]) == pytest.approx(0.7, abs=0.05)
    charged = st["tenants"]["a"]["gpu_time_ms"] + st["tenants"]["b"]["gpu_time_ms"]
    assert charged == pytest.approx(sum(t.gpu_ms for t in tasks))


def test_tenant_over_its_share_is_throttled_while_others_are_within(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    with gpk.Scheduler(memory=64 * MIB, burst_ms=10.0) as sched:
        sched.submit(mlp, x, w, tenant="a", bandwidth=0.5, sim_ms=30.0).result(10)
        with sched.paused():  # a is 25 ms in debt; b arrives within its share
            a2 = sched.submit(mlp, x, w, tenant="a", bandwidth=0.5, sim_ms=1.0)
            bs = [sched.submit(mlp, x, w, tenant="b", bandwidth=0.5, sim_ms=1.0) for _ in range(3)]
        a2.result(10)
        assert all(b.finished_ms <= a2.started_ms for b in bs)
        st = sched.stats()
        assert st["tenants"]["a"]["throttled_tasks"] == 1 and st["throttled"] == 1
        # Once b has nothing waiting, a borrows the idle GPU rather than waiting for refill.
        assert a2.started_ms == pytest.approx(33.0)


def test_guaranteed_latency_stays_bounded_next_to_best_effort_flood(backend):
    """The simulated GPU cannot preempt a launch, so Guaranteed work stays fast only if
    BestEffort launches are kept off the device when Guaranteed work is due."""
    rng = np.random.default_rng()
    mlp, gather = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    big_x, big_w = (gpk.asarray(a) for a in _data(rng, 64, 64, 64))
    g_tasks: list[tuple[float, gpk.Task]] = []
    with gpk.Scheduler(memory=64 * MIB, guard_ms=0.25) as sched:
        with sched.paused():
            flood = [sched.submit(mlp, big_x, big_w, qos="best_effort", tenant="batch",
                                  sim_ms=5.0) for _ in range(100)]  # fmt: skip

            def arrive(t_ms: float) -> None:
                g_tasks.append((t_ms, sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3,
                                                   tenant="decode", sim_ms=0.5)))  # fmt: skip

            for k in range(50):
                sched.at(3.0 + 13.0 * k, lambda t=3.0 + 13.0 * k: arrive(t))
        for t in flood:
            t.result(30)
        assert len(g_tasks) == 50
        for _, task in g_tasks:
            task.result(30)
        lat = [task.finished_ms - t0 for t0, task in g_tasks]
        st = sched.stats()
    # Worked by hand. Before g's rate is known (two arrivals), batch launches freely: the
    # first arrival (t=3) waits for the launch of t=0 to end at 5, the second (t=16) for
    # the one of 15.5. From then on g is expected every 13 ms, and a 5 ms launch starts
    # only if it ends 0.25 ms before that: two per period, none in g's way.
    assert lat == pytest.approx([2.5, 5.0] + [0.5] * 48)
    arrivals = [t0 for t0, _ in g_tasks[2:]]
    for t in flood:
        assert not any(t.started_ms < a < t.finished_ms for a in arrivals), t.stats()
    # 4 launches before t=21, 1 until g's third arrival, 2 in each of the next 47 periods:
    # the 100th starts as the last g ends (640.5), as one still fits before 653.
    assert max(t.finished_ms for t in flood) == pytest.approx(645.5)
    assert st["tenants"]["batch"]["gpu_time_ms"] == pytest.approx(100 * 5.0)
    assert st["tenants"]["decode"]["guaranteed_gap_ms"] == pytest.approx(13.0)
    assert st["tenants"]["batch"]["expected_ms"] == pytest.approx(5.0)
    assert st["held_for_guaranteed"] > 0 and st["tenants"]["batch"]["held_tasks"] > 0


def test_closed_loop_guaranteed_client_holds_best_effort_until_idle(backend):
    """A Guaranteed client that submits as soon as its last result is back leaves the GPU
    no gap a 5 ms launch fits in: BestEffort waits until the client goes quiet."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    done: list[gpk.Task] = []
    with gpk.Scheduler(memory=64 * MIB) as sched:

        def step() -> None:
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="decode",
                             sim_ms=0.5)  # fmt: skip
            done.append(t)
            if len(done) < 60:  # the next step arrives 0.1 ms after this one ends
                t._future.add_done_callback(lambda _: sched.at(sched.now() + 0.1, step))

        with sched.paused():
            flood = [sched.submit(mlp, x, w, qos="best_effort", tenant="batch", sim_ms=5.0)
                     for _ in range(10)]  # fmt: skip
            sched.at(1.0, step)
        for t in flood:
            t.result(30)
        # The flood ends only after the client went quiet, so every step has been submitted.
        assert len(done) == 60
        for t in done:
            t.result(30)
    # The launch of t=0 ends at 5; after the second step the client's 0.6 ms gaps are
    # known and no launch starts until it has been silent for min_idle_ms (5 ms, more
    # than two of its gaps).
    starts = sorted(t.started_ms for t in flood)
    last_g = max(t.finished_ms for t in done)
    assert starts[0] == 0.0
    assert all(s >= last_g for s in starts[2:]), (starts, last_g)
    assert last_g + 5.0 - 0.6 <= starts[2] <= last_g + 5.0 + 1e-6
    assert max(t.finished_ms - t.submitted_ms for t in done[3:]) == pytest.approx(0.5)


def _mlp_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """mlp's result in float64 NumPy."""
    h = x.astype(np.float64) @ w.astype(np.float64)
    return 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0))) * 2.0


def test_best_effort_duty_limit_idles_the_gpu_between_best_effort_launches(backend):
    """best_effort_duty keeps a BestEffort flood to its fraction of the GPU's time, idle
    between launches (a GPU flooded back to back sits at its power limit, at low clocks,
    for the Guaranteed work that comes next); other work is not limited by it."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    xs_h = [_data(rng) for _ in range(20)]
    with gpk.Scheduler(memory=64 * MIB, best_effort_duty=0.4, duty_window_ms=5.0) as sched:
        with sched.paused():
            flood = [sched.submit(mlp, gpk.asarray(x), gpk.asarray(w), qos="best_effort",
                                  tenant="batch", sim_ms=2.0) for x, w in xs_h]  # fmt: skip
        x, w = xs_h[0]
        sched.at(8.0, lambda: other.append(sched.submit(mlp, gpk.asarray(x), gpk.asarray(w),
                                                        tenant="b", sim_ms=0.5)))  # fmt: skip
        other: list[gpk.Task] = []
        for t, (xh, wh) in zip(flood, xs_h, strict=True):
            np.testing.assert_allclose(t.result(30).to_numpy(), _mlp_ref(xh, wh), rtol=1e-4,
                                       atol=1e-4)  # fmt: skip
        st = sched.stats()
    # Worked by hand: a bucket of 0.4 * 5 = 2 ms, refilled at 0.4 ms per ms. The first two
    # launches run back to back (0-2, 2-4: 2 ms of tokens, then 0.8 refilled, 2 charged:
    # -1.2), then one every 5 ms (1.2 / 0.4 = 3 ms idle after each 2 ms launch).
    starts = [t.started_ms for t in flood]
    assert starts == pytest.approx([0.0, 2.0] + [7.0 + 5.0 * k for k in range(18)])
    # A Burstable task arriving at 8 (in a best-effort launch, 7-9) starts when it ends.
    assert other[0].started_ms == pytest.approx(9.0) and other[0].state == "done"
    assert st["tenants"]["batch"]["gpu_time_ms"] == pytest.approx(40.0)
    assert st["held_for_duty"] == 18 and st["held_for_guaranteed"] == 0
    assert st["best_effort_duty"] == 0.4
    # No limit (the default): the same flood back to back.
    with gpk.Scheduler(memory=64 * MIB) as sched:
        with sched.paused():
            flood = [sched.submit(mlp, gpk.asarray(x), gpk.asarray(w), qos="best_effort",
                                  tenant="batch", sim_ms=2.0) for x, w in xs_h]  # fmt: skip
        for t in flood:
            t.result(30)
        st = sched.stats()
    assert [t.started_ms for t in flood] == pytest.approx([2.0 * k for k in range(20)])
    assert st["held_for_duty"] == 0 and st["best_effort_duty"] == 1.0


def test_best_effort_duty_limit_in_real_time(backend):
    """Measured (not simulated) time: the dispatcher sleeps in the core until the duty
    limit's bucket refills, and the held launches still run."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    xs_h = [_data(rng) for _ in range(4)]
    # A bucket of 0.01 ms: any launch overdraws it (a compiled call takes longer).
    with gpk.Scheduler(memory=64 * MIB, simulate=False, best_effort_duty=0.01,
                       duty_window_ms=1.0) as sched:  # fmt: skip
        tasks = [sched.submit(mlp, gpk.asarray(x), gpk.asarray(w), qos="best_effort",
                              tenant="batch") for x, w in xs_h]  # fmt: skip
        for t, (xh, wh) in zip(tasks, xs_h, strict=True):
            np.testing.assert_allclose(t.result(30).to_numpy(), _mlp_ref(xh, wh), rtol=1e-4,
                                       atol=1e-4)  # fmt: skip
        st = sched.stats()
    assert st["completed"] == 4 and st["held_for_duty"] >= 1
    # Each start waited for the bucket: the time charged before it (each launch's measured
    # time) is at most the 0.01 ms it started with plus 1 % of the time since.
    ran = sorted((t.started_ms, t.gpu_ms) for t in tasks)
    charged = 0.0
    for (_, ms), (start, _) in zip(ran, ran[1:], strict=False):
        charged += ms
        assert charged <= 0.01 + 0.01 * start + 1e-6, ran


def test_admission_rejects_with_reason(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    need = mlp.reservation_bytes(x, w)
    with gpk.Scheduler(memory=need + need // 2,
                       partitions={"tiny": {"memory": need // 2}}) as sched:  # fmt: skip
        with pytest.raises(gpk.AdmissionRejected) as e:
            sched.submit(mlp, x, w, partition="tiny")
        assert "quota of partition" in e.value.reason
        with pytest.raises(gpk.AdmissionRejected, match="unknown partition"):
            sched.submit(mlp, x, w, partition="nope")
        with sched.paused():
            first = sched.submit(mlp, x, w, sim_ms=1.0)
            with pytest.raises(gpk.AdmissionRejected) as e:
                sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.5, tenant="g")
            assert "free memory" in e.value.reason and isinstance(e.value, RuntimeError)
        first.result(10)
        with pytest.raises(gpk.AdmissionRejected, match="bandwidth"):
            with sched.paused():
                sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.8, tenant="g1", sim_ms=9)
                sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.8, tenant="g2")
        assert sched.stats()["launches"]["rejected"] == 4
    with gpk.Scheduler(memory=MIB) as sched:
        with pytest.raises(ValueError, match="static_outputs"):
            sched.submit(gpk.compile(static_outputs=True)(lambda a: a + 1), x)
        with pytest.raises(ValueError, match="qos"):
            sched.submit(mlp, x, w, qos="gold")


def test_queued_tasks_start_when_memory_frees(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    need = mlp.reservation_bytes(x, w)
    in_use = backend.pool_stats()["in_use_bytes"]
    with gpk.Scheduler(memory=need) as sched:
        with sched.paused():
            tasks = [sched.submit(mlp, x, w, sim_ms=2.0) for _ in range(4)]
            assert [t.state for t in tasks] == ["admitted", "queued", "queued", "queued"]
            assert sched.stats()["arena_bytes_held"] == mlp.reservation(x, w).arena_bytes
            # Real memory: the admitted task's arena is a live pool block.
            assert backend.pool_stats()["in_use_bytes"] > in_use
        for t in tasks:
            np.testing.assert_allclose(t.result(10).to_numpy(), want, rtol=1e-6)
        starts = [t.started_ms for t in tasks]
        assert starts == [0.0, 2.0, 4.0, 6.0]  # each starts when the one before frees memory
        del t
        tasks.clear()
        _reserved_zero(sched, backend, in_use)


def test_cancel_failure_and_arena_oom_release_reservations(backend, monkeypatch):
    rng = np.random.default_rng()
    mlp, gather = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    table = gpk.asarray(rng.standard_normal((10, 4)).astype(np.float32))
    bad = gpk.asarray(np.array([1, 99], dtype=np.int64))  # out of range: fails when it runs
    in_use = backend.pool_stats()["in_use_bytes"]
    need = mlp.reservation_bytes(x, w)
    with gpk.Scheduler(memory=2 * need) as sched:
        with sched.paused():
            a = sched.submit(mlp, x, w, sim_ms=1.0)
            b = sched.submit(mlp, x, w, sim_ms=1.0)
            c = sched.submit(mlp, x, w, sim_ms=1.0)
            assert (a.state, b.state, c.state) == ("admitted", "admitted", "queued")
            assert b.cancel() and c.state == "admitted"  # b's memory let c in
            assert c.cancel() and not c.cancel()
        assert a.result(10) is not None and not a.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            b.result(1)
        f = sched.submit(gather, table, bad, sim_ms=1.0)
        with pytest.raises(IndexError):
            f.result(10)
        assert f.state == "failed"
        st = sched.stats()
        assert (st["completed"], st["failed"], st["cancelled"]) == (1, 1, 2)
        del a
        _reserved_zero(sched, backend, in_use)

    # An arena the pool cannot give (the scheduler was told of more memory than exists).
    monkeypatch.setattr(backend, "alloc_arena", _raise_oom)
    with gpk.Scheduler(memory=64 * MIB) as sched:
        t = sched.submit(mlp, x, w)
        with pytest.raises(gpk.OutOfMemoryError):
            t.result(10)
        st = sched.stats()
        assert st["launches"]["arena_oom"] == 1 and st["reserved_bytes"] == 0


def _raise_oom(nbytes: int) -> None:
    raise gpk.OutOfMemoryError(f"no arena of {nbytes} bytes")


def test_partitions_priorities_deadlines(backend):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    parts = {"inference": {"memory": 8 * MIB, "bandwidth": 0.7, "priority": "high"},
             "batch": {"memory": 8 * MIB, "bandwidth": 0.3}}  # fmt: skip
    with gpk.Scheduler(memory=16 * MIB, partitions=parts) as sched:
        with sched.paused():
            late = sched.submit(mlp, x, w, partition="batch", deadline=5.0, sim_ms=1.0)
            soon = sched.submit(mlp, x, w, partition="batch", deadline=1.0, sim_ms=1.0)
            hi = sched.submit(mlp, x, w, partition="batch", priority=3, sim_ms=1.0)
            inf = sched.submit(mlp, x, w, partition="inference", tenant="svc", sim_ms=1.0)
        for t in (late, soon, hi, inf):
            t.result(10)
        assert inf.stats()["stream_priority"] == -1 and late.stats()["stream_priority"] == 0
        assert hi.started_ms < soon.started_ms < late.started_ms
        st = sched.stats()
        assert st["partitions"]["inference"]["bandwidth_share"] == 0.7
        assert st["tenants"]["svc"]["share"] == pytest.approx(0.7)
        assert st["tenants"]["mlp"]["share"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="unknown keys"):
        gpk.Scheduler(memory=MIB, partitions={"p": {"mem": 1}})
    with pytest.raises(ValueError, match="priority"):
        gpk.Scheduler(memory=MIB, partitions={"p": {"priority": "urgent"}})


def test_random_submit_cancel_leaves_no_reservation(backend):
    rng = np.random.default_rng()
    mlp, gather = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    table = gpk.asarray(rng.standard_normal((10, 4)).astype(np.float32))
    idx = [gpk.asarray(np.array([1, 2])), gpk.asarray(np.array([3, 40]))]
    need = mlp.reservation_bytes(x, w)
    in_use = backend.pool_stats()["in_use_bytes"]
    rnd = random.Random(int(rng.integers(1 << 30)))
    with gpk.Scheduler(memory=3 * need) as sched:
        tasks = []
        for _ in range(60):
            with sched.paused():
                for _ in range(rnd.randint(1, 4)):
                    qos = rnd.choice(["burstable", "best_effort", "guaranteed"])
                    try:
                        if rnd.random() < 0.3:
                            tenant = f"t{rnd.randint(0, 3)}"
                            t = sched.submit(gather, table, rnd.choice(idx), qos=qos,
                                             bandwidth=0.1, tenant=tenant)  # fmt: skip
                        else:
                            t = sched.submit(mlp, x, w, qos=qos, bandwidth=0.1,
                                             tenant=f"t{rnd.randint(0, 3)}",
                                             sim_ms=rnd.uniform(0, 3))  # fmt: skip
                        tasks.append(t)
                    except gpk.AdmissionRejected as e:
                        assert e.reason
                for t in rnd.sample(tasks, min(2, len(tasks))):
                    t.cancel()
        for t in tasks:
            concurrent.futures.wait([t._future], timeout=10)
            assert t.state in ("done", "failed", "cancelled")
        del t
        tasks.clear()
        _reserved_zero(sched, backend, in_use)


def test_arenas_at_a_seen_address_reuse_the_capture(backend, monkeypatch):
    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    captures = []
    real = backend.capture
    monkeypatch.setattr(backend, "capture", lambda run: captures.append(1) or real(run))
    with gpk.Scheduler(memory=mlp.reservation_bytes(x, w)) as sched:  # one arena at a time
        tasks = [sched.submit(mlp, x, w, sim_ms=1.0) for _ in range(8)]
        for t in tasks:
            np.testing.assert_allclose(t.result(10).to_numpy(), want, rtol=1e-6)
    assert 1 <= len(captures) < len(tasks)


class _FakeStream:
    def __init__(self, priority: int, non_blocking: bool) -> None:
        self.priority = priority


def _fake_cuda(dev, waiter_ended, fired=None):
    """Fake Stream and Event classes for `dev`, and a launch wrapper. Each event knows the
    task it was recorded for. The end event of a Guaranteed launch holds its stream's
    completer thread until the thread waiting in result() has ended the task
    (waiter_ended[task.id]), so who ends what is decided, not raced: the waiter ends every
    Guaranteed step, the completer every BestEffort task (whose results are awaited with a
    timeout, which never waits on the event itself). fired(task): whether a task's events
    have fired when queried (default: always); an event belongs to the task it was last
    recorded for. Returns the launch wrapper's map of task id
    -> threading.Event set once the task is launched."""
    import threading

    local = threading.local()
    launched: dict[int, threading.Event] = {}
    lock = threading.Lock()

    def flag(table: dict[int, threading.Event], tid: int) -> threading.Event:
        with lock:
            return table.setdefault(tid, threading.Event())

    class FakeEvent:
        def __init__(self, timing: bool, blocking: bool = False) -> None:
            self.t = 0.0
            self.task = getattr(local, "task", None)

        def record(self, stream: _FakeStream) -> None:
            # As a CUDA event, it stands for its latest record: the scheduler reuses them.
            self.t = time.perf_counter()
            self.task = getattr(local, "task", None)

        def synchronize(self) -> None:
            on_completer = threading.current_thread().name.startswith("pygpukit-sched-stream")
            if on_completer and self.task is not None and self.task.qos == "guaranteed":
                flag(waiter_ended, self.task.id).wait()

        def elapsed_time(self, end: FakeEvent) -> float:
            return (end.t - self.t) * 1e3

        def query(self) -> bool:  # fired: the fake launch ran at once, unless held
            return fired is None or self.task is None or fired(self.task)

    import types

    dev._native = types.SimpleNamespace(Stream=_FakeStream, Event=FakeEvent)
    real_launch = dev.launch

    def launch(task, priority, high, run, now, on_caller=False):
        local.task = task
        try:
            real_launch(task, priority, high, run, now, on_caller)
        finally:
            local.task = None
        flag(launched, task.id).set()

    dev.launch = launch
    return lambda tid: flag(launched, tid), lambda tid: flag(waiter_ended, tid)


def test_cuda_device_path_ends_and_starts_tasks_from_completer_threads(backend, monkeypatch):
    """The CUDA path without a GPU: launches on the submitting thread, ends (and the starts
    they free) on the per-stream completer threads or on the thread waiting in result(),
    and the dispatcher only for timers. No step depends on timing: fake events decide which
    thread ends each task, and closing must not wait for the dispatcher's idle timeout."""
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    monkeypatch.setattr(backend, "stream", None, raising=False)
    # An idle dispatcher sleeps an hour: anything that needs its backstop wake-up hangs.
    monkeypatch.setattr(sched_mod, "IDLE_WAIT_MS", 3.6e6)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK)
    waiter_ended: dict = {}
    launched, ended_by_waiter = _fake_cuda(dev, waiter_ended)
    ends = {"completer": 0, "waiter": 0}

    def counted(who, fn):
        def end(d):
            ends[who] += 1
            fn(d)
            if who == "waiter":
                ended_by_waiter(d.task.id).set()

        return end

    dev.on_done = counted("completer", sched._on_done)
    dev.on_done_waiter = counted("waiter", sched._on_done_waiter)
    sched._device = dev
    try:
        bes = [sched.submit(mlp, x, w, qos="best_effort", tenant="be") for _ in range(5)]
        steps = []
        for _ in range(20):
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
            # A step held back by pacing is launched later by another thread; result()
            # waits on the launch's end event only once it is launched.
            assert launched(t.id).wait(60)
            np.testing.assert_allclose(t.result().to_numpy(), want, rtol=1e-6)
            steps.append(t)
        for t in bes:
            np.testing.assert_allclose(t.result(60).to_numpy(), want, rtol=1e-6)
        st = sched.stats()
        assert st["launches"]["launched"] == 25 and st["completed"] == 25
        assert ends == {"completer": 5, "waiter": 20}, ends
        spans = sorted((t.started_ms, t.finished_ms) for t in bes)
        # One BestEffort launch in flight at a time, started by whichever thread ended the last.
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert {p for p in dev.streams} == {t.stream_priority for t in steps + bes}
    finally:
        sched.close(timeout=60)
    assert not sched._thread.is_alive(), "close() waited for the dispatcher's idle timeout"
    _reserved_zero(sched, backend, 1 << 62)


def test_cuda_on_caller_guaranteed_launch_is_ended_without_a_completer(backend, monkeypatch):
    """A Guaranteed task launched at submission is watched by no completer thread: its
    waiter ends it (result, done) or, when nobody waits, the next submit or the dispatcher
    does once it is SWEEP_MS old. The completer still ends the BestEffort ones."""
    from pygpukit.scheduler import device as device_mod
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    monkeypatch.setattr(backend, "stream", None, raising=False)
    monkeypatch.setattr(device_mod, "SWEEP_MS", 0.0)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK)
    held: set[int] = set()  # tasks whose GPU work has not ended yet
    _fake_cuda(dev, {}, lambda task: task.id not in held)
    ends = {"completer": 0, "waiter": 0, "collect": 0}

    def counted(who, fn):
        def end(d):
            ends[who] += 1
            fn(d)

        return end

    real_collect = dev.collect

    def collect():
        out = real_collect()
        ends["collect"] += len(out)
        return out

    dev.on_done = counted("completer", sched._on_done)
    dev.on_done_waiter = counted("waiter", sched._on_done_waiter)
    dev.collect = collect
    sched._device = dev
    try:
        g = sched.submit(mlp, x, w, qos="guaranteed", tenant="g")
        assert g.state == "running" and dev.unreported()
        np.testing.assert_allclose(g.result().to_numpy(), want, rtol=1e-6)
        assert ends == {"completer": 0, "waiter": 1, "collect": 0}
        g = sched.submit(mlp, x, w, qos="guaranteed", tenant="g")
        assert g.done() and ends["waiter"] == 2  # done() ends a launch that has ended
        np.testing.assert_allclose(g.result(0).to_numpy(), want, rtol=1e-6)
        unwaited = [sched.submit(mlp, x, w, qos="guaranteed", tenant="g") for _ in range(3)]
        # Nobody waits on them: each later submit, then the dispatcher, ends them.
        for _ in range(600):
            if all(t._future.done() for t in unwaited):
                break
            time.sleep(0.05)
        assert [t.state for t in unwaited] == ["done"] * 3 and ends["collect"] == 3
        for t in unwaited:
            np.testing.assert_allclose(t.result(0).to_numpy(), want, rtol=1e-6)
        # Those still on the GPU are kept (nothing ends them early), and ended once fired.
        slow = []
        for _ in range(2):
            slow.append(sched.submit(mlp, x, w, qos="guaranteed", tenant="g"))
            held.add(slow[-1].id)
        fast = sched.submit(mlp, x, w, qos="guaranteed", tenant="g")  # sweeps: both kept
        assert [t.state for t in slow] == ["running"] * 2 and dev.unreported()
        assert not slow[0].done() and fast.result(60) is not None
        kept = [e[2][0] for e in dev._unwatched]
        assert len(set(map(id, kept))) == len(kept)  # each kept once
        assert [t for t in kept if not t.done()] == slow  # in launch order
        with pytest.raises(concurrent.futures.TimeoutError):
            slow[1].result(0.01)
        held.clear()
        for t in slow:
            np.testing.assert_allclose(t.result(60).to_numpy(), want, rtol=1e-6)
        be = sched.submit(mlp, x, w, qos="best_effort", tenant="be")
        np.testing.assert_allclose(be.result(60).to_numpy(), want, rtol=1e-6)
        assert ends["completer"] == 1 and not dev.unreported()
        st = sched.stats()
        assert st["completed"] == 9 and st["reserved_bytes"] == 0
    finally:
        sched.close(timeout=60)
    assert not sched._thread.is_alive()
    _reserved_zero(sched, backend, 1 << 62)


class _CoreSpy:
    """The scheduler's Rust core, counting the calls made to it by name."""

    def __init__(self, core) -> None:
        self.core, self.calls = core, {}

    def __getattr__(self, name):
        fn = getattr(self.core, name)

        def call(*a, **k):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*a, **k)

        return call


def test_a_step_in_the_spare_arena_is_admitted_and_started_in_one_core_call(backend, monkeypatch):
    """A Guaranteed step submitted after the last one ended runs in that step's arena (the
    spare: the same pool block, nothing allocated) and is admitted and started by one core
    call, on the CUDA path (fake events) with its end events reused. A call of another
    size gives the spare back to the pool first; close() gives it back too."""
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, gather = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    table = gpk.asarray(rng.standard_normal((10, 4)).astype(np.float32))
    idx = gpk.asarray(rng.integers(0, 10, 3))
    want = mlp(x, w).to_numpy()  # the direct call's result
    monkeypatch.setattr(backend, "stream", None, raising=False)
    in_use = backend.pool_stats()["in_use_bytes"]
    allocs = []
    real_alloc = backend.alloc_arena
    monkeypatch.setattr(backend, "alloc_arena", lambda n: allocs.append(n) or real_alloc(n))
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    spy = sched._core = _CoreSpy(sched._core)
    try:
        arenas, events = [], []
        for _ in range(6):
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
            assert t.state == "running"  # launched on this thread at submission
            arenas.append(t.arena)
            events.append(dev._unwatched[-1][2][1:3])
            np.testing.assert_allclose(t.result().to_numpy(), want, rtol=1e-6)
            assert t.arena is None and sched.stats()["arena_bytes_spare"] > 0
        assert len(allocs) == 1 and all(a is arenas[0] for a in arenas)
        assert all(e[0] is events[0][0] and e[1] is events[0][1] for e in events[1:])
        # The first took the general path (no spare yet); the rest one call each.
        assert spy.calls["submit_start"] == 6 and spy.calls["pick_and_start"] == 1
        assert "pick_next" not in spy.calls and "start" not in spy.calls
        st = sched.stats()
        assert st["launches"]["launched"] == st["completed"] == st["started"] == 6
        assert st["reserved_bytes"] == 0 and not st["tasks"]
        # Another size: the spare goes back before the pool is asked for the new arena.
        g = sched.submit(gather, table, idx, qos="guaranteed", tenant="g")
        np.testing.assert_allclose(g.result().to_numpy(), table.to_numpy()[idx.to_numpy()] + 1.0,
                                   rtol=1e-6)  # fmt: skip
        assert allocs == [allocs[0], g.stats()["arena_bytes"]] and allocs[0] != allocs[1]
        assert sched.stats()["arena_bytes_spare"] == allocs[1]
    finally:
        sched.close(timeout=60)
    assert sched.stats()["arena_bytes_spare"] == 0
    del t, g
    _reserved_zero(sched, backend, in_use)


def test_an_ended_task_and_its_result_are_freed_without_the_garbage_collector(backend, monkeypatch):
    """The CUDA path (fake events) keeps a wait closure on the task that refers back to
    it: once the task ends nothing may keep that cycle, or every step leaves garbage for
    the collector (a pause every few dozen steps of a closed-loop client) and its result's
    device block lives on until a collection."""
    import weakref

    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    monkeypatch.setattr(backend, "stream", None, raising=False)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    gc.disable()
    try:
        for qos in ("guaranteed", "best_effort"):
            refs = []
            for _ in range(3):
                t = sched.submit(mlp, x, w, qos=qos, tenant="g")
                y = t.result(60)
                np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-6)
                refs.append((weakref.ref(t), weakref.ref(y)))
                del t, y
            # The fake events name the task they were last recorded for, and a
            # Guaranteed step's pair is reused by the next step: the last may be held.
            assert all(a() is None and b() is None for a, b in refs[:-1]), qos
    finally:
        gc.enable()
        sched.close(timeout=60)


def test_best_effort_between_steps_leaves_the_guaranteed_spare(backend, monkeypatch):
    """Best-effort tasks of another arena size admitted, run and ended between a
    Guaranteed tenant's steps (a GEMM flood beside a paced decode loop) take and keep
    their own lane's spare: every step after the first still runs in the arena its
    program ran in, admitted and started at submission (with one spare for both, each
    best-effort admission gave the step's back to the pool and each step allocated anew)."""
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, gather = _fns()
    xh, wh = _data(rng)
    x, w = gpk.asarray(xh), gpk.asarray(wh)
    th = rng.standard_normal((10, 4)).astype(np.float32)
    ih = rng.integers(0, 10, 3)
    table, idx = gpk.asarray(th), gpk.asarray(ih)
    h = xh.astype(np.float64) @ wh
    want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2.0))) * 2.0
    mlp(x, w), gather(table, idx)  # traced and planned (their constants) before counting
    monkeypatch.setattr(backend, "stream", None, raising=False)
    in_use = backend.pool_stats()["in_use_bytes"]
    allocs = []
    real_alloc = backend.alloc_arena
    monkeypatch.setattr(backend, "alloc_arena", lambda n: allocs.append(n) or real_alloc(n))
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False, min_idle_ms=0.0)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    spy = sched._core = _CoreSpy(sched._core)
    try:
        arenas = []
        for _ in range(6):
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
            assert t.state == "running"  # launched on this thread at submission
            arenas.append(t.arena)
            np.testing.assert_allclose(t.result().to_numpy(), want, rtol=1e-4, atol=1e-4)
            b = sched.submit(gather, table, idx, qos="best_effort", tenant="be")
            np.testing.assert_allclose(b.result(timeout=60).to_numpy(),
                                       th.astype(np.float64)[ih] + 1.0, rtol=1e-6)  # fmt: skip
        # One arena of each size: each lane's spare served its own tasks.
        assert len(allocs) == 2 and allocs[0] != allocs[1]
        assert all(a is arenas[0] for a in arenas)
        assert spy.calls["submit_start"] == 12
        st = sched.stats()
        assert st["completed"] == 12 and st["tenants"]["be"]["completed"] == 6
        assert st["arena_bytes_spare"] == sum(allocs)
    finally:
        sched.close(timeout=60)
    assert sched.stats()["arena_bytes_spare"] == 0
    del t, b
    _reserved_zero(sched, backend, in_use)


def test_steps_in_the_spare_arena_run_as_direct_calls_and_keep_their_results(backend, monkeypatch):
    """A Guaranteed step launched at submission in the arena its program already runs in
    (the spare, step after step) takes the direct call's run: its result is written into
    a fresh block, not copied out of the arena. Every result stays the caller's: all of
    them kept, each still matches its own input after the later steps ran."""
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    xs = [gpk.asarray(_data(rng)[0]) for _ in range(8)]
    w = gpk.asarray(_data(rng)[1])
    mlp(xs[0], w)  # traced and planned
    prog = next(iter(mlp._cache.values())).program
    copied = []  # per program call: whether its outputs were copied out of the arena
    real_call = prog.call

    def call(args, externals, fresh, same=False, bind_outputs=True):
        copied.append(not bind_outputs)
        return real_call(args, externals, fresh, same, bind_outputs)

    monkeypatch.setattr(prog, "call", call)
    monkeypatch.setattr(backend, "stream", None, raising=False)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    try:
        ys = []
        for x in xs:
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
            ys.append(t.result())
        # The first step binds the new arena (outputs copied out); the rest run in it.
        assert copied == [True] + [False] * (len(xs) - 1)
    finally:
        sched.close(timeout=60)
    wd = w.to_numpy().astype(np.float64)
    for x, y in zip(xs, ys, strict=True):
        h = x.to_numpy().astype(np.float64) @ wd
        ref = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h**3))) * 2.0
        np.testing.assert_allclose(y.to_numpy(), ref, rtol=2e-3, atol=2e-3)


def test_a_waiter_ended_step_is_told_to_the_core_after_the_next_launch(backend, monkeypatch):
    """A Guaranteed step ended by its waiter (CUDA path, fake events) with nothing else
    waiting has its result at once and its arena kept as the spare; the core hears of
    the end from the next submission after that one is launched, or from stats(). With
    memory for one step only, the next step is still admitted (its submission tells the
    core first), never rejected for the reservation of a step that has ended."""
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    monkeypatch.setattr(backend, "stream", None, raising=False)
    for memory in (64 * MIB, mlp.reservation_bytes(x, w)):
        sched = gpk.Scheduler(memory=memory, simulate=False)
        dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
        _fake_cuda(dev, {})
        sched._device = dev
        spy = sched._core = _CoreSpy(sched._core)
        try:
            for k in range(4):
                t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
                # The last step's end was told once this one was on the device.
                assert spy.calls.get("complete", 0) == k
                np.testing.assert_allclose(t.result().to_numpy(), want, rtol=1e-6)
                assert t.state == "done" and t.arena is None and t.gpu_ms is not None
                assert spy.calls.get("complete", 0) == k, "told before the next step"
            st = sched.stats()  # tells the last one
            assert spy.calls["complete"] == 4 and st["completed"] == 4
            assert st["reserved_bytes"] == 0 and st["rejected"] == 0 and not st["tasks"]
            assert t.stats()["state"] == "done" and t.stats()["latency_ms"] is not None
        finally:
            sched.close(timeout=60)


def test_submit_arguments_are_checked_once_per_set_and_reservations_follow_shapes(backend):
    """submit() keeps its own arguments checked per distinct set (value and type: a
    bool priority stays refused after the int 1 was accepted), and each call's
    reservation follows its arguments' shapes and dtypes (the compiled function's
    cache), so a step of another shape reserves and returns what that shape needs."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    small = [gpk.asarray(a) for a in _data(rng, m=4)]
    large = [gpk.asarray(a) for a in _data(rng, m=64)]
    wide = [gpk.asarray(a.astype(np.float64)) for a in _data(rng, m=4)]
    with gpk.Scheduler(memory=64 * MIB) as sched:
        sizes = []
        for args in (small, large, small, wide):
            t = sched.submit(mlp, *args, qos="guaranteed", priority=1, bandwidth=0.3)
            x, w = (a.to_numpy().astype(np.float64) for a in args)
            h = x @ w
            gelu = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
            np.testing.assert_allclose(t.result(10).to_numpy(), gelu * 2.0, rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
            assert t.stats()["reservation_bytes"] == mlp.reservation_bytes(*args)
            sizes.append(t.stats()["reservation_bytes"])
        assert sizes[0] == sizes[2] and len({sizes[0], sizes[1], sizes[3]}) == 3
        assert len(sched._checked) == 1  # one set of submit arguments, checked once
        with pytest.raises(TypeError, match="priority"):
            sched.submit(mlp, *small, qos="guaranteed", priority=True, bandwidth=0.3)
        with pytest.raises(ValueError, match="qos"):
            sched.submit(mlp, *small, qos="urgent")


def test_submit_options_left_out_and_given_are_checked_apart(backend):
    """submit() keeps the options a closed-loop client leaves out (deadline, sim_ms,
    memory, policy) under a shorter key than a set that gives any: a set giving them is
    checked as given (a memory below the need is refused, policy stands for qos) even
    after the same other options were kept without them, and the steps' results are
    right either way."""
    rng = np.random.default_rng()
    mlp, _ = _fns()
    args = [gpk.asarray(a) for a in _data(rng, m=4)]
    x, w = (a.to_numpy().astype(np.float64) for a in args)
    h = x @ w
    want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2.0))) * 2.0
    need = mlp.reservation_bytes(*args)
    with gpk.Scheduler(memory=64 * MIB) as sched:
        plain = dict(qos="guaranteed", bandwidth=0.3, tenant="g")
        given = [dict(plain, deadline=5.0), dict(plain, memory=need + 4096),
                 dict(bandwidth=0.3, tenant="g", policy="guaranteed"),
                 dict(plain, sim_ms=0.01)]  # fmt: skip
        for opts in [plain] + given + [plain]:
            t = sched.submit(mlp, *args, **opts)
            np.testing.assert_allclose(t.result(10).to_numpy(), want, rtol=1e-4, atol=1e-5)
            assert t.stats()["qos"] == "guaranteed"
            if "memory" in opts:
                assert t.stats()["reservation_bytes"] == need + 4096
        assert len(sched._checked) == 1 + len(given)
        with pytest.raises(ValueError, match="less than"):
            sched.submit(mlp, *args, **dict(plain, memory=1))
        with pytest.raises(ValueError, match="policy"):
            sched.submit(mlp, *args, qos="guaranteed", policy="burstable")


def test_a_submission_launched_at_once_checks_its_arguments_once(backend, monkeypatch):
    """Reserving and launching a step at submission matches its arguments against the
    compiled function's guard once (reserve_matched's ticket); a ticket whose guard is
    no longer the last call's (another call came between) takes the usual full call."""
    from pygpukit.compile import function as function_mod
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    x2, w2 = (gpk.asarray(a) for a in _data(rng, m=3))
    want, want2 = mlp(x, w).to_numpy(), mlp(x2, w2).to_numpy()
    # The hook alone: a stale ticket still runs the call it was made for.
    mlp(x, w), mlp.reservation(x, w)  # the last call's guard, its reservation known
    res, ticket = mlp.reserve_matched((x, w), {})
    assert ticket is not None and res == mlp.reservation(x, w)
    arena = backend.alloc_arena(res.arena_bytes)
    mlp(x2, w2)  # another signature: the guard the ticket names is gone
    got = mlp.call_in_matched(ticket, arena, (x, w), {})
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6)
    del got
    arena.release()
    matches = []
    real_match = function_mod._Guard.match
    monkeypatch.setattr(function_mod._Guard, "match",
                        lambda g, a, k: matches.append(1) or real_match(g, a, k))  # fmt: skip
    monkeypatch.setattr(backend, "stream", None, raising=False)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    try:
        steps = [((x, w), want)] * 3 + [((x2, w2), want2)] * 3
        for k, (args, ref) in enumerate(steps):
            n = len(matches)
            t = sched.submit(mlp, *args, qos="guaranteed", bandwidth=0.3, tenant="g")
            assert t.state == "running"  # launched at submission
            np.testing.assert_allclose(t.result().to_numpy(), ref, rtol=1e-6)
            if k % 3:  # the same arguments as the last step: the guard hits, checked once
                assert len(matches) - n == 1, k
    finally:
        sched.close(timeout=60)


def test_closed_loop_steps_next_to_held_best_effort_cost_two_core_calls_and_no_wakeup(
        backend, monkeypatch):  # fmt: skip
    """A Guaranteed closed loop (CUDA path, fake events) next to best-effort work held
    for it: each step is one core call to admit and start it and one, by the thread
    waiting for it, to end it (which says nothing was freed: the rest of the end is
    booked after the next launch); the dispatcher, waiting in the core, is not woken
    meanwhile (not for the tenant's moving idle time, not to sweep the step in flight
    its waiter ends). Once the tenant goes idle the core wakes it to start the held
    work, which ends with the right results."""
    from pygpukit.scheduler import device as device_mod
    from pygpukit.scheduler import scheduler as sched_mod
    from pygpukit.scheduler.device import CudaDevice

    rng = np.random.default_rng()
    mlp, _ = _fns()
    x, w = (gpk.asarray(a) for a in _data(rng))
    want = mlp(x, w).to_numpy()
    monkeypatch.setattr(backend, "stream", None, raising=False)
    monkeypatch.setattr(sched_mod, "IDLE_WAIT_MS", 3.6e6)  # no backstop wake-ups
    monkeypatch.setattr(device_mod, "SWEEP_MS", 0.0)  # a sweep would be due at once
    # The tenant counts as idle 5 s after its last step: held work then starts. (0.5 s let
    # a stall of a loaded host between two steps release the held work mid-loop.)
    sched = gpk.Scheduler(memory=64 * MIB, simulate=False, min_idle_ms=5000.0)
    dev = CudaDevice(backend, sched._on_done, sched_mod._EXEC_LOCK, sched._on_done_waiter)
    _fake_cuda(dev, {})
    sched._device = dev
    try:
        for _ in range(3):  # the tenant shows its rate; the spare arena is made
            sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g").result()
        bes = [sched.submit(mlp, x, w, qos="best_effort", tenant="be") for _ in range(3)]
        assert [t.state for t in bes] == ["admitted"] * 3
        sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g").result()
        spy = sched._core = _CoreSpy(sched._core)
        wakeups = sched._wakeups
        for _ in range(30):
            t = sched.submit(mlp, x, w, qos="guaranteed", bandwidth=0.3, tenant="g")
            assert t.state == "running"  # launched at submission
            np.testing.assert_allclose(t.result().to_numpy(), want, rtol=1e-6)
            assert t.state == "done" and not dev.unreported()
        assert spy.calls == {"submit_start": 30, "complete_waited": 30}, spy.calls
        assert sched._wakeups == wakeups, "the dispatcher woke during the steps"
        assert [t.state for t in bes] == ["admitted"] * 3
        for t in bes:  # released by the dispatcher once the tenant is idle
            np.testing.assert_allclose(t.result(60).to_numpy(), want, rtol=1e-6)
        st = sched.stats()
        assert st["dispatcher_wakeups"] > wakeups and st["completed"] == 37
        assert st["tenants"]["be"]["held_tasks"] == 3 and st["reserved_bytes"] == 0
    finally:
        sched.close(timeout=60)
    assert not sched._thread.is_alive()
    _reserved_zero(sched, backend, 1 << 62)
