"""Per-kernel timing of a lowered schedule: time, bytes moved, GB/s, % of copy bandwidth;
and the replay time of the whole compiled function.

`pygpukit graph profile` runs it on the GPU with _native.Event pairs around each launch,
then times replays of the function's captured CUDA Graph (replay_profile);
PYGPUKIT_DEBUG=1 prints the same table for every lazy realize (host timers on the CPU).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from pygpukit.passes import Schedule

from .backends import get_backend

_log = logging.getLogger(__name__)


class _HostTimer:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_ms(self, end: _HostTimer) -> float:
        return (end.t - self.t) * 1e3


class _CudaTimer:
    def __init__(self) -> None:
        from pygpukit import _native

        self.ev = _native.Event(True)

    def record(self) -> None:
        self.ev.record()

    def elapsed_ms(self, end: _CudaTimer) -> float:
        end.ev.synchronize()
        return float(self.ev.elapsed_time(end.ev))


def _timer(backend: Any) -> Any:
    return _CudaTimer() if backend.name == "cuda" else _HostTimer()


def copy_bandwidth_gbs(backend: Any, nbytes: int = 64 << 20) -> float:
    """Measured device-to-device copy bandwidth (read + write bytes per second)."""
    from pygpukit.ir import dtypes

    n = nbytes // 4
    a = backend.empty((n,), dtypes.float32)
    b = backend.empty((n,), dtypes.float32)
    backend.copy_into(b, a)  # warm up
    t0, t1 = _timer(backend), _timer(backend)
    t0.record()
    for _ in range(5):
        backend.copy_into(b, a)
    t1.record()
    ms = t0.elapsed_ms(t1) / 5
    return 2 * n * 4 / (ms * 1e-3) / 1e9 if ms > 0 else float("inf")


def profile(schedule: Schedule, inputs: list[Any], repeats: int = 3,
            backend: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    """Run the schedule in a planned arena and time each kernel (best of `repeats`)."""
    from .executor import PlannedProgram

    backend = backend or get_backend()
    for hook in ("alloc_arena", "value_at", "execute", "copy_into", "capture"):
        if not hasattr(backend, hook):
            raise NotImplementedError(
                f"profile: the {backend.name} backend has no planned-execution hook {hook!r}"
            )
    prog = PlannedProgram(schedule, backend)
    prog(inputs, [])
    nodes = schedule.graph.nodes
    plan = prog.plan
    rows = []
    for k, st in prog.kernels:
        ins = [prog.values[i] for i in st.ins]
        best = math.inf
        for _ in range(repeats):
            t0, t1 = _timer(backend), _timer(backend)
            t0.record()
            backend.execute(st, ins, prog.values[st.out], k in plan.inplace)
            t1.record()
            best = min(best, t0.elapsed_ms(t1))
        moved = math.prod(st.shape) * st.dtype.itemsize
        for i in {plan.root(i) for i in st.ins}:
            moved += math.prod(nodes[i].shape) * nodes[i].dtype.itemsize
        rows.append({"step": k, "op": st.op, "loc": str(st.loc or ""), "origin": st.origin,
                     "ms": best, "bytes": moved,
                     "gbs": moved / (best * 1e-3) / 1e9 if best > 0 else 0.0})  # fmt: skip
    return rows


def format_profile(rows: list[dict[str, Any]], copy_gbs: float) -> str:
    lines = [f"{'#':>3} {'kernel':<18} {'time':>10} {'bytes':>12} {'GB/s':>9} {'%copy':>6}  where",
             f"    (copy bandwidth {copy_gbs:.1f} GB/s)"]  # fmt: skip
    total = 0.0
    for r in rows:
        total += r["ms"]
        pct = 100 * r["gbs"] / copy_gbs if copy_gbs else 0.0
        lines.append(f"{r['step']:>3} {r['op']:<18} {r['ms'] * 1e3:>8.1f}us {r['bytes']:>12,} "
                     f"{r['gbs']:>9.2f} {pct:>5.1f}%  {r['loc']}")  # fmt: skip
    lines.append(f"    total {total * 1e3:.1f}us in {len(rows)} kernels")
    return "\n".join(lines)


def time_calls(call: Callable[[], Any], calls: int = 20, reps: int = 15,
               backend: Any = None) -> float:  # fmt: skip
    """Median milliseconds per call over `reps` timings of `calls` back-to-back calls,
    a timer pair (device events on CUDA) around each timing. The host runs ahead, so the
    device time is what is measured whenever a call's host work is the shorter side."""
    backend = backend or get_backend()
    times = []
    for _ in range(max(reps, 1)):
        t0, t1 = _timer(backend), _timer(backend)
        t0.record()
        for _ in range(max(calls, 1)):
            call()
        t1.record()
        times.append(t0.elapsed_ms(t1) / max(calls, 1))
    return statistics.median(times)


