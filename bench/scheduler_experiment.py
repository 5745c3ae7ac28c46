"""Scheduler experiment: does gpk.Scheduler keep a latency-critical tenant fast next to a
flood of large GEMMs, and split GPU time between Burstable tenants as asked?

    python3 bench/scheduler_experiment.py            # GPU if there is one, else simulated
    python3 bench/scheduler_experiment.py --quick    # fewer launches

1. A decode-like Guaranteed tenant (many small compiled-graph replays): p50/p99 latency
   alone, next to a BestEffort GEMM flood without the scheduler (everything on one
   stream, in arrival order), and next to the same flood with the scheduler, with the
   flood's throughput meanwhile. On the GPU the tenant runs as a closed loop (each step
   submitted as the last result is back) and paced (one step every PERIOD_MS); alone it
   is timed both directly (call + to_numpy) and through the scheduler (submit to result,
   and with to_numpy). Target: contended p99 with the scheduler within 1.25x of solo.
   Issue #18 adds: submit to result within 15 us (p50) of the direct call to its result
   (call, then wait for the device: solo_direct_sync), and the contended p99 within
   1.25x of that direct solo p99.
2. Two Burstable tenants at 70/30, both always backlogged: the GPU-time shares they get.
   Target: within 5 points.

On the CPU backend time is simulated (each launch costs the bytes its kernels move at a
nominal bandwidth; a GPU that runs one launch at a time and cannot preempt it, as a
persistent GEMM on the H200 does not yield its SMs), so the figures are the scheduler's
decisions, not CPU speed. Results: bench/results/<device>-scheduler.json (cpu-scheduler.json
on the CPU backend), which the next run on that device overwrites.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygpukit as gpk  # noqa: E402
from pygpukit.bench.results import result_path  # noqa: E402
from pygpukit.scheduler.scheduler import _EXEC_LOCK  # noqa: E402

SIM_GBPS = 2.0  # simulated GPU bandwidth: CPU-sized tensors then cost milliseconds
FLOOD_DEPTH = 4  # GEMMs the BestEffort client keeps outstanding
TOP_UP_MS = 0.1  # how often (simulated) it tops its queue up
PERIOD_MS = 5.0  # paced Guaranteed client: one decode step every 5 ms (200 steps/s)
# The BestEffort client floods the GPU alone this long before the Guaranteed tenant starts:
# long enough for a back-to-back GEMM flood to bring the H200 to its power limit (its SM
# clock drops from 1980 to 1400-1500 MHz within ~0.1 s, and comes back only tens of ms
# after the flood is held).
FLOOD_LEAD_S = 0.5
# The scheduler's best_effort_duty in the contended rows: the flood may take this much of
# the GPU's time. Chosen before measuring, from the power the H200 showed: idle ~125 W,
# a GEMM at its 700 W cap clocked ~1440 MHz (so ~1200 W or more at 1980 MHz): 0.4 of the
# time at that and 0.6 idle averages about 550 W, under the cap.
BE_DUTY = 0.4
DUTY_SWEEP = (0.6, 0.25)  # also measured, with the work-conserving flood (1.0)
# Steps a closed-loop latency row times: ~60 us each, so 0.6 s a row. The H200's host has
# bursts of 10-20 consecutive steps slowed to 100-300 us, in the direct rows as in the
# scheduler's; with 2000 steps the p99 (the 20th largest) was one burst or none, and the
# direct solo p99 moved from 61 to 83 us between two rows minutes apart. 10,000 steps hold
# several bursts, so a row's p99 is their rate. Paced rows (one step every PERIOD_MS) take
# PACED_N.
LATENCY_N = 10_000
PACED_N = 600
# The host's own speed moves too: a fixed pure-Python loop (host_loop_us) took 38 to 81 us
# in one process on the H200's host, seconds apart, and the steps' host time with it. Rows
# timed one after another then compare two host states as much as two paths, so the
# issue's ratio (contended through the scheduler against the direct call alone) is taken
# from INTERLEAVED_ROUNDS rounds of both, LATENCY_N steps of each in all, the order
# alternating from round to round, each side's steps pooled.
INTERLEAVED_ROUNDS = 10


def percentiles(xs: list[float]) -> dict[str, Any]:
    a = np.asarray(xs, dtype=np.float64)
    return {"n": len(xs), "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}  # fmt: skip


def workloads(cuda: bool, rng: np.random.Generator) -> dict[str, Any]:
    dt = np.float16 if cuda else np.float32
    d, layers, n_big = (2048, 4, 8192) if cuda else (64, 4, 256)
    ws = [gpk.asarray((rng.standard_normal((d, d)) / np.sqrt(d)).astype(dt)) for _ in range(layers)]

    @gpk.compile
    def decode(x):
        h = x
        for w in ws:
            h = gpk.nn.gelu(h @ w) + h
        return h

    @gpk.compile
    def gemm(a, b):
        return a @ b

    x = gpk.asarray(rng.standard_normal((1, d)).astype(dt))
    a = gpk.asarray(rng.standard_normal((n_big, n_big)).astype(dt))
    b = gpk.asarray((rng.standard_normal((n_big, n_big)) / np.sqrt(n_big)).astype(dt))
    decode(x)
    gemm(a, b)  # trace, plan and warm both before timing
    gpk.synchronize()
    return {"decode": decode, "x": x, "gemm": gemm, "a": a, "b": b}


# -- simulated (CPU backend) ------------------------------------------------------------
def sim_latency(w: dict[str, Any], n: int, period: float, flood: bool, sched_on: bool) -> dict:
    """Decode arrivals every `period` simulated ms, next to (flood) a client that keeps
    FLOOD_DEPTH GEMMs outstanding. Without the scheduler: one stream, launches in
    arrival order, no pacing."""
    kw: dict[str, Any] = {"sim_gbps": SIM_GBPS}
    if not sched_on:
        kw["max_inflight"] = 1 << 30
    arrivals: list[tuple[float, Any]] = []
    gemms: list[Any] = []  # the flood's outstanding launches
    counts = {"gemms": 0}
    window = n * period
    with gpk.Scheduler(memory=1 << 34, **kw) as sched:
        g_qos, g_share = ("guaranteed", 0.3) if sched_on else ("burstable", 1.0)
        be_qos = "best_effort" if sched_on else "burstable"

        def top_up() -> None:
            gemms[:] = [t for t in gemms if not t.done()]  # finished results are dropped
            for _ in range(FLOOD_DEPTH - len(gemms)):
                gemms.append(sched.submit(w["gemm"], w["a"], w["b"], qos=be_qos, tenant="gemm"))
                counts["gemms"] += 1
            if sched.now() < window:
                sched.at(sched.now() + TOP_UP_MS, top_up)

        with sched.paused():
            if flood:
                sched.at(0.0, top_up)
            for k in range(n):
                t0 = 1.0 + k * period

                def arrive(t0: float = t0) -> None:
                    t = sched.submit(w["decode"], w["x"], qos=g_qos, bandwidth=g_share,
                                     tenant="decode")  # fmt: skip
                    arrivals.append((t0, t))

                sched.at(t0, arrive)
        while len(arrivals) < n:
            time.sleep(0.01)
        for _, t in arrivals:
            t.result()
        for t in list(gemms):
            t.result()
        st = sched.stats()
    out = percentiles([t.finished_ms - t0 for t0, t in arrivals])
    out["decode_gpu_ms"] = arrivals[0][1].gpu_ms
    gemm_ms = st["tenants"].get("gemm", {}).get("gpu_time_ms", 0.0)
    out["gemms"] = counts["gemms"]
    out["gemm_gpu_ms"] = gemm_ms / counts["gemms"] if counts["gemms"] else None
    out["gemm_gpu_fraction"] = gemm_ms / st["now_ms"] if st["now_ms"] else None
    out["throttled"] = st["throttled"]
    out["held_for_guaranteed"] = st.get("held_for_guaranteed")
    return out


def sim_shares(w: dict[str, Any], n: int) -> dict:
    with gpk.Scheduler(memory=1 << 34, sim_gbps=SIM_GBPS, burst_ms=20.0) as sched:
        with sched.paused():
            tasks: list[Any] = [
                sched.submit(w["gemm"] if name == "a" else w["decode"],
                             *((w["a"], w["b"]) if name == "a" else (w["x"],)),
                             tenant=name, bandwidth=share)
                for _ in range(n) for name, share in (("a", 0.7), ("b", 0.3))
            ]  # fmt: skip
        for t in tasks:
            t.result()
    # While both were backlogged: up to the time the first tenant ran out of work.
    end = min(max(t.finished_ms for t in tasks if t.tenant == m) for m in "ab")
    got = {m: sum(t.gpu_ms for t in tasks if t.tenant == m and t.finished_ms <= end)
           for m in "ab"}  # fmt: skip
    return {"window_ms": end, "share_a": got["a"] / sum(got.values()),
            "share_b": got["b"] / sum(got.values())}  # fmt: skip


# -- measured (CUDA backend) ------------------------------------------------------------
WARMUP = 10  # Guaranteed steps before timing: the core learns the tenant's arrival gaps


def _flood_thread(stop: threading.Event, fn: Any) -> threading.Thread:
    t = threading.Thread(target=lambda: [fn() for _ in iter(stop.is_set, True)], daemon=True)
    t.start()
    return t


def _wait_until(t: float) -> None:
    """Sleep to just before t, then spin: time.sleep alone overshoots by ~0.1 ms."""
    left = t - time.perf_counter()
    if left > 3e-4:
        time.sleep(left - 3e-4)
    while time.perf_counter() < t:
        pass


def gpu_direct_sync(w: dict[str, Any], n: int, keep: bool = False) -> dict:
    """The direct compiled call to its result on the GPU (call, then wait for the device):
    what submit-to-result is compared with. keep: the steps' times in "latencies_ms"."""
    lat = []
    for k in range(WARMUP + n):
        t0 = time.perf_counter()
        with _EXEC_LOCK:
            w["decode"](w["x"])
        gpk.synchronize()
        if k >= WARMUP:
            lat.append((time.perf_counter() - t0) * 1e3)
    out = percentiles(lat)
    if keep:
        out["latencies_ms"] = lat
    return out


