"""gpk.Scheduler: admits compiled-graph launches against memory, paces tenants by GPU
time, and runs them. Every decision (admit, queue, reject, which task starts when) is
made by the Rust core (pygpukit._rust.SchedulerCore); this layer reserves the memory the
core admits (the graph's arena, allocated from the pool at admission), launches, measures
and reports back."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from pygpukit import errors
from pygpukit.memory import eviction_stats

from . import args as check
from .clock import Clock, SimClock, WallClock
from .device import SWEEP_MS, CudaDevice, Device, Done, HostDevice, SimDevice
from .task import Task

# Tracing and running compiled functions touch process-wide state (the runtime's
# schedule cache, a backend's current stream): one call at a time from scheduler threads.
_EXEC_LOCK = threading.RLock()

_QOS = {"guaranteed", "burstable", "best_effort"}
ENDED_KEPT = 4096  # ended tasks whose stats stats(task_id) still finds
_PARTITION_KEYS = {"memory", "bandwidth", "priority"}
FRUITLESS_WAIT_MS = 2.0  # real time: least wait after a timed wake-up that started nothing
IDLE_WAIT_MS = 500.0  # real time: the dispatcher's sleep when nothing is planned (a backstop)
DEFAULT_SIM_GBPS = 1000.0  # nominal bandwidth of the simulated GPU's cost model
# An ended task's arena up to this size is kept (not given back to the pool) for the next
# admission asking for the same bytes: the compiled program then finds the very block it
# ran in and skips re-binding its values to a new one (half of a submit's cost on the CPU),
# and the submission can be admitted and started in one core call. The cap bounds what
# allocations outside the scheduler can lose to it between two tasks.
SPARE_ARENA_MAX = 64 << 20
CHECKED_KEPT = 64  # submit() argument sets kept checked (cleared when full)
# The best-effort duty limit's window: the most best-effort GPU time that may run back to
# back is best_effort_duty times this. Short against the tens of milliseconds over which a
# GPU's power limit lowers and raises its clock, so the GPU sees the average, not bursts.
DUTY_WINDOW_MS = 10.0


def _stream_priorities(cuda: bool) -> dict[str, int]:
    if cuda:
        from pygpukit import _native

        least, greatest = _native.Stream.priority_range()
        return {"high": int(greatest), "normal": int(least), "low": int(least)}
    return {"high": -1, "normal": 0, "low": 1}  # lower is more urgent, as in CUDA


class Scheduler:
    """Runs compiled functions as scheduled workloads.

        sched = gpk.Scheduler(memory=8 << 30, partitions={
            "inference": {"memory": 6 << 30, "bandwidth": 0.7, "priority": "high"},
            "batch": {"memory": 2 << 30, "bandwidth": 0.3}})
        task = sched.submit(step, x, qos="guaranteed", bandwidth=0.5, partition="inference")
        y = task.result()

    memory: bytes reservations may take (default: the pool's quota). A partition has a
    memory quota, a share of the GPU's time, and a stream priority ("high", "normal",
    "low" or a CUDA priority). simulate: pace against simulated GPU time (default on the
    CPU backend): a task costs `sim_ms`, or the bytes its kernels move at sim_gbps.
    max_inflight: launches of non-Guaranteed work on the device at once; pacing charges
    time when a launch ends, so a deeper queue makes shares coarser and lets low-priority
    work sit in front of Guaranteed launches (BestEffort is kept to one by the core).
    guard_ms: margin the core keeps between a BestEffort launch's expected end and the next
    expected Guaranteed arrival; min_idle_ms: least silence after which a Guaranteed
    tenant counts as idle (BestEffort then runs freely), however short its usual gaps.
    best_effort_duty: the most of the GPU's time BestEffort launches may take together
    (over duty_window_ms); below 1 the GPU idles between them even with nothing else to
    run. A flood of back-to-back GEMMs holds a GPU at its power limit, at lower clocks,
    and the clock takes tens of milliseconds to come back once the flood is held, so the
    Guaranteed steps that arrive next run slower (docs/scheduler.md has the H200's figures).
    devices: schedule across these devices (`[0, 1]`, default the current one): one
    scheduler per device, each admitting against its own memory, under one view
    (submit(..., device=i) or placement on the device with room; stats() per device);
    see pygpukit/scheduler/node.py.

    A task the core lets start at submission is launched on the submitting thread (no
    hand-off to the dispatcher); when the last ended task's arena fits it (SPARE_ARENA_MAX),
    admission and start are one core call. On a high-priority lane (Guaranteed, or a "high"
    partition) no completer thread watches it either: the thread waiting in result()
    waits on its end event and ends it, so a solo submit-to-result involves no other
    thread; a task nobody waits on is ended by the next submit or by the dispatcher once
    it is SWEEP_MS old. Other lanes keep the completer, which starts what waits behind.
    """

    def __new__(cls, *args: Any, devices: Any = None, **kwargs: Any) -> Any:
        """`devices=[...]` (or a `with gpk.Device(i):` block naming a device other than the
        process's) makes a scheduler per device under one view (scheduler/node.py)."""
        if cls is Scheduler:
            from pygpukit.backends import devices as placement

            if devices is None and placement.ACTIVE[0] \
                    and placement.current_ordinal() != placement.primary_ordinal():  # fmt: skip
                devices = [placement.current_ordinal()]
            if devices is not None:
                from .node import scheduler_for

                return scheduler_for(devices, args, kwargs)
        return super().__new__(cls)

    def __init__(self, memory: int | None = None,
                 partitions: dict[str, dict[str, Any]] | None = None, *,
                 burst_ms: float = 50.0, simulate: bool | None = None,
                 sim_gbps: float = DEFAULT_SIM_GBPS, max_inflight: int = 1,
                 guard_ms: float = 0.25, min_idle_ms: float = 5.0,
                 best_effort_duty: float = 1.0, duty_window_ms: float = DUTY_WINDOW_MS,
                 devices: Any = None) -> None:  # fmt: skip
        from pygpukit import _rust
        from pygpukit.backends import get_backend

        backend: Any = get_backend()  # both backends carry their Rust pool as .pool
        self._backend = backend
        cuda = backend.name == "cuda"
        pool = backend.pool
        where = "Scheduler"
        if memory is None:
            memory = pool.quota_bytes
            if memory is None and cuda:
                from pygpukit import _native

                memory = int(_native.mem_get_info()[0])
            if memory is None:
                raise errors.GPUKitValueError("Scheduler(memory=...) is needed: the pool has "
                                              "no quota")  # fmt: skip
        self.memory = check.byte_count(where, "memory", memory)
        burst_ms = check.real(where, "burst_ms", burst_ms, 0.0, open_low=True)
        guard_ms = check.real(where, "guard_ms", guard_ms, 0.0)
        min_idle_ms = check.real(where, "min_idle_ms", min_idle_ms, 0.0)
        sim_gbps = check.real(where, "sim_gbps", sim_gbps, 0.0, open_low=True)
        max_inflight = check.at_least(where, "max_inflight", max_inflight, 1)
        best_effort_duty = check.real(where, "best_effort_duty", best_effort_duty, 0.0, 1.0,
                                      open_low=True)  # fmt: skip
        duty_window_ms = check.real(where, "duty_window_ms", duty_window_ms, 0.0, open_low=True)
        if partitions is not None and not isinstance(partitions, dict):
            raise errors.DTypeError(f"{where}: partitions must be a dict of name -> dict, got "
                                    f"{type(partitions).__name__}")  # fmt: skip
        self._core = _rust.SchedulerCore(self.memory, burst_ms, guard_ms, min_idle_ms)
        self._prio = _stream_priorities(cuda)
        self._prio_high = self._prio["high"]  # read on every start
        self._part_prio: dict[str, int] = {"default": self._prio["normal"]}
        for name, spec in (partitions or {}).items():
            check.text(where, "a partition name", name)
            part = f"{where}: partition {name!r}"
            if not isinstance(spec, dict):
                raise errors.DTypeError(f"{part} must be a dict with keys "
                                        f"{sorted(_PARTITION_KEYS)}, got {spec!r}")  # fmt: skip
            unknown = set(spec) - _PARTITION_KEYS
            if unknown:
                raise errors.GPUKitValueError(f"{part}: unknown keys {sorted(unknown)}; "
                                              f"expected {sorted(_PARTITION_KEYS)}")  # fmt: skip
            prio = spec.get("priority", "normal")
            if isinstance(prio, str):
                if prio not in self._prio:
                    raise errors.GPUKitValueError(f"{part}: priority must be 'high', 'normal', "
                                                  f"'low' or an int, got {prio!r}")  # fmt: skip
                prio = self._prio[prio]
            prio = check.int32(part, "priority", prio)
            mem = check.byte_count(part, "memory", spec.get("memory", self.memory))
            share = check.real(part, "bandwidth", spec.get("bandwidth", 1.0), 0.0, 1.0)
            # The core refuses a quota above the scheduler's memory and shares summing above 1.
            self._core.add_partition(name, mem, share, prio)
            self._part_prio[name] = prio
        self.simulated = (not cuda) if simulate is None else bool(simulate)
        self._sim_bytes_per_ms = sim_gbps * 1e6
        self._clock: Clock = SimClock() if self.simulated else WallClock()
        self._core.set_best_effort_duty(best_effort_duty, duty_window_ms, self._clock.now())
        # Entered directly (`with self._mu`) where no wait or notify follows: a Condition's
        # __enter__ is a Python call on every submit and end.
        self._mu = threading.RLock()
        self._cond = threading.Condition(self._mu)
        self._checked: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see _check_submit
        self._device: Device
        if self.simulated:
            self._device = SimDevice()
        elif cuda:
            self._device = CudaDevice(self._backend, self._on_done, _EXEC_LOCK,
                                      self._on_done_waiter)  # fmt: skip
        else:
            self._device = HostDevice(self._on_done)
        self.max_inflight = max_inflight
        self._inflight_low = 0  # started, not yet ended, tasks not on a high-priority stream
        self._pending: deque[Task] = deque()  # ended tasks whose futures are to complete
        # High-lane tasks their waiters ended (result delivered, arena kept as the spare)
        # whose end is still to be booked here, each with whether the core was told of it
        # already (told: it had work waiting), and its ended record if the native step
        # (step.rs) made it (else None); see _on_done_waiter. Never rebound: the native
        # step keeps the list.
        self._unbooked: list[tuple[Task, bool, tuple[Any, ...] | None]] = []
        self._untold = 0  # of those, the ones the core has not been told of
        self._tasks: dict[int, Task] = {}
        self._ended: OrderedDict[int, tuple[Any, ...]] = OrderedDict()  # id -> Task._record()
        self._waiting: dict[int, str] = {}  # admitted task ids, not started yet -> qos
        self._waiting_not_be = 0  # of those, the Guaranteed and Burstable ones
        # The last ended task's arena, kept (see SPARE_ARENA_MAX), one per lane: the high
        # lane's (Guaranteed, or a "high" partition; the native step's, step.rs) and the
        # others'. A best-effort GEMM ending or admitted between a paced Guaranteed
        # tenant's steps then leaves that tenant the arena its program runs in.
        self._spare: Any = None
        self._spare_bytes = -1  # the arena bytes it was allocated for
        self._spare_low: Any = None
        self._spare_low_bytes = -1
        self._paused = 0
        self._closed = False
        self._stopped: errors.SchedulerError | None = None  # set if the dispatcher died
        self._counts = {"launched": 0, "completed": 0, "failed": 0, "cancelled": 0,
                        "rejected": 0, "arena_oom": 0, "timer_errors": 0}  # fmt: skip
        # Guaranteed submissions the native step served (_native_step) and those that took
        # the Python path (no native step for their options, or a case it leaves to it).
        self._steps = {"native": 0, "python": 0}
        # Times the dispatcher thread came back from a real-time wait (and so took the GIL):
        # with a closed-loop Guaranteed client next to held best-effort work, none.
        self._wakeups = 0
        self._thread = threading.Thread(target=self._loop, name="pygpukit-scheduler", daemon=True)
        self._thread.start()

    # -- submitting -----------------------------------------------------------------------
    def submit(self, fn: Any, *args: Any, qos: str = "burstable", bandwidth: float = 1.0,
               partition: str = "default", priority: int = 0, deadline: float | None = None,
               tenant: str | None = None, sim_ms: float | None = None,
               kwargs: dict[str, Any] | None = None, memory: int | str | None = None,
               policy: str | None = None) -> Task:  # fmt: skip
        """Submit one call `fn(*args, **kwargs)` of a @gpk.compile function.

        Its reservation (the planned arena plus inputs and outputs) is admitted now (the arena
        is allocated from the pool), queued until memory frees, or refused.

        Args:
            fn: The compiled function (not one with static_outputs=True).
            *args: Its positional arguments.
            qos: "guaranteed" (admitted now or rejected; goes first), "burstable" or
                "best_effort" (held while Guaranteed work waits, runs or is expected).
            bandwidth: The tenant's share of its partition's GPU time, 0 to 1.
            partition: The partition whose memory quota and share the task draws on.
            priority: Higher first among tasks of the same QoS.
            deadline: Seconds from now; earlier first among equal QoS and priority.
            tenant: Whose share the task draws on (default: the function's name).
            sim_ms: The task's cost in simulated time (default: its traffic at sim_gbps).
            kwargs: The function's keyword arguments.
            memory: Reserve this much instead of the plan's need: bytes or a string ("512MB"
                SI, "1.5GiB" binary); not less than the need.
            policy: Another name for qos (give one of the two).

        Returns:
            The Task: a future of the call's result.

        Raises:
            AdmissionRejected: The task can never be admitted as asked, or (Guaranteed) not
                now; `.reason` says why.
            DTypeError: `fn` is not a compiled function.
            ValueError: A bad qos, share, memory or cost, or static_outputs=True.
            SchedulerError: The scheduler is closed.
        """
        key: tuple[Any, ...] | None
        try:
            # With the numbers' types: True == 1 and hashes alike, but is refused. The
            # options a closed-loop client usually leaves out make a shorter key (of
            # another length: the two kinds never collide).
            if deadline is None and sim_ms is None and memory is None and policy is None:
                key = (fn, qos, partition, bandwidth, type(bandwidth), priority,
                       type(priority), tenant, type(tenant))  # fmt: skip
            else:
                key = (fn, qos, policy, partition, bandwidth, type(bandwidth), priority,
                       type(priority), deadline, type(deadline), tenant, type(tenant),
                       sim_ms, type(sim_ms), memory, type(memory))  # fmt: skip
            checked = self._checked.get(key)
        except TypeError:  # an unhashable argument: checked (and refused) below
            key, checked = None, None
        if checked is None:
            checked = self._check_submit(fn, qos, bandwidth, partition, priority, deadline,
                                         tenant, sim_ms, memory, policy)  # fmt: skip
            if key is not None:
                if len(self._checked) >= CHECKED_KEPT:
                    self._checked.clear()
                self._checked[key] = checked
        (qos, bandwidth, partition, priority, deadline, tenant, sim_ms, reserve, high,
         reserve_matched, step) = checked  # fmt: skip
        if step is not None and not kwargs:
            # A Guaranteed step of a checked compiled call, started and launched now in
            # one native call (None: not that case, nothing changed).
            task = step.submit(args)
            if task is not None:
                return task
        kwargs = dict(kwargs) if kwargs else {}
        with _EXEC_LOCK:
            if reserve_matched is not None:  # one check of the arguments for both
                res, ticket = reserve_matched(args, kwargs)
            else:
                res, ticket = fn.reservation(*args, **kwargs), None
        if reserve is not None and reserve < res.total:
            raise errors.GPUKitValueError(
                f"Scheduler.submit: memory={memory!r} ({reserve} bytes) is less than the "
                f"{res.total} bytes {getattr(fn, '__name__', 'the function')} needs")  # fmt: skip
        cost = sim_ms if sim_ms is not None else res.traffic_bytes / self._sim_bytes_per_ms
        if not math.isfinite(cost):
            gbps = self._sim_bytes_per_ms / 1e6
            raise errors.GPUKitValueError(f"Scheduler.submit: the simulated cost of "
                                          f"{res.traffic_bytes} bytes at sim_gbps={gbps} "
                                          "is not finite")  # fmt: skip
        with self._mu:
            if self._stopped is not None or self._closed:
                self._check_open_locked()
            if self._device.unreported():  # ends of earlier launches nobody waited on
                self._collect_locked()
            now = self._clock.now()
            deadline_ms = None if deadline is None else now + deadline * 1e3
            held = res.total if reserve is None else reserve
            # The core may start it at once when its arena is to hand (the spare: nothing
            # to allocate, so nothing can fail between admission and start) and a launch
            # may go on the device now (real time; simulated time is the dispatcher's).
            spare_bytes = self._spare_bytes if high else self._spare_low_bytes
            start = (spare_bytes == res.arena_bytes and not self.simulated
                     and not self._paused
                     and (high or self._inflight_low < self.max_inflight))  # fmt: skip
            core = self._core
            # Tasks ended by their waiters are told to the core after this launch (off
            # the critical path), unless their reservations could stand in its way.
            if self._untold:
                room = core.headroom(partition) if start else None  # what the core admits
                if room is None or room < held:
                    self._book_locked(kick=False)
            tid, status, reason, others, prio = core.submit_start(
                tenant, held, now, qos, priority, partition, bandwidth, deadline_ms, start
            )
            if status == "rejected":
                self._counts["rejected"] += 1
                self._admit_locked(others, now)
                raise errors.AdmissionRejected(f"{tenant}: task rejected: {reason}", reason or "")
            task = Task(self, tid, fn, args, kwargs, tenant, qos, partition, res, cost, now,
                        held, high)  # fmt: skip
            self._tasks[tid] = task
            if qos == "guaranteed":
                self._steps["python"] += 1
            if prio is not None:  # admitted and started by the core: it runs in the spare
                task._ticket = ticket  # launched below: its arguments are as checked
                if high:
                    task.arena, self._spare, self._spare_bytes = self._spare, None, -1
                else:
                    task.arena, self._spare_low, self._spare_low_bytes = self._spare_low, None, -1
                # _started_locked, inline (the task's fields as it sets them).
                if not high:
                    self._inflight_low += 1
                task.stream_priority = self._prio_high if qos == "guaranteed" else prio
                task._state = "running"
                task.admitted_ms = task.started_ms = now
                self._counts["launched"] += 1
                ready = [task]
                # What else may start now, as _start_ready_locked would. Best effort may
                # not while a Guaranteed task runs, and this one's end looks again.
                if self._waiting and (qos != "guaranteed" or self._waiting_not_be):
                    ready += self._start_ready_locked(now)
                    self._kick_locked(now)
            else:
                self._admit_locked(([tid] if status == "admitted" else []) + others, now)
                # Real time: start what the core allows right here rather than wake the
                # dispatcher (two thread hand-offs). Simulated time is the dispatcher's.
                ready = [] if self.simulated else self._start_ready_locked(now)
                if task._state == "running":  # started here: launched below
                    task._ticket = ticket
                self._kick_locked(now)
        if self._pending:
            self._deliver()
        for t in ready:
            # A high-lane task's end is left to its waiter (no completer hand-off); other
            # lanes keep the completer, whose prompt end starts the work queued behind.
            self._launch(t, now, on_caller=t._high)
        if self._unbooked:  # while the GPU runs this launch
            self._book_after_launch(now)
        return task

    def _book_after_launch(self, now: float) -> None:
        """Books the ends waiters left, after a submission's launch (while the GPU runs
        it), and starts what they free (now: the submission's time)."""
        with self._mu:
            # Ends the core was told of freed nothing then: only the others may.
            untold = self._untold
            self._book_locked(kick=False)
            more = []
            if untold and self._waiting:
                if not self.simulated:
                    more = self._start_ready_locked(now)
                self._kick_locked(now)
            elif untold and (self.simulated or self._closed):
                self._kick_locked(now)  # it wakes the dispatcher then
        if self._pending:
            self._deliver()
        for t in more:
            self._launch(t, now, on_caller=t._high)

    def _check_submit(self, fn: Any, qos: Any, bandwidth: Any, partition: Any, priority: Any,
                      deadline: Any, tenant: Any, sim_ms: Any, memory: Any,
                      policy: Any) -> tuple[Any, ...]:  # fmt: skip
        """submit()'s arguments other than the call's own, checked and normalised; the
        result depends on them alone, so submit() keeps it for the next submission with
        the same ones (a closed-loop client passes the same every step)."""
        where = "Scheduler.submit"
        if policy is not None:
            if qos != "burstable":
                raise errors.GPUKitValueError(f"{where}: give qos or policy, not both")
            qos = policy
        if not hasattr(fn, "reservation") or not hasattr(fn, "call_in"):
            raise errors.DTypeError(f"submit takes a @gpk.compile function, got {fn!r}")
        if getattr(fn, "static_outputs", False):
            raise errors.GPUKitValueError(
                f"{fn.__name__}: static_outputs=True results would be views into the task's "
                "arena, which is freed when the task ends")  # fmt: skip
        qos = check.text(where, "qos", qos).lower().replace("-", "_")
        if qos not in _QOS:
            raise errors.GPUKitValueError(f"{where}: qos must be one of {sorted(_QOS)}, "
                                          f"got {qos!r}")  # fmt: skip
        bandwidth = check.real(where, "bandwidth", bandwidth, 0.0, 1.0)
        partition = check.text(where, "partition", partition)
        priority = check.int32(where, "priority", priority)
        if deadline is not None:
            deadline = check.real(where, "deadline", deadline, -math.inf)
        if sim_ms is not None:
            # A cost that is not finite would move the simulated clock past every time.
            sim_ms = check.real(where, "sim_ms", sim_ms, 0.0)
        reserve = None if memory is None else check.memory_size(where, "memory", memory)
        tenant = str(tenant or getattr(fn, "__name__", "tenant"))
        high = qos == "guaranteed" or self._part_prio.get(partition, 0) < 0
        # Bound once here: the function is part of the key the result is kept under.
        reserve_matched = getattr(fn, "reserve_matched", None)
        step = None
        if (qos == "guaranteed" and deadline is None and sim_ms is None and reserve is None
                and reserve_matched is not None and hasattr(fn, "_hit")
                and isinstance(self._clock, WallClock)):  # fmt: skip
            step = self._native_step(fn, tenant, partition, bandwidth, priority)
        return (qos, bandwidth, partition, priority, deadline, tenant, sim_ms, reserve, high,
                reserve_matched, step)  # fmt: skip

    def _native_step(self, fn: Any, tenant: str, partition: str, bandwidth: float,
                     priority: int) -> Any:  # fmt: skip
        """The native on-caller step (_rust.GuaranteedStep) of a Guaranteed tenant's
        calls of `fn` with these options: in real time on the CUDA device, a call that
        hits the function's native guard in the spare arena its program runs in is
        admitted, started, launched and, in result(), ended in native calls, on this
        scheduler's state under its locks (rust/pygpukit-py/src/scheduler/step.rs);
        every other case takes the Python path."""
        from . import task as task_mod
        from .device import Done, _poll

        assert isinstance(self._clock, WallClock)
        return self._core.guaranteed_step(self, fn, tenant, partition, bandwidth, priority, {
            "mu": self._mu, "exec_lock": _EXEC_LOCK, "task": Task, "cuda_device": CudaDevice,
            "done": Done, "poll": _poll, "perf_counter": time.perf_counter,
            "future_lock": task_mod._FUTURE_LOCK, "t0": self._clock._t0,
            "prio_high": self._prio_high, "sim_bytes_per_ms": self._sim_bytes_per_ms,
            "spare_max": SPARE_ARENA_MAX, "ended_kept": ENDED_KEPT})  # fmt: skip

    def at(self, t_ms: float, fn: Callable[[], None]) -> None:
        """Call fn on the dispatcher thread once the scheduler's clock reaches t_ms (an
        arrival process in simulated time; it may submit)."""
        t_ms = check.real("Scheduler.at", "t_ms", t_ms, -math.inf)
        with self._mu:
            self._check_open_locked()
            self._clock.call_at(t_ms, fn)
            self._notify_locked()

    def now(self) -> float:
        """The scheduler's clock, in milliseconds (simulated GPU time when simulated)."""
        return self._clock.now()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing starts inside the block: submit a batch, then let pacing order it."""
        with self._mu:
            self._paused += 1
        try:
            yield
        finally:
            with self._mu:
                self._paused -= 1
                self._notify_locked()

    def _check_open_locked(self) -> None:
        if self._stopped is not None:
            raise errors.SchedulerError(str(self._stopped)) from self._stopped.__cause__
        if self._closed:
            raise errors.SchedulerError("the scheduler is closed")

    # -- reservations ---------------------------------------------------------------------
    def _admit_locked(self, ids: list[int], now: float) -> None:
        """The core admitted these tasks: allocate each one's arena from the pool (which
        may evict idle arrays); a task whose arena cannot be had fails and gives its
        reservation back, possibly admitting others."""
        if not ids:
            return
        work = deque(ids)
        while work:
            tid = work.popleft()
            task = self._tasks.get(tid)
            if task is None or task._state != "queued":
                continue
            try:
                task.arena = self._take_arena(task.reservation.arena_bytes, task._high)
            except errors.OutOfMemoryError as e:
                self._counts["arena_oom"] += 1
                work.extend(self._core.cancel(tid))
                self._end_locked(task, "failed", error=e)
                continue
            task._state = "admitted"
            task.admitted_ms = now
            self._waiting[tid] = task.qos
            self._waiting_not_be += task.qos != "best_effort"

    def _take_arena(self, nbytes: int, high: bool) -> Any:
        """An arena of `nbytes` for a task of the high lane or not: its lane's spare if it
        was allocated for as many, else a new one from the pool (that spare goes back
        first, and the other lane's too if the pool is short: it may need their memory)."""
        if high:
            spare, self._spare = self._spare, None
            fits, self._spare_bytes = self._spare_bytes == nbytes, -1
        else:
            spare, self._spare_low = self._spare_low, None
            fits, self._spare_low_bytes = self._spare_low_bytes == nbytes, -1
        if spare is not None:
            if fits:
                return spare
            spare.release()
        try:
            return self._backend.alloc_arena(nbytes)
        except errors.OutOfMemoryError:
            if self._spare is None and self._spare_low is None:
                raise
        self._release_spare_locked()
        return self._backend.alloc_arena(nbytes)

    def _keep_arena(self, arena: Any, nbytes: int, high: bool) -> None:
        """An ended task's arena: kept as its lane's spare (replacing the last) when small
        enough and the scheduler still admits work, else given back to the pool."""
        if nbytes > SPARE_ARENA_MAX or self._closed or self._stopped is not None:
            arena.release()
            return
        if high:
            old, self._spare, self._spare_bytes = self._spare, arena, nbytes
        else:
            old, self._spare_low, self._spare_low_bytes = self._spare_low, arena, nbytes
        if old is not None:
            old.release()

    def _release_spare_locked(self) -> None:
        """Gives both lanes' spares back to the pool."""
        spare, self._spare, self._spare_bytes = self._spare, None, -1
        low, self._spare_low, self._spare_low_bytes = self._spare_low, None, -1
        for arena in (spare, low):
            if arena is not None:
                arena.release()

    def _end_locked(self, task: Task, state: str, result: Any = None,
                    error: BaseException | None = None, deliver: bool = True,
                    record: tuple[Any, ...] | None = None) -> None:  # fmt: skip
        """Ends the task (its state, the scheduler's tables, its ended record: `record`
        where the native step made it already, the same tuple task._record() gives)."""
        arena = task.arena
        if arena is not None:
            task.arena = None
            self._keep_arena(arena, task.reservation.arena_bytes, task._high)
        del self._tasks[task.id]
        if self._waiting.pop(task.id, None) is not None:
            self._waiting_not_be -= task.qos != "best_effort"
        task._state = state
        if task.finished_ms is None:
            task.finished_ms = self._clock.now()
        task.fn, task.args, task.kwargs = None, (), {}  # the inputs may be freed now
        # The device's wait closure holds the task (and its result): a reference cycle
        # that only the garbage collector would free, a collection every few dozen
        # steps (a pause of 0.1 ms and more: the p99 of a closed-loop client).
        task._wait_gpu = None
        task._ticket = None
        ended = self._ended
        ended[task.id] = task._record() if record is None else record
        if len(ended) > ENDED_KEPT:
            ended.popitem(last=False)
        if deliver:  # else delivered already (a booked end: _book_locked)
            task._outcome = error if error is not None else result
            self._pending.append(task)
        if self._closed and not self._tasks:
            self._notify_locked()  # close() waits for the dispatcher to see this

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The scheduler's lock; futures ended inside are completed after it is released,
        so a woken waiter (a latency-critical client about to submit again) neither waits
        for the lock nor competes with this thread for the GIL while it still holds it."""
        with self._mu:
            yield
        self._deliver()

    def _deliver(self) -> None:
        """Completes the futures of the tasks ended under the lock (see _locked)."""
        pending = self._pending
        while True:
            try:
                task = pending.popleft()
            except IndexError:
                return
            task._deliver()

    def _cancel(self, task: Task) -> bool:
        with self._locked():
            if task._state not in ("queued", "admitted"):
                return False
            others = self._core.cancel(task.id)
            self._counts["cancelled"] += 1
            self._end_locked(task, "cancelled")
            self._admit_locked(others, self._clock.now())
            self._notify_locked()  # what it admitted may start
            return True

    # -- dispatching ----------------------------------------------------------------------
    def _has_waiting_locked(self) -> bool:
        return bool(self._waiting)

    def _start_ready_locked(self, now: float) -> list[Task]:
        """Starts (in the core) every task that may start now; the caller launches them
        once it has let go of the lock."""
        out = []
        while (t := self._pick_locked(now)) is not None:
            out.append(t)
        return out

    def _notify_locked(self) -> None:
        """Wakes the dispatcher to look at everything again: in simulated time through
        the condition it waits on, in real time through the core, where it waits without
        the GIL (see _dispatch)."""
        if self.simulated:
            self._cond.notify_all()
        else:
            self._core.wake_dispatcher()

    def _kick_locked(self, now: float) -> None:
        """Wakes the dispatcher only if it has something to do that the calling thread
        does not: a held task may start by itself (a bucket refilling, a Guaranteed tenant
        going idle) before the dispatcher's planned wake-up. Every wake-up it does not need
        costs the latency-critical threads the GIL; the core decides, and a dispatcher
        that watches the core while it waits only plans again there."""
        if self.simulated or self._closed:
            self._notify_locked()
            return
        if not self._has_waiting_locked():
            return
        self._core.kick(now)

    def _on_done(self, d: Done) -> None:
        """A launch ended (called by the device, on its own thread). On a device that
        reports ends from its own threads (CUDA), the tasks this frees are started and
        launched here too (after the ended task's waiter has its result); otherwise the
        dispatcher does it."""
        with self._locked():
            self._finish_locked(d)
            now = self._clock.now()
            if not self._device.async_done:
                self._notify_locked()
                return
            ready = self._start_ready_locked(now)
            self._kick_locked(now)
        for t in ready:
            self._launch(t, now)

    def _on_done_waiter(self, d: Done) -> None:
        """A launch ended, seen by the thread waiting for its result: that thread only
        ends it; what the end frees is launched by the dispatcher, woken only if
        something can start (so the waiter returns at once).

        A high-lane task's end is only half done here: its result is delivered and its
        arena kept as the spare for the next step, and the rest of its bookkeeping is
        left to the next submission once that has launched, while the GPU runs it, or to
        whatever looks at the scheduler first (stats, close, the dispatcher): the
        closed-loop client's step is back in its hands sooner. With nothing else
        waiting, the core is told then too (its reservation, GPU time and stats). With
        work waiting (best effort held for this tenant, say), the core is told now, in
        one call that also says whether the end frees anything: if it does, the end is
        booked at once and the dispatcher starts what it frees; if not (the usual case
        next to held best-effort work), the rest waits as above."""
        task = d.task
        with self._mu:
            deferred = False
            if (d.error is None and task._high and not self._closed
                    and self._stopped is None and not self.simulated):  # fmt: skip
                now = self._clock.now() if d.at_ms is None else d.at_ms
                if not self._waiting:
                    deferred, told = True, False
                else:
                    if self._untold:  # the core hears of ends in order
                        self._book_locked(kick=False)
                    # Wakes the dispatcher itself if what waits may start now or sooner.
                    others, ready = self._core.complete_waited(task.id, d.gpu_ms, now)
                    if others or ready:
                        task.gpu_ms, task.finished_ms = d.gpu_ms, now
                        self._ended_locked(task, True, d.result, None, others, now)
                    else:
                        deferred, told = True, True
                if deferred:
                    task.gpu_ms = d.gpu_ms
                    task.finished_ms = now
                    arena = task.arena
                    if arena is not None:
                        task.arena = None
                        self._keep_arena(arena, task.reservation.arena_bytes, task._high)
                    task._state = "done"
                    task._outcome = d.result
                    task._wait_gpu = None  # see _end_locked
                    self._unbooked.append((task, told, None))
                    self._untold += not told
            else:
                self._finish_locked(d)
                if self._waiting:
                    now = self._clock.now()
                    if self._core.pick_next(now) is not None:
                        self._notify_locked()
                    else:
                        self._kick_locked(now)
                elif self.simulated or self._closed:
                    self._notify_locked()  # as _kick_locked does
        if deferred:
            task._deliver()
        elif self._pending:
            self._deliver()

    def _book_locked(self, kick: bool = True) -> None:
        """Books the ends _on_done_waiter left (their results are delivered), telling
        the core of those it was not told of; kick: wake the dispatcher if what they
        free may start (a caller that starts it itself passes False)."""
        booked = self._unbooked.copy()
        self._unbooked.clear()
        untold, self._untold = self._untold, 0
        now = self._clock.now()
        for task, told, record in booked:
            self._counts["completed"] += 1
            if told:
                self._end_locked(task, "done", deliver=False, record=record)
                continue
            others = self._core.complete(task.id, task.gpu_ms or 0.0, now)
            self._end_locked(task, "done", deliver=False, record=record)
            if others:
                self._admit_locked(others, now)
        if kick and untold and self._waiting:
            self._notify_locked()

    def _collect_locked(self) -> None:
        for d in self._device.collect():
            self._finish_locked(d)

    def _finish_locked(self, d: Done) -> None:
        if self._unbooked:  # the core hears of ends in order
            self._book_locked(kick=False)
        task = d.task
        if not task._high:
            self._inflight_low -= 1
        now = d.at_ms if d.at_ms is not None else self._clock.now()
        task.gpu_ms = d.gpu_ms
        task.finished_ms = now
        ok = d.error is None
        others = (self._core.complete if ok else self._core.fail)(task.id, d.gpu_ms, now)
        self._ended_locked(task, ok, d.result, d.error, others, now)

    def _ended_locked(self, task: Task, ok: bool, result: Any, error: BaseException | None,
                      others: list[int], now: float) -> None:  # fmt: skip
        """The core was told the task ended (others: the queued tasks that admitted)."""
        self._counts["completed" if ok else "failed"] += 1
        self._end_locked(task, "done" if ok else "failed", result, error)
        self._admit_locked(others, now)

    def _next_event_locked(self, now: float, core: bool = True) -> float | None:
        """The earliest time something can change without a new submission: a launch
        ending, a timer, or (core) a held-back tenant back within its share."""
        sweep = now + SWEEP_MS if self._device.unreported() else None
        core = core and self._has_waiting_locked()
        times = [t for t in (self._device.next_completion(), self._clock.next_timer(),
                             self._core.next_wakeup(now) if core else None, sweep)
                 if t is not None]  # fmt: skip
        return min(times) if times else None

    def _pick_locked(self, now: float) -> Task | None:
        if self._paused or not self._has_waiting_locked():
            return None
        if self._inflight_low < self.max_inflight:
            picked = self._core.pick_and_start(now)  # one call: pick, start, count throttles
            if picked is None:
                return None
            tid, prio = picked
            task = self._tasks[tid]
        else:  # only high-priority work may go on the device now
            best = self._core.pick_next(now)
            if best is None or not self._tasks[best]._high:
                return None
            tid, task = best, self._tasks[best]
            prio = self._core.start(tid, now)
        del self._waiting[tid]
        self._waiting_not_be -= task.qos != "best_effort"
        self._started_locked(task, prio, now)
        return task

    def _started_locked(self, task: Task, prio: int, now: float) -> None:
        """The core started the task (prio: its partition's stream priority)."""
        if not task._high:
            self._inflight_low += 1
        # Guaranteed launches take the highest stream priority whatever their partition.
        task.stream_priority = self._prio_high if task.qos == "guaranteed" else prio
        task._state = "running"
        task.started_ms = now
        self._counts["launched"] += 1

    def _run_timers(self) -> bool:
        with self._mu:
            due = self._clock.due(self._clock.now())
        for fn in due:
            try:
                fn()
            except Exception:
                with self._mu:
                    self._counts["timer_errors"] += 1
        return bool(due)

    def _loop(self) -> None:
        try:
            self._dispatch()
        except BaseException as e:  # whatever ends the dispatcher ends its tasks
            self._stop(e)

    def _stop(self, cause: BaseException) -> None:
        """The dispatcher cannot go on: every task it would have started or ended fails with
        a SchedulerError that says why, later calls raise one, and close() has nothing left
        to wait for. A launch running on a real device is left to end as usual (its device
        thread ends it, and its arena stays held until then)."""
        err = errors.SchedulerError(f"the scheduler stopped: {type(cause).__name__}: {cause}")
        err.__cause__ = cause
        self._device.flush()  # the device's threads end what no one else will now
        with self._locked():
            try:
                if self._unbooked:  # ended on the GPU and delivered: not failed
                    self._book_locked(kick=False)
            except Exception:  # the core may be what failed
                self._unbooked.clear()
                self._untold = 0
            self._stopped = err
            self._release_spare_locked()
            for task in list(self._tasks.values()):
                if task._state == "done":  # delivered; the core could not be told
                    self._end_locked(task, "done", deliver=False)
                    continue
                running = task._state == "running"
                if running and not self.simulated:
                    continue
                try:
                    if running:  # simulated: only the dispatcher would have ended it
                        self._core.fail(task.id, 0.0, self._clock.now())
                    else:
                        self._core.cancel(task.id)
                except Exception:  # the core may be what failed
                    pass
                self._counts["failed"] += 1
                self._end_locked(task, "failed", error=err)
            self._notify_locked()

    def _dispatch(self) -> None:
        sim = isinstance(self._clock, SimClock)
        fruitless = False  # the last wake-up was a timeout that started nothing
        ready_miss = False  # the core said a task may start, and none could
        while True:
            if self._run_timers():
                continue
            wait: tuple[float, float, bool] | None = None
            with self._locked():
                self._collect_locked()
                if self._unbooked:
                    self._book_locked(kick=False)
                if self._pending:
                    continue  # complete the futures first: their callbacks may submit
                if self._closed and not self._tasks:
                    return
                now = self._clock.now()
                task = self._pick_locked(now)
                if task is None:
                    # Real time: the core watches for a held task that may start by
                    # itself (its tenant back within share, a Guaranteed tenant gone
                    # idle) while this thread waits in it without the GIL, unless only
                    # high-lane work may start now or the last such start came to
                    # nothing: then its time is a plain deadline, as the others are.
                    watch = (not sim and not self._paused and not ready_miss
                             and self._inflight_low < self.max_inflight)  # fmt: skip
                    t = None if self._paused else self._next_event_locked(now, core=not watch)
                    if t is not None and not math.isfinite(t):
                        raise errors.SchedulerError(f"the next event is at t={t} ms")
                    if sim and t is not None and t > now:
                        self._clock.advance_to(t)  # type: ignore[attr-defined]
                        self._device.advance_to(t)
                    elif sim:
                        self._cond.wait()
                    else:
                        wait_ms = IDLE_WAIT_MS if t is None else max(t - now, 0.0)
                        if fruitless and not watch:
                            # The last timed wake-up found the hold extended (a busy
                            # Guaranteed tenant pushes its idle time on with every step):
                            # poll no faster than this, not once per step.
                            wait_ms = max(wait_ms, FRUITLESS_WAIT_MS)
                        # Armed under the lock: a wake-up asked for before the wait
                        # below begins is kept for it.
                        self._core.arm_wait(now + wait_ms, watch)
                        wait = (now, now + wait_ms, watch)
                    if wait is None:
                        continue
                else:
                    fruitless = ready_miss = False
            if wait is not None:
                got = self._core.wait_dispatcher(*wait)
                self._wakeups += 1
                ready_miss = wait[2] and got == "ready"
                fruitless = not wait[2] and got == "deadline"
                continue
            assert task is not None  # picked above (no wait planned)
            self._launch(task, now)

    def _launch(self, task: Task, now: float, on_caller: bool = False) -> None:
        """Launch a started task (the one place a launch leaves the scheduler: a dispatch
        controller can take it over here). on_caller: on the submitting thread, at
        submission."""
        fn, args, kwargs, arena = task.fn, task.args, task.kwargs, task.arena
        # The arguments were checked at submission: a launch made then skips the check.
        ticket, task._ticket = task._ticket, None
        device = self._device
        assert task.stream_priority is not None
        if on_caller and ticket is not None and device.exec_lock is _EXEC_LOCK:
            # The device runs it holding the lock run() below would take: a bound call
            # (no Python frame of its own) does.
            run_matched = partial(fn.call_in_matched, ticket, arena, args, kwargs)
            device.launch(task, task.stream_priority, task._high, run_matched, now, True)
            return

        def run() -> Any:
            with _EXEC_LOCK:
                if on_caller and ticket is not None:
                    return fn.call_in_matched(ticket, arena, args, kwargs)
                return fn.call_in(arena, *args, **kwargs)

        device.launch(task, task.stream_priority, task._high, run, now, on_caller)

    # -- inspecting and closing -----------------------------------------------------------
    def stats(self, task_id: int | Task | None = None) -> dict[str, Any]:
        """The node: reservations (per task), queue, running, per-tenant GPU time and
        throttles, partitions (from the core); launches and ends; arenas held; evictions.
        With a task (or its id): that task's stats (Task.stats), also once it has ended."""
        if task_id is not None:
            return self._task_stats(task_id)
        with self._mu:
            if self._unbooked:
                self._book_locked()
            now = self._clock.now()
            st = dict(self._core.stats(now))
            st["now_ms"] = now
            st["simulated"] = self.simulated
            st["launches"] = dict(self._counts)
            st["dispatcher_wakeups"] = self._wakeups
            st["guaranteed_steps"] = dict(self._steps)
            st["arena_bytes_held"] = sum(t.reservation.arena_bytes for t in self._tasks.values()
                                         if t.arena is not None)  # fmt: skip
            # The last ended task's arena, kept for the next admission of its size.
            st["arena_bytes_spare"] = sum(a.nbytes for a in (self._spare, self._spare_low)
                                          if a is not None)  # fmt: skip
            st["task_states"] = {tid: t._state for tid, t in self._tasks.items()}
        st["eviction"] = eviction_stats(self._backend.pool)
        st["pool"] = self._backend.pool_stats()
        return st

    def _task_stats(self, task_id: int | Task) -> dict[str, Any]:
        tid = task_id.id if isinstance(task_id, Task) else check.byte_count(
            "Scheduler.stats", "task_id", task_id)  # fmt: skip
        with self._mu:
            task = self._tasks.get(tid)
            if task is not None:
                return task.stats()
            ended = self._ended.get(tid)
        if ended is None:
            raise errors.GPUKitValueError(f"Scheduler.stats: no task {tid} (ids of this "
                                          f"scheduler's last {ENDED_KEPT} ended tasks are "
                                          "kept)")  # fmt: skip
        return Task._stats_of(ended)

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Stop after the submitted tasks end (cancel=True withdraws those not running)."""
        with self._locked():
            if self._unbooked:
                self._book_locked()
            if cancel:
                for task in list(self._tasks.values()):
                    if task._state in ("queued", "admitted"):
                        self._core.cancel(task.id)
                        self._counts["cancelled"] += 1
                        self._end_locked(task, "cancelled")
            self._closed = True
            self._release_spare_locked()  # tasks ending from now on give theirs back
            self._notify_locked()
        self._thread.join(timeout)
        self._device.close()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)