def replay_profile(fn: Any, args: tuple[Any, ...], calls: int = 20, reps: int = 15,
                   warmup: int = 3, backend: Any = None) -> dict[str, Any]:  # fmt: skip
    """Median time per call of `fn` (a gpk.compile'd function) replaying its captured
    graph: `warmup` calls trace, plan and capture it, then time_calls times the replays.
    "ms" is None when no CUDA Graph was captured (the NumPy backend, or a fallback)."""
    backend = backend or get_backend()
    for _ in range(max(warmup, 2)):  # the 1st call runs eagerly and captures; the 2nd replays
        fn(*args)
    backend.synchronize()
    info = fn.stats()["entries"][0]["replay"]
    out: dict[str, Any] = {"captured": bool(info.get("captured", False)), "ms": None,
                           "calls": calls, "reps": reps, "num_nodes": info.get("num_nodes"),
                           "fallback": info.get("fallback")}  # fmt: skip
    if out["captured"]:
        out["ms"] = time_calls(lambda: fn(*args), calls, reps, backend)
    return out


def kernel_sum_ms(rows: list[dict[str, Any]]) -> float:
    return float(sum(r["ms"] for r in rows))


def format_replay(replay: dict[str, Any], kernel_ms: float, backend_name: str = "cuda") -> str:
    """The replay line under the kernel table: the median per-call replay time against the
    sum of the kernels timed one by one, or why there is no replay time."""
    if not replay.get("captured") or replay.get("ms") is None:
        why = replay.get("fallback") or f"the {backend_name} backend made no capture"
        return f"    replay: not captured as a CUDA Graph ({why}); no replay time"
    ms = float(replay["ms"])
    nodes = replay.get("num_nodes")
    graph = f"CUDA Graph of {nodes} nodes" if nodes else "CUDA Graph"
    ratio = f", {ms / kernel_ms:.2f}x" if kernel_ms > 0 else ""
    runs = f"median of {replay.get('reps')} x {replay.get('calls')} calls"
    return (f"    replay {ms * 1e3:.1f}us per call ({graph}, {runs}; "
            f"per-kernel sum {kernel_ms * 1e3:.1f}us{ratio})")  # fmt: skip


_COPY_GBS: dict[str, float] = {}


def debug_realize(schedule: Schedule, inputs: list[Any]) -> None:
    """PYGPUKIT_DEBUG=1: the profile table of one lazy realize, to the `pygpukit` logger.

    At WARNING: it was asked for, so it shows without any logging set up (Python prints
    WARNING and above on stderr then), as `pygpukit -q` hides it."""
    backend = get_backend()
    if backend.name not in _COPY_GBS:
        _COPY_GBS[backend.name] = copy_bandwidth_gbs(backend, 8 << 20)
    try:
        rows = profile(schedule, inputs, repeats=1, backend=backend)
    except NotImplementedError as e:
        _log.warning("debug: %s", e)
        return
    _log.warning("realize: %d steps\n%s", len(schedule.steps),
                 format_profile(rows, _COPY_GBS[backend.name]))  # fmt: skip