def host_loop_us() -> float:
    """The host's speed now: the median time of a fixed pure-Python loop (us)."""
    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        sum(range(3000))
        ts.append(time.perf_counter() - t0)
    return float(np.percentile(ts, 50)) * 1e6


def gpu_interleaved(w: dict[str, Any], rounds: int, n: int) -> dict:
    """The direct solo call and the contended Guaranteed tenant through the scheduler
    (BestEffort flood at BE_DUTY), n steps each per round, alternating which goes first;
    each side's steps pooled over the rounds. p99_ratio: the pooled contended p99 over the
    pooled direct p99 (issue #18's target)."""
    direct: list[float] = []
    cont: list[float] = []
    per_round = []
    for r in range(rounds):
        row: dict[str, Any] = {}
        for side in ("direct", "contended") if r % 2 == 0 else ("contended", "direct"):
            time.sleep(0.1)  # the GPU's clock back up after the flood before either side
            row[f"{side}_host_loop_us"] = host_loop_us()
            if side == "direct":
                got = gpu_direct_sync(w, n, keep=True)
                direct += got.pop("latencies_ms")
            else:
                got = gpu_sched(w, n, True, duty=BE_DUTY, keep=True)
                cont += got.pop("latencies_ms")
                row["contended_submit_p50_ms"] = got["submit_p50_ms"]
            row[f"{side}_p50_ms"], row[f"{side}_p99_ms"] = got["p50_ms"], got["p99_ms"]
        row["p99_ratio"] = row["contended_p99_ms"] / row["direct_p99_ms"]
        per_round.append(row)
    d, c = percentiles(direct), percentiles(cont)
    return {"rounds": rounds, "steps_per_round": n, "best_effort_duty": BE_DUTY,
            "direct": d, "contended": c, "p99_ratio": c["p99_ms"] / d["p99_ms"],
            "p50_added_us": (c["p50_ms"] - d["p50_ms"]) * 1e3,
            "round_p99_ratio_median": float(np.median([x["p99_ratio"] for x in per_round])),
            "per_round": per_round}  # fmt: skip


