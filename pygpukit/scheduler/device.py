"""Where admitted tasks run and how their GPU time is measured.

SimDevice: the CPU backend's model of a GPU. The call runs at launch (real results); its
cost (simulated milliseconds) is then consumed in device time, one launch at a time and
without preemption: once a launch is on the device it runs to its end, and only then does
the next start (the high-priority lane's head first). That is what the H200 showed: a
Guaranteed replay next to an 8192^3 cuBLASLt GEMM waited for the whole GEMM (p50 1.55 ms
against a 1.6 ms GEMM), because a persistent GEMM holds every SM until it ends whatever
the stream priorities; so the scheduler must decide before a launch, not after.
HostDevice: the CPU backend with measured wall time. CudaDevice: launches on streams per
priority, GPU time from events around the replay, ends reported by completer threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EPS_MS = 1e-9
# Real time: age at which the dispatcher ends an on-caller launch nobody waits on (it
# looks this often while there are any: rarely enough not to take the GIL from the
# latency-critical thread each step).
SWEEP_MS = 10.0


def _poll(event: Any, timeout: float) -> bool:
    """Whether `event` fires within `timeout` seconds: queried, with sleeps growing from
    20 us to 0.5 ms between (a native wait has no timeout)."""
    deadline = time.perf_counter() + timeout
    nap = 2e-5
    while not event.query():
        left = deadline - time.perf_counter()
        if left <= 0:
            return False
        time.sleep(min(nap, left))
        nap = min(nap * 2, 5e-4)
    return True


@dataclass
class Done:
    task: Any
    gpu_ms: float
    result: Any
    error: BaseException | None
    at_ms: float | None  # completion time on the scheduler's clock (None: read it now)


class Device:
    """launch() may report the end through `on_done` (any thread, no scheduler lock held)
    or leave it for collect() (the dispatcher thread). async_done: ends are reported from
    the device's own threads, after launch() has returned."""

    async_done = False
    # The lock a launch holds while it runs the call (the scheduler's exec lock), if any.
    exec_lock: Any = None

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float, on_caller: bool = False) -> None:  # fmt: skip
        """Run `run` for the task on the device. on_caller: launched on the submitting
        thread at submission (a device may leave the end to the waiter then)."""
        raise NotImplementedError

    def collect(self) -> list[Done]:
        """Launches that have ended and were not reported through on_done."""
        return []

    def unreported(self) -> bool:
        """Whether launches wait for collect() to report their ends (the dispatcher then
        looks again within SWEEP_MS)."""
        return False

    def flush(self) -> None:
        """Hand launches waiting for collect() to the device's own threads (the dispatcher
        is stopping)."""

    def next_completion(self) -> float | None:
        """Simulated devices: when the next launch ends if nothing else is launched."""
        return None

    def advance_to(self, t_ms: float) -> None:
        pass

    def close(self) -> None:
        pass


def _call(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except Exception as e:
        return None, e


class SimDevice(Device):
    def __init__(self) -> None:
        self.t = 0.0
        self.lanes: tuple[deque[list[Any]], deque[list[Any]]] = (deque(), deque())
        self.current: list[Any] | None = None  # [task, remaining ms, cost, result, error]
        self.done: list[Done] = []

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float, on_caller: bool = False) -> None:  # fmt: skip
        self.advance_to(now)
        result, error = _call(run)
        cost = 0.0 if error is not None else float(task.sim_ms)
        self.lanes[0 if high else 1].append([task, cost, cost, result, error])
        self._settle()

    def _settle(self) -> None:
        """Ends a finished current launch and starts the next, high lane first."""
        while True:
            if self.current is not None and self.current[1] <= EPS_MS:
                task, _, cost, result, error = self.current
                self.done.append(Done(task, cost, result, error, self.t))
                self.current = None
            if self.current is not None:
                return
            lane = self.lanes[0] or self.lanes[1]
            if not lane:
                return
            self.current = lane.popleft()

    def next_completion(self) -> float | None:
        return None if self.current is None else self.t + self.current[1]

    def advance_to(self, t_ms: float) -> None:
        while t_ms > self.t:
            if self.current is None:
                self.t = t_ms
                return
            step = min(self.current[1], t_ms - self.t)
            self.current[1] -= step
            self.t += step
            self._settle()

    def collect(self) -> list[Done]:
        out, self.done = self.done, []
        return out


