"""Where admitted tasks run and how their GPU time is measured.

SimDevice: the CPU backend's model of a GPU with two stream priorities. The call runs at
launch (real results); its cost (simulated milliseconds) is then consumed in device time:
the head of the high-priority lane always progresses, the low-priority lane's head only
while no high-priority work is queued, like blocks of a high-priority stream taking SMs
first. HostDevice: the CPU backend with measured wall time. CudaDevice: launches on
streams per priority, GPU time from events around the replay.
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


@dataclass
class Done:
    task: Any
    gpu_ms: float
    result: Any
    error: BaseException | None
    at_ms: float | None  # completion time on the scheduler's clock (None: read it now)


class Device:
    def __init__(self) -> None:
        self.inflight_low = 0  # launched, not yet collected, low-priority tasks
        self.inflight_high = 0

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float) -> None:  # fmt: skip
        raise NotImplementedError

    def collect(self) -> list[Done]:
        """Launches that have ended."""
        raise NotImplementedError

    def next_completion(self) -> float | None:
        """Simulated devices: when the next launch ends if nothing else is launched."""
        return None

    def advance_to(self, t_ms: float) -> None:
        pass

    def _count(self, high: bool, d: int) -> None:
        if high:
            self.inflight_high += d
        else:
            self.inflight_low += d


def _call(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except Exception as e:
        return None, e


class SimDevice(Device):
    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.lanes: tuple[deque[list[Any]], deque[list[Any]]] = (deque(), deque())
        self.done: list[Done] = []

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float) -> None:  # fmt: skip
        self.advance_to(now)
        result, error = _call(run)
        cost = 0.0 if error is not None else float(task.sim_ms)
        self._count(high, 1)
        # [task, remaining ms, cost, result, error, high]
        self.lanes[0 if high else 1].append([task, cost, cost, result, error, high])
        self._finish_zero()

    def _active(self) -> deque[list[Any]] | None:
        for lane in self.lanes:
            if lane:
                return lane
        return None

    def _finish_zero(self) -> None:
        while (lane := self._active()) is not None and lane[0][1] <= EPS_MS:
            task, _, cost, result, error, high = lane.popleft()
            self.done.append(Done(task, cost, result, error, self.t))

    def next_completion(self) -> float | None:
        lane = self._active()
        return None if lane is None else self.t + lane[0][1]

    def advance_to(self, t_ms: float) -> None:
        while t_ms > self.t:
            lane = self._active()
            if lane is None:
                self.t = t_ms
                return
            step = min(lane[0][1], t_ms - self.t)
            lane[0][1] -= step
            self.t += step
            self._finish_zero()

    def collect(self) -> list[Done]:
        out, self.done = self.done, []
        for d in out:
            self._count(d.task._high, -1)
        return out


class HostDevice(Device):
    """CPU backend, measured: the call runs at launch; its wall time is the GPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.done: list[Done] = []

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float) -> None:  # fmt: skip
        t0 = time.perf_counter()
        result, error = _call(run)
        self.done.append(Done(task, (time.perf_counter() - t0) * 1e3, result, error, None))

    def collect(self) -> list[Done]:
        out, self.done = self.done, []
        return out


class CudaDevice(Device):
    """One CUDA stream per priority (blocking streams, so they order with the legacy
    stream the backend and eviction copies use); one completer thread per stream waits on
    each launch's end event without the GIL and hands the measured time back."""

    def __init__(self, backend: Any, notify: Callable[[], None]) -> None:
        super().__init__()
        from pygpukit import _native

        self._native = _native
        self.backend = backend
        self.notify = notify
        self.streams: dict[int, Any] = {}
        self.queues: dict[int, queue.Queue[Any]] = {}
        self.done: queue.Queue[Done] = queue.Queue()
        self.threads: list[threading.Thread] = []

    def _stream(self, priority: int) -> tuple[Any, queue.Queue[Any]]:
        s = self.streams.get(priority)
        if s is None:
            s = self.streams[priority] = self._native.Stream(priority, False)
            q: queue.Queue[Any] = queue.Queue()
            self.queues[priority] = q
            t = threading.Thread(target=self._complete, args=(q,), daemon=True,
                                 name=f"pygpukit-sched-stream{priority}")  # fmt: skip
            t.start()
            self.threads.append(t)
        return s, self.queues[priority]

    def launch(self, task: Any, priority: int, high: bool, run: Callable[[], Any],
               now: float) -> None:  # fmt: skip
        stream, q = self._stream(priority)
        start, end = self._native.Event(True), self._native.Event(True)
        b = self.backend
        old = b.stream
        b.stream = stream  # the compiled call queues its launches on the task's stream
        try:
            start.record(stream)
            result, error = _call(run)
            end.record(stream)
        finally:
            b.stream = old
        self._count(high, 1)
        q.put((task, start, end, result, error))

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
            self.done.put(Done(task, ms, result, error, None))
            self.notify()

    def collect(self) -> list[Done]:
        out = []
        while True:
            try:
                d = self.done.get_nowait()
            except queue.Empty:
                break
            self._count(d.task._high, -1)
            out.append(d)
        return out

    def close(self) -> None:
        for q in self.queues.values():
            q.put(None)
        for t in self.threads:
            t.join(timeout=10)