def gpu_direct(w: dict[str, Any], n: int, contended: bool) -> dict:
    stop = threading.Event()

    def gemm() -> None:
        with _EXEC_LOCK:
            w["gemm"](w["a"], w["b"])
        time.sleep(0)

    th = _flood_thread(stop, gemm) if contended else None
    time.sleep(0.2 if contended else 0)
    lat = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            with _EXEC_LOCK:
                y = w["decode"](w["x"])
            y.to_numpy()  # waits for the result (behind whatever the stream holds)
            lat.append((time.perf_counter() - t0) * 1e3)
    finally:
        stop.set()
        if th is not None:
            th.join()
        gpk.synchronize()
    return percentiles(lat)


def _reservation_ms(w: dict[str, Any]) -> float:
    """What submit spends asking the compiled function for its reservation."""
    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        w["decode"].reservation(w["x"])
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.percentile(ts, 50))


def _nvml() -> Any:
    """NVML's handle for device 0 (pynvml), or None where it is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no pynvml, no NVML: clocks are not reported
        return None


_NVML: list[Any] = []


def sm_clock() -> dict[str, Any] | None:
    """The GPU's SM clock (MHz) now and why it is held down (NVML's throttle reasons:
    0x4 is the software power cap), or None without NVML."""
    if not _NVML:
        _NVML.append(_nvml())
    h = _NVML[0]
    if h is None:
        return None
    import pynvml

    return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "reasons": hex(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))}  # fmt: skip


def gpu_sched(w: dict[str, Any], n: int, contended: bool, period_ms: float | None = None,
              to_numpy: bool = False, duty: float = 1.0, keep: bool = False) -> dict:  # fmt: skip
    """Guaranteed decode steps through the scheduler, next to (contended) a BestEffort
    client keeping 4 GEMMs submitted, alone on the GPU for FLOOD_LEAD_S first. period_ms
    None: a closed loop (each step submitted as the last result is back); else one step
    every period_ms. Latency: submit to result() (to_numpy: and its values on the host).
    duty: the scheduler's best_effort_duty. keep: the steps' times in "latencies_ms"."""
    with gpk.Scheduler(memory=8 << 30, best_effort_duty=duty) as sched:
        stop = threading.Event()
        outstanding: list[Any] = []
        feed_wakeups = [0]

        def feed() -> None:
            # Blocks on its oldest GEMM (a native wait, without the GIL) rather than
            # polling, as a client waiting for results would: while the Guaranteed tenant
            # keeps its GEMMs held, this thread sleeps. No timeout: once that tenant
            # stops (and `stop` is set), its held GEMMs run within min_idle_ms and wake it.
            while not stop.is_set():
                outstanding[:] = [t for t in outstanding if not t.done()]
                while len(outstanding) < 4:
                    outstanding.append(sched.submit(w["gemm"], w["a"], w["b"],
                                                    qos="best_effort", tenant="gemm"))  # fmt: skip
                try:
                    outstanding[0].result()
                except CancelledError:
                    pass
                feed_wakeups[0] += 1

        submit_ms: list[float] = []
        wait_ms: list[float] = []
        gpu_ms: list[float] = []

        def step() -> None:
            t0 = time.perf_counter()
            task = sched.submit(w["decode"], w["x"], qos="guaranteed", bandwidth=0.3,
                                tenant="decode")  # fmt: skip
            t1 = time.perf_counter()
            submit_ms.append((t1 - t0) * 1e3)  # admission and launch
            y = task.result()
            wait_ms.append((time.perf_counter() - t1) * 1e3)  # the launch's end, the result
            gpu_ms.append(float(task.gpu_ms or 0.0))  # its kernels' time, from its events
            if to_numpy:
                y.to_numpy()

        th = _flood_thread(stop, feed) if contended else None
        lead: dict[str, Any] = {}
        if contended:  # the flood alone: what the duty limit leaves it
            time.sleep(0.05)
            c0, t0 = sched.stats()["tenants"].get("gemm", {}).get("completed", 0), time.time()
            time.sleep(FLOOD_LEAD_S - 0.05)
            c1, t1 = sched.stats()["tenants"].get("gemm", {}).get("completed", 0), time.time()
            lead = {"gemms_per_s": (c1 - c0) / (t1 - t0), "clock": sm_clock()}
        lat = []
        be0: dict[str, Any] = {}
        t_start = t_end = 0.0
        wake0 = feed0 = wake1 = feed1 = 0
        st0: dict[str, Any] = {}
        st1: dict[str, Any] = {}
        steps0: dict[str, int] = {}
        steps: dict[str, int] = {}
        clock_start = clock_end = None
        gc0: list[int] = []
        gcs: list[int] = []
        placed: dict[str, Any] = {}
        try:
            nxt = time.perf_counter()
            for k in range(WARMUP + n):
                if period_ms is not None:
                    _wait_until(nxt)
                    nxt += period_ms / 1e3
                if k == WARMUP:
                    st0 = sched.stats()
                    be0 = dict(st0["tenants"].get("gemm", {}))
                    wake0, feed0 = st0["dispatcher_wakeups"], feed_wakeups[0]
                    steps0 = st0["guaranteed_steps"]
                    gc0 = [g["collections"] for g in gc.get_stats()]
                    clock_start = sm_clock()
                    t_start = time.perf_counter()
                t0 = time.perf_counter()
                step()
                if k >= WARMUP:
                    lat.append((time.perf_counter() - t0) * 1e3)
            t_end = time.perf_counter()
            clock_end = sm_clock()
            feed1 = feed_wakeups[0]
            gcs = [g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)]
            st1 = sched.stats()
            be1, wake1 = dict(st1["tenants"].get("gemm", {})), st1["dispatcher_wakeups"]
            steps = {k: v - steps0[k] for k, v in st1["guaranteed_steps"].items()}
            # Where the tenant's steps ran: its arena's device address and the decode
            # program's captures (one per argument addresses) and bind misses. Rows run
            # after GEMMs through a scheduler come out slower (docs/scheduler.md): these
            # tell whether the arena moved and the graph was captured again for it.
            spare = getattr(sched, "_spare", None)
            placed = {"arena_addr": None if spare is None else hex(spare.addr),
                      "decode_replay": [{k: e["replay"].get(k) for k in ("captures", "bind_misses")}
                                        for e in w["decode"].stats()["entries"]]}  # fmt: skip
        finally:
            stop.set()
            if th is not None:
                th.join()
            sched.close(cancel=True)
        st = sched.stats()
    out = percentiles(lat)
    if keep:
        out["latencies_ms"] = lat
    # Where a step's time goes: submit (admission and launch on this thread) and the wait
    # for its end and result; how often the other threads woke meanwhile (each wake-up
    # takes the GIL from this thread at some point).
    out["submit_p50_ms"] = float(np.percentile(submit_ms[WARMUP:], 50))
    out["submit_p99_ms"] = float(np.percentile(submit_ms[WARMUP:], 99))
    out["wait_p50_ms"] = float(np.percentile(wait_ms[WARMUP:], 50))
    out["wait_p99_ms"] = float(np.percentile(wait_ms[WARMUP:], 99))
    out["gpu_p50_ms"] = float(np.percentile(gpu_ms[WARMUP:], 50))
    out["dispatcher_wakeups"] = wake1 - wake0
    # Of the dispatcher's waits in the core (without the GIL): the times it woke, found
    # every waiting task still held and slept on there, never running Python.
    out["held_rechecks"] = st1["held_rechecks"] - st0["held_rechecks"]
    # The timed steps the native on-caller step served, and those the Python path took.
    out["guaranteed_steps"] = steps
    out["gc_collections"] = gcs  # per generation, during the timed steps
    out.update(placed)
    out["best_effort_duty"] = duty
    out["sm_clock"] = [clock_start, clock_end]  # at the window's start and end
    if contended:
        out["flood_wakeups"] = feed1 - feed0
    window_ms = (t_end - t_start) * 1e3
    out.update({"period_ms": period_ms, "warmup": WARMUP, "window_ms": window_ms,
                "throttled": st["throttled"],
                "held_for_guaranteed": st.get("held_for_guaranteed"),
                "decode_gap_ms": st["tenants"]["decode"].get("guaranteed_gap_ms")})  # fmt: skip
    # The core's holds during the timed steps (the totals above include the flood's lead).
    out["held_for_guaranteed_window"] = st1["held_for_guaranteed"] - st0["held_for_guaranteed"]
    if contended:
        done = be1.get("completed", 0) - be0.get("completed", 0)
        gpu = be1.get("gpu_time_ms", 0.0) - be0.get("gpu_time_ms", 0.0)
        out["best_effort"] = {"gemms_done": done, "gemms_per_s": done / window_ms * 1e3,
                              "gpu_fraction": gpu / window_ms,
                              "gemm_ms": st["tenants"]["gemm"].get("expected_ms"),
                              "alone_gemms_per_s": lead["gemms_per_s"],
                              "alone_clock": lead["clock"],
                              # in the timed window; _total: the whole run, lead included
                              "held_for_duty": st1["held_for_duty"] - st0["held_for_duty"],
                              "held_for_duty_total": st.get("held_for_duty")}  # fmt: skip
    return out


def gpu_shares(w: dict[str, Any], seconds: float) -> dict:
    with gpk.Scheduler(memory=8 << 30) as sched:
        stop = threading.Event()

        def feed(name: str, share: float) -> None:
            live: list[Any] = []
            while not stop.is_set():
                live = [t for t in live if not t.done()]
                while len(live) < 4:
                    live.append(sched.submit(w["gemm"], w["a"], w["b"], tenant=name,
                                             bandwidth=share))  # fmt: skip
                time.sleep(0.001)

        ths = [threading.Thread(target=feed, args=a, daemon=True)
               for a in (("a", 0.7), ("b", 0.3))]  # fmt: skip
        for t in ths:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ths:
            t.join()
        sched.close(cancel=True)
        tenants = sched.stats()["tenants"]
    total = tenants["a"]["gpu_time_ms"] + tenants["b"]["gpu_time_ms"]
    return {"window_s": seconds, "share_a": tenants["a"]["gpu_time_ms"] / total,
            "share_b": tenants["b"]["gpu_time_ms"] / total}  # fmt: skip


def _commit() -> str | None:
    """The commit measured ($PGK_GIT_COMMIT where the tree travels without .git)."""
    from pygpukit.bench.timing import git_commit

    return git_commit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer launches")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only-latency", action="store_true",
                    help="GPU: the solo and contended submit-to-result rows alone "
                         "(printed, not written), to compare two trees in one run")  # fmt: skip
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cuda = gpk.backend_name() == "cuda"
    w = workloads(cuda, rng)
    n = 100 if args.quick else LATENCY_N
    n_paced = 100 if args.quick else PACED_N
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res: dict[str, Any] = {"git_commit": _commit(), "command": " ".join(sys.argv),
                           "backend": gpk.backend_name(), "simulated": not cuda,
                           "host": platform.node(), "time": stamp}  # fmt: skip
    if cuda:
        from pygpukit import _native

        res["device"] = _native.device_info().get("name")
        if args.only_latency:
            rows = {"solo_direct_sync": gpu_direct_sync(w, n), "solo": gpu_sched(w, n, False),
                    "interleaved": gpu_interleaved(w, INTERLEAVED_ROUNDS,
                                                   n // INTERLEAVED_ROUNDS)}  # fmt: skip
            d = rows["solo_direct_sync"]
            rows["added_p50_us"] = (rows["solo"]["p50_ms"] - d["p50_ms"]) * 1e3
            rows["p99_ratio_vs_direct_solo"] = rows["interleaved"]["p99_ratio"]
            print(json.dumps({**res, **rows}, indent=2))
            return
        res["solo_direct"] = gpu_direct(w, n, False)
        res["solo_direct_sync"] = gpu_direct_sync(w, n)
        res["reservation_p50_ms"] = _reservation_ms(w)
        res["solo"] = gpu_sched(w, n, False)
        res["solo_to_numpy"] = gpu_sched(w, n, False, to_numpy=True)
        res["contended_sched"] = gpu_sched(w, n, True, duty=BE_DUTY)
        res["contended_by_duty"] = {str(d): gpu_sched(w, n, True, duty=d) for d in DUTY_SWEEP}
        res["solo_paced"] = gpu_sched(w, n_paced, False, period_ms=PERIOD_MS)
        res["contended_paced_sched"] = gpu_sched(w, n_paced, True, period_ms=PERIOD_MS,
                                                 duty=BE_DUTY)  # fmt: skip
        # The flood work-conserving (no duty limit), last of the scheduler rows: it leaves
        # the GPU at its power limit.
        res["contended_by_duty"]["1.0"] = gpu_sched(w, n, True)
        # Each step waits behind the whole GEMM backlog (seconds): a few show it.
        res["contended_direct"] = gpu_direct(w, 5 if args.quick else 20, True)
        res["shares_70_30"] = gpu_shares(w, 3.0 if args.quick else 10.0)
        res["p99_ratio_paced"] = (res["contended_paced_sched"]["p99_ms"]
                                  / res["solo_paced"]["p99_ms"])  # fmt: skip
        direct, via = res["solo_direct_sync"], res["solo"]
        res["submit_to_result"] = {
            "p50_ms": via["p50_ms"], "p99_ms": via["p99_ms"],
            "direct_p50_ms": direct["p50_ms"], "direct_p99_ms": direct["p99_ms"],
            "added_p50_us": (via["p50_ms"] - direct["p50_ms"]) * 1e3,
            "added_p99_us": (via["p99_ms"] - direct["p99_ms"]) * 1e3}  # fmt: skip
        # Issue #18: against the tenant's direct solo p99 (call to result, no scheduler),
        # both sides interleaved (INTERLEAVED_ROUNDS); the rows above, timed one after
        # another, give the same ratio as it came out between them.
        res["interleaved"] = gpu_interleaved(w, INTERLEAVED_ROUNDS, n // INTERLEAVED_ROUNDS)
        res["p99_ratio_vs_direct_solo"] = res["interleaved"]["p99_ratio"]
        res["p99_ratio_vs_direct_solo_rows"] = (res["contended_sched"]["p99_ms"]
                                                / direct["p99_ms"])  # fmt: skip
    else:
        period = 7.0
        n = 100 if args.quick else 300  # simulated ms: no host noise to average out
        res["sim_gbps"] = SIM_GBPS
        res["solo"] = sim_latency(w, n, period, False, True)
        res["contended_direct"] = sim_latency(w, n, period, True, False)
        res["contended_sched"] = sim_latency(w, n, period, True, True)
        res["shares_70_30"] = sim_shares(w, n)
    solo, cont = res["solo"]["p99_ms"], res["contended_sched"]["p99_ms"]
    res["p99_ratio_sched"] = cont / solo
    res["p99_ratio_direct"] = res["contended_direct"]["p99_ms"] / res.get(
        "solo_direct", res["solo"])["p99_ms"]  # fmt: skip
    share_err = abs(res["shares_70_30"]["share_a"] - 0.7)
    res["targets"] = {"guaranteed_p99_within_1.25x": res["p99_ratio_sched"] <= 1.25,
                      "shares_within_5_points": share_err <= 0.05}  # fmt: skip
    if "p99_ratio_paced" in res:
        res["targets"]["paced_guaranteed_p99_within_1.25x"] = res["p99_ratio_paced"] <= 1.25
    if "submit_to_result" in res:
        res["targets"]["submit_to_result_adds_at_most_15us_p50"] = (
            res["submit_to_result"]["added_p50_us"] <= 15.0)  # fmt: skip
        res["targets"]["guaranteed_p99_within_1.25x_direct_solo"] = (
            res["p99_ratio_vs_direct_solo"] <= 1.25)  # fmt: skip
    out = args.out or result_path(res.get("device") or "cpu", "scheduler")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"wrote {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
