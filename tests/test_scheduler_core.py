"""The Rust scheduler core from Python: admission, lifecycle, pacing, stats."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygpukit._rust import SchedulerCore

MIB = 1 << 20


def test_admit_queue_then_admit_on_completion():
    s = SchedulerCore(100 * MIB)
    a, status, reason, others = s.submit("a", 60 * MIB, now=0.0)
    assert (status, reason, others) == ("admitted", None, [])
    b, status, _, _ = s.submit("b", 50 * MIB, now=0.0, qos="best_effort")
    assert status == "queued"
    c, status, _, _ = s.submit("c", 30 * MIB, now=0.0, priority=5)
    assert status == "admitted"
    assert s.queue_order() == [b]
    assert s.state(b) == "queued"
    assert s.start(a, 0.0) == 0
    assert s.state(a) == "running"
    assert s.complete(a, 2.5, 3.0) == [b]
    assert s.state(b) == "admitted"
    st_ = s.stats()
    assert st_["reserved_bytes"] == 80 * MIB
    assert (st_["admitted"], st_["queued"], st_["completed"]) == (3, 1, 1)
    assert st_["tasks"][b] == {
        "tenant": "b",
        "partition": "default",
        "qos": "best_effort",
        "state": "admitted",
        "reservation_bytes": 50 * MIB,
    }
    assert st_["tenants"]["a"]["gpu_time_ms"] == 2.5


def test_guaranteed_and_partition_rejections_carry_reasons():
    s = SchedulerCore(100 * MIB)
    s.add_partition("small", 20 * MIB, bandwidth_share=0.5, stream_priority=-3)
    _, status, reason, _ = s.submit("t", 30 * MIB, now=0.0, partition="small")
    assert status == "rejected" and "quota of partition" in reason
    _, status, reason, _ = s.submit("t", 1, now=0.0, partition="nope")
    assert status == "rejected" and "unknown partition" in reason
    g, status, _, _ = s.submit("g", 90 * MIB, now=0.0, qos="guaranteed", bandwidth_share=0.4)
    assert status == "admitted"
    g2, status, reason, _ = s.submit("g2", 20 * MIB, now=0.0, qos="guaranteed", bandwidth_share=0.4)
    assert status == "rejected" and "free memory" in reason
    with pytest.raises(KeyError):
        s.state(g2)
    _, status, reason, _ = s.submit("g3", 1, now=0.0, qos="guaranteed", bandwidth_share=0.7)
    assert status == "rejected" and "bandwidth" in reason
    t, status, _, _ = s.submit("t", 10 * MIB, now=0.0, partition="small")
    assert status == "admitted"
    assert s.stats()["partitions"]["small"] == {
        "memory_quota_bytes": 20 * MIB,
        "reserved_bytes": 10 * MIB,
        "bandwidth_share": 0.5,
        "stream_priority": -3,
    }
    # A waiting Guaranteed tenant within its share goes first.
    with pytest.raises(RuntimeError, match="another task starts"):
        s.start(t, 0.0)
    assert s.pick_next(0.0) == g
    assert s.start(g, 0.0) == 0
    assert s.start(t, 0.0) == -3
    assert s.stats()["rejected"] == 4


def test_invalid_transitions_and_arguments_raise():
    s = SchedulerCore(10 * MIB)
    a, *_ = s.submit("a", 8 * MIB, now=0.0)
    b, status, *_ = s.submit("b", 8 * MIB, now=0.0)
    assert status == "queued"
    with pytest.raises(RuntimeError, match="queued"):
        s.start(b, 0.0)
    with pytest.raises(RuntimeError, match="admitted"):
        s.complete(a, 1.0, 1.0)
    s.start(a, 0.0)
    with pytest.raises(RuntimeError, match="running"):
        s.cancel(a)
    with pytest.raises(ValueError):
        s.complete(a, -1.0, 1.0)
    assert s.fail(a, 1.0, 1.0) == [b]
    with pytest.raises(KeyError, match="already ended"):
        s.complete(a, 1.0, 2.0)
    with pytest.raises(KeyError, match="unknown"):
        s.cancel(12345)
    with pytest.raises(ValueError, match="qos"):
        s.submit("c", 1, now=0.0, qos="platinum")
    with pytest.raises(ValueError):
        s.submit("c", -1, now=0.0)
    with pytest.raises(ValueError):
        s.submit("c", 1, now=0.0, bandwidth_share=2.0)
    with pytest.raises(ValueError):
        s.add_partition("default", 1)
    with pytest.raises(ValueError):
        SchedulerCore(1, burst_ms=0.0)
    assert s.stats()["failed"] == 1


def test_throttled_tenant_waits_until_its_bucket_refills():
    s = SchedulerCore(100 * MIB, burst_ms=10.0)
    a, *_ = s.submit("a", MIB, now=0.0, bandwidth_share=0.3)
    s.start(a, 0.0)
    s.complete(a, 9.0, 9.0)  # bucket 3 ms, charged 9 ms: 6 ms in debt
    a2, *_ = s.submit("a", MIB, now=9.0, bandwidth_share=0.3)
    assert s.may_start(a2, 9.0)  # alone, it may borrow the idle GPU
    b, *_ = s.submit("b", MIB, now=9.0, bandwidth_share=0.7)
    assert not s.may_start(a2, 9.0)
    assert s.next_start_time(a2, 9.0) == pytest.approx(29.0)
    with pytest.raises(RuntimeError, match="throttled"):
        s.start(a2, 10.0)
    assert s.pick_next(10.0) == b
    assert s.stats()["tenants"]["a"]["throttled_tasks"] == 1
    assert s.may_start(a2, 29.0)
    assert s.stats(29.0)["tenants"]["a"]["tokens_ms"] == pytest.approx(0.0)


@pytest.mark.parametrize("use_pick_next", [True, False])
def test_two_burstable_tenants_share_a_simulated_gpu_70_30(use_pick_next):
    rnd = random.Random(3)
    s = SchedulerCore(1 << 30, burst_ms=20.0)
    shares = {"a": 0.7, "b": 0.3}
    pending = {t: s.submit(t, MIB, now=0.0, bandwidth_share=sh)[0] for t, sh in shares.items()}
    now = 0.0
    order = list(shares)
    while now < 20_000.0:
        if use_pick_next:
            tid = s.pick_next(now)
            chosen = next((t for t, p in pending.items() if p == tid), None)
        else:
            rnd.shuffle(order)
            chosen = next((t for t in order if s.may_start(pending[t], now)), None)
        if chosen is None:
            now = min(t for p in pending.values() if (t := s.next_start_time(p, now)) is not None)
            continue
        s.start(pending[chosen], now)
        d = rnd.uniform(0.2, 5.0)
        now += d
        s.complete(pending[chosen], d, now)
        pending[chosen] = s.submit(chosen, MIB, now=now, bandwidth_share=shares[chosen])[0]
    tenants = s.stats(now)["tenants"]
    total = sum(t["gpu_time_ms"] for t in tenants.values())
    assert tenants["a"]["gpu_time_ms"] / total == pytest.approx(0.7, abs=0.05)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "start", "complete", "fail", "cancel"]),
            st.integers(0, 700),
            st.sampled_from(["guaranteed", "burstable", "best_effort"]),
            st.integers(0, 3),
        ),
        max_size=80,
    )
)
def test_reservations_match_live_tasks_for_random_operations(ops):
    cap = 1000
    s = SchedulerCore(cap)
    s.add_partition("p", 500, bandwidth_share=0.5)
    res: dict[int, int] = {}  # task -> bytes for every live task
    now = 0.0
    for kind, n, qos, tenant in ops:
        now += 1.0
        live = sorted(res)
        pick = live[n % len(live)] if live else None
        if kind == "submit":
            tid, status, reason, _ = s.submit(
                f"t{tenant}",
                n,
                now=now,
                qos=qos,
                partition="p" if tenant % 2 else "default",
                bandwidth_share=0.2,
            )
            if status == "rejected":
                assert reason
            else:
                assert not (qos == "guaranteed" and status == "queued")
                res[tid] = n
        elif pick is not None:
            state = s.state(pick)
            try:
                if kind == "start":
                    s.start(pick, now)
                elif kind in ("complete", "fail"):
                    getattr(s, kind)(pick, 0.5, now)
                    del res[pick]
                else:
                    s.cancel(pick)
                    del res[pick]
            except RuntimeError:
                valid_from = {
                    "start": ("admitted",),
                    "complete": ("running",),
                    "fail": ("running",),
                    "cancel": ("queued", "admitted"),
                }[kind]
                # Refused: the task was in the wrong state, or pacing held a start back.
                assert state not in valid_from or kind == "start"
        stats = s.stats()
        held = sum(b for t, b in res.items() if stats["tasks"][t]["state"] != "queued")
        assert stats["reserved_bytes"] == held <= cap
        assert stats["partitions"]["p"]["reserved_bytes"] <= 500
        assert set(stats["tasks"]) == set(res)
    for t in sorted(res):
        if s.state(t) == "running":
            s.complete(t, 0.1, now)
    for t in sorted(res):
        try:
            s.cancel(t)
        except KeyError:
            pass  # completed above
    stats = s.stats()
    assert stats["reserved_bytes"] == 0 and stats["queue_length"] == 0 and not stats["tasks"]


def _held_best_effort(min_idle_ms: float):
    """A core with one best-effort task held for a Guaranteed tenant that has stepped
    at t = 0, 0.1, 0.2 ms (so it has a rate) and whose last step has ended."""
    s = SchedulerCore(100 * MIB, 50.0, 0.25, min_idle_ms)
    be, status, _, _ = s.submit("flood", MIB, now=0.0, qos="best_effort")
    assert status == "admitted"
    for k in range(3):
        t = 0.1 * k
        g, *_ = s.submit("decode", MIB, now=t, qos="guaranteed", bandwidth_share=0.3)
        assert s.pick_next(t) == g  # best effort waits behind it
        s.start(g, t)
        others, ready = s.complete_waited(g, 0.02, t + 0.05)
        # Once the tenant has a rate, best effort stays held: it is due again at once.
        assert others == [] and ready == (k == 0)
    return s, be


def test_dispatcher_wait_watches_the_core_without_returning_until_a_task_may_start():
    """wait_dispatcher(watch=True) sleeps in the core past the tenant's forecast idle
    times while kicks move them on, and returns "ready" only once the held best-effort
    task may start (the tenant went idle); a plain wait keeps its deadline."""
    import threading

    s, be = _held_best_effort(min_idle_ms=1e3)  # idle from t = 1000.2 on
    got = []
    # The clock starts at 500: the idle time is 500 ms (real) away, the deadline 200.
    s.arm_wait(700.0, True)
    th = threading.Thread(target=lambda: got.append(s.wait_dispatcher(500.0, 700.0, True)))
    th.start()
    for _ in range(20):  # kicks only make the waiting core plan again
        s.kick(500.0)
    th.join(60)
    assert got == ["deadline"]
    # 30 ms (real) before the idle time: the wait comes back once the task may start.
    s.arm_wait(1e9, True)
    assert s.wait_dispatcher(1000.2 - 30.0, 1e9, True) == "ready"
    assert s.pick_next(1000.2) == be
    # A plain wait does not look at the core: only its deadline ends it.
    s.arm_wait(1030.0, False)
    assert s.wait_dispatcher(1000.2, 1030.0, False) == "deadline"


def test_dispatcher_wake_ups_are_kept_from_arming_and_dropped_when_unarmed():
    """A wake-up asked for between arm_wait and wait_dispatcher is not lost (the caller
    arms under its lock, then waits without it); one asked for while no wait is armed
    (the dispatcher is looking at everything anyway) is not kept for the next wait."""
    import threading

    s, _ = _held_best_effort(min_idle_ms=1e3)
    s.arm_wait(1e9, True)
    s.wake_dispatcher()
    assert s.wait_dispatcher(10.0, 1e9, True) == "woken"
    s.wake_dispatcher()  # unarmed: dropped
    s.arm_wait(60.0, True)
    assert s.wait_dispatcher(10.0, 60.0, True) == "deadline"
    # From another thread, while it waits.
    s.arm_wait(1e9, False)
    got = []
    th = threading.Thread(target=lambda: got.append(s.wait_dispatcher(10.0, 1e9, False)))
    th.start()
    s.wake_dispatcher()
    th.join(60)
    assert got == ["woken"]
    with pytest.raises(ValueError, match="finite"):
        s.wait_dispatcher(float("nan"), 1.0, True)


def test_complete_waited_says_whether_the_end_frees_a_waiting_task():
    """The Guaranteed step's end told with complete_waited: the held best-effort task may
    start once the tenant's next arrival is forecast after its launch would end (paced
    steps), not while the tenant steps back to back."""
    s = SchedulerCore(100 * MIB, 50.0, 0.25, 0.0)
    be, *_ = s.submit("flood", MIB, now=0.0, qos="best_effort")
    for k in range(3):  # one step every 5 ms, each 0.1 ms long
        g, *_ = s.submit("decode", MIB, now=5.0 * k, qos="guaranteed", bandwidth_share=0.3)
        s.start(g, 5.0 * k)
        others, ready = s.complete_waited(g, 0.1, 5.0 * k + 0.1)
        assert others == []
    assert ready and s.pick_next(10.1) == be