class HostDevice(Device):
    """CPU backend, measured: the call runs at launch; its wall time is the GPU time."""

    def __init__(self, on_done: Callable[[Done], None]) -> None:
        self.on_done = on_done

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float, on_caller: bool = False) -> None:  # fmt: skip
        t0 = time.perf_counter()
        result, error = _call(run)
        self.on_done(Done(task, (time.perf_counter() - t0) * 1e3, result, error, None))


class CudaDevice(Device):
    """One CUDA stream per priority (blocking streams, so they order with the legacy
    stream the backend and eviction copies use); one completer thread per stream waits on
    each launch's end event without the GIL and ends the task itself (`on_done`). A thread
    waiting in Task.result() waits on the end event itself and ends the task if it gets
    there first (`on_done_waiter`): no thread hand-off between the GPU and the waiter.

    A launch made on the submitting thread at submission (on_caller) is not handed to a
    completer at all: waking one per task costs the submitting thread the GIL at its next
    native call. Its end is reported by whoever waits on the task (result, exception,
    done), or else by the dispatcher's collect() once it is SWEEP_MS old."""

    async_done = True

    def __init__(self, backend: Any, on_done: Callable[[Done], None],
                 exec_lock: Any, on_done_waiter: Callable[[Done], None] | None = None,
                 ) -> None:  # fmt: skip
        from pygpukit import _native

        self._native = _native
        self.backend = backend
        self.on_done = on_done
        self.on_done_waiter = on_done_waiter or on_done
        self.exec_lock = exec_lock
        self.streams: dict[int, Any] = {}
        self.queues: dict[int, queue.Queue[Any]] = {}
        self._lanes: dict[int, tuple[Any, queue.Queue[Any]]] = {}  # priority -> both
        # Event pairs of on-caller launches whose ends were claimed, for the next launches:
        # creating (and later destroying) two CUDA events per submit is host time on the
        # submit-to-result path. A pair is put back only after its elapsed time is read.
        self._spare_events: list[tuple[Any, Any]] = []
        # Only a Guaranteed task's end is waited on by spinning (the driver's way with one
        # context, and the fastest wake-up); the others' end events sleep until the GPU
        # signals them: a completer spinning through best-effort GEMMs' milliseconds held a
        # CPU core the other tenants' threads could use (H200: 16 queued 8192^3 GEMMs, 31
        # ms, cost the process 31 ms of CPU time, 10 ms with these). Their pairs:
        self._sleep_events: list[tuple[Any, Any]] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # On-caller launches no completer watches: (launched at, queue, item).
        self._unwatched: deque[tuple[float, queue.Queue[Any], tuple[Any, ...]]] = deque()

    def _stream(self, priority: int) -> tuple[Any, queue.Queue[Any]]:
        lane = self._lanes.get(priority)  # made once per priority: no lock once there
        if lane is not None:
            return lane
        with self._lock:
            s = self.streams.get(priority)
            if s is None:
                s = self.streams[priority] = self._native.Stream(priority, False)
                q: queue.Queue[Any] = queue.Queue()
                self.queues[priority] = q
                t = threading.Thread(target=self._complete, args=(q,), daemon=True,
                                     name=f"pygpukit-sched-stream{priority}")  # fmt: skip
                t.start()
                self.threads.append(t)
            lane = self._lanes[priority] = (s, self.queues[priority])
            return lane

    def _claim(self, task: Any) -> bool:
        """Whether this caller is the one to end the task (the completer and a waiter
        may both see its end event fire)."""
        with self._lock:
            if getattr(task, "_end_claimed", False):
                return False
            task._end_claimed = True
            return True

    def _claim_unwatched(self, task: Any) -> bool:
        """_claim for an on-caller launch's waiter; it also drops the launch from the
        unwatched ones when it is the latest (a closed-loop client's usual case), so the
        next submission finds nothing to sweep without looking at each."""
        with self._lock:
            if task._end_claimed:
                return False
            task._end_claimed = True
            w = self._unwatched
            if w and w[-1][2][0] is task:
                w.pop()
            return True

    def _events_of(self, task: Any) -> list[tuple[Any, Any]]:
        """The spare event pairs of the task's kind: spinning (Guaranteed) or sleeping."""
        return self._spare_events if task.qos == "guaranteed" else self._sleep_events

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float, on_caller: bool = False) -> None:  # fmt: skip
        lane = self._lanes.get(priority)  # _stream's usual case, inline
        stream, q = lane if lane is not None else self._stream(priority)
        # Events of a completer-watched launch are fresh (a waiter may still synchronize
        # on them after the completer is done with the task); an on-caller launch takes a
        # pair another on-caller task's end has given back (a second waiter of that task
        # still on it would only wait for this launch too, then find the task ended).
        pair = None
        if on_caller:
            try:
                pair = self._events_of(task).pop()
            except IndexError:  # none given back yet (or another thread took the last)
                pass
        if pair is None:  # only a Guaranteed task's end is waited on by spinning
            pair = (self._native.Event(True),
                    self._native.Event(True, task.qos != "guaranteed"))  # fmt: skip
        start, end = pair
        b = self.backend
        # Launches from the dispatcher and from submitting threads: the stream swap must
        # not interleave with another call's.
        with self.exec_lock:
            old = b.stream
            b.stream = stream  # the compiled call queues its launches on the task's stream
            try:
                start.record(stream)
                try:  # _call, inline
                    result, error = run(), None
                except Exception as e:
                    result, error = None, e
                end.record(stream)
            finally:
                b.stream = old
        item = (task, start, end, result, error)
        if error is None:

            def wait(timeout: float | None = None) -> None:
                if timeout is None:
                    # This thread ends the task once the event fires (or finds it
                    # ended): the dispatcher need not plan a sweep for it.
                    task._waited = True
                    try:
                        end.synchronize()
                    except BaseException:
                        task._waited = False  # a fault: collect() reports it
                        raise
                elif not on_caller or not _poll(end, timeout):
                    return  # a completer ends it: its waiter waits on the future
                if self._claim_unwatched(task) if on_caller else self._claim(task):
                    ms = float(start.elapsed_time(end))
                    if on_caller:
                        self._events_of(task).append((start, end))
                    self.on_done_waiter(Done(task, ms, result, None, None))

            task._wait_gpu = wait
            if on_caller:
                with self._lock:
                    self._unwatched.append((time.perf_counter(), q, item))
                return
        q.put(item)

    def unreported(self) -> bool:
        """Launches nobody has ended or waits on without a timeout: a closed-loop
        client's step in flight is not one (its waiter ends it), so the dispatcher
        plans no sweep, and no wake-up, for it."""
        if not self._unwatched:  # read without the lock: a launch racing this is the
            return False  # caller's own submission's, not one to sweep yet
        with self._lock:  # those their waiters ended go first
            w = self._unwatched
            while w and getattr(w[0][2][0], "_end_claimed", False):
                w.popleft()
            return any(not getattr(e[2][0], "_waited", False) for e in w)

    def collect(self) -> list[Done]:
        """Ends of on-caller launches nobody has waited for, once SWEEP_MS old (a waiter
        usually comes first; the dispatcher only covers tasks nobody waits on)."""
        out: list[Done] = []
        if not self._unwatched:
            return out
        old = time.perf_counter() - SWEEP_MS / 1e3
        keep: list[tuple[float, queue.Queue[Any], tuple[Any, ...]]] = []
        with self._lock:  # launches made meanwhile go to the new deque, after these
            items, self._unwatched = self._unwatched, deque()
        for entry in items:
            t, _, (task, start, end, result, _) = entry
            if getattr(task, "_end_claimed", False):
                continue
            try:
                ready = t <= old and end.query()
                ms = float(start.elapsed_time(end)) if ready else 0.0
            except Exception as e:  # a kernel fault: the task fails, its time unknown
                if self._claim(task):
                    out.append(Done(task, 0.0, None, e, None))
                continue
            if not ready:
                keep.append(entry)
            elif self._claim(task):
                out.append(Done(task, ms, result, None, None))
                self._events_of(task).append((start, end))
        if keep:
            with self._lock:
                self._unwatched.extendleft(reversed(keep))
        return out

    def flush(self) -> None:
        with self._lock:
            items, self._unwatched = self._unwatched, deque()
        for _, q, item in items:
            q.put(item)

    def _complete(self, q: queue.Queue[Any]) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            task, start, end, result, error = item
            try:
                end.synchronize()
                ms = float(start.elapsed_time(end))
            except Exception as e:  # a kernel fault: the task fails, its time unknown
                ms, error = 0.0, error or e
            if self._claim(task):
                self.on_done(Done(task, ms, result, error, None))

    def close(self) -> None:
        self.flush()
        for q in self.queues.values():
            q.put(None)
        for t in self.threads:
            t.join(timeout=10)
