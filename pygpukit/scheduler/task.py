"""Task: one submitted launch of a compiled function, and its future."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygpukit.compile import Reservation

    from .scheduler import Scheduler

# Guards making a task's Future against ending the task: a Future is made only when
# someone asks for one (a thread that must block on another thread's end, a callback),
# not on every submit (its Condition costs more than the scheduler's own bookkeeping).
_FUTURE_LOCK = threading.Lock()


class Task:
    """A compiled-graph launch the scheduler admitted or queued. `result()` waits for it
    (without holding the GIL) and returns what the function returned, or raises what it
    raised (OutOfMemoryError if its arena could not be allocated, CancelledError)."""

    # Slots: a Task is made on every submit, and its fields are set on the hot path.
    __slots__ = ("id", "fn", "args", "kwargs", "tenant", "qos", "partition", "reservation",
                 "reserved_bytes", "sim_ms", "submitted_ms", "admitted_ms", "started_ms",
                 "finished_ms", "gpu_ms", "stream_priority", "arena", "_state", "_high",
                 "_wait_gpu", "_end_claimed", "_waited", "_outcome", "_sched", "_fut", "_final",
                 "_ticket", "__weakref__")  # fmt: skip

    def __init__(self, sched: Scheduler, task_id: int, fn: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], tenant: str, qos: str, partition: str,
                 reservation: Reservation, sim_ms: float, submitted_ms: float,
                 reserved_bytes: int | None = None, high: bool = False, arena: Any = None,
                 stream_priority: int | None = None, started_ms: float | None = None,
                 ) -> None:  # fmt: skip
        """A queued task; started_ms: one started at once (the native step's, step.rs,
        in `arena` on the `stream_priority` stream), its fields set here in one call."""
        self.id = task_id
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.tenant, self.qos, self.partition = tenant, qos, partition
        self.reservation = reservation
        # submit(memory=...) may reserve more than the plan's need.
        self.reserved_bytes = reservation.total if reserved_bytes is None else reserved_bytes
        self.sim_ms = sim_ms
        self.submitted_ms = submitted_ms
        self.admitted_ms: float | None = started_ms
        self.started_ms: float | None = started_ms
        self.finished_ms: float | None = None
        self.gpu_ms: float | None = None
        self.stream_priority: int | None = stream_priority
        self.arena: Any = arena  # the pool block reserved at admission
        self._state = "queued" if started_ms is None else "running"
        self._high = high  # on the high-priority lane (Guaranteed, or a "high" partition)
        # Set by a device whose launches a waiting thread can wait on directly (CUDA: the
        # end event, for at most the timeout given, or with no argument for as long as it
        # takes); it ends the task if it is first.
        self._wait_gpu: Callable[..., None] | None = None
        self._end_claimed = False  # set by the device thread or waiter that ends it
        self._waited = False  # a thread waits on its end with no timeout (it ends it)
        self._outcome: Any = None  # result or exception (cancelled: None)
        self._sched = sched
        self._fut: Future[Any] | None = None  # made on demand (see _future)
        self._final = False  # ended and its outcome delivered (result() needs no Future)
        # The compiled function's check of the arguments at submission, for a launch made
        # right then (CompiledFunction.reserve_matched); None once launched.
        self._ticket: Any = None

    @property
    def _future(self) -> Future[Any]:
        """The task's concurrent.futures.Future, made on first use (settled at once when
        the task has already ended)."""
        fut = self._fut
        if fut is not None:
            return fut
        with _FUTURE_LOCK:
            if self._fut is None:
                fut = Future()
                if self._final:
                    _settle(fut, self._state, self._outcome)
                self._fut = fut
            return self._fut

    def _deliver(self) -> None:
        """The task has ended (state and outcome set): its result() returns from now on,
        and its Future, if one was made, is settled (callbacks run here)."""
        with _FUTURE_LOCK:
            self._final = True
            fut = self._fut
        if fut is not None:
            _settle(fut, self._state, self._outcome)

    def _outcome_now(self) -> Any:
        """What result() returns or raises once the task has ended."""
        state = self._state
        if state == "done":
            return self._outcome
        if state == "cancelled":
            raise CancelledError()
        raise self._outcome

    @property
    def state(self) -> str:
        """queued (waiting for memory), admitted (holds its arena, waiting for pacing),
        running, done, failed or cancelled."""
        return self._state

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task and return what the function returned.

        Args:
            timeout: Seconds to wait at most, or None for no limit.

        Returns:
            The compiled function's result.

        Raises:
            OutOfMemoryError: The task's arena could not be allocated.
            concurrent.futures.CancelledError: The task was cancelled.
            TimeoutError: `timeout` passed first.
            Exception: Whatever the function raised.
        """
        if not self._final:
            wait = self._wait_gpu
            if wait is not None and timeout is None:
                # A closed-loop client's usual wait, inline: _wait_for_gpu(None) (no
                # argument: the wait's default, no tuple to make and take apart).
                try:
                    wait()
                except Exception:  # a kernel fault: the device's thread or collect() does
                    pass
                left = None
            else:
                left = self._wait_for_gpu(timeout)
            if not self._final:
                return self._future.result(left)
        if self._state == "done":  # _outcome_now's usual case, inline
            return self._outcome
        return self._outcome_now()

    def _wait_for_gpu(self, timeout: float | None) -> float | None:
        """Wait on the launch's end directly where the device allows (and end the task if
        this thread gets there first); returns what is left of the timeout."""
        wait = self._wait_gpu
        if wait is None or self._final:
            return timeout
        if timeout is None:  # a closed-loop client's usual wait: no clock to read
            try:
                wait(None)
            except Exception:  # a kernel fault: the device's thread or collect() reports it
                pass
            return None
        t0 = time.perf_counter()
        try:
            wait(timeout)
        except Exception:  # a kernel fault: the device's thread or collect() reports it
            pass
        return None if timeout is None else max(0.0, timeout - (time.perf_counter() - t0))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the task and return the exception it raised, or None.

        Args:
            timeout: Seconds to wait at most, or None for no limit.

        Returns:
            The exception, or None when the task succeeded.
        """
        left = self._wait_for_gpu(timeout)
        if not self._final:
            return self._future.exception(left)
        if self._state == "cancelled":
            raise CancelledError()
        return None if self._state == "done" else self._outcome

    def done(self) -> bool:
        """Whether the task has ended (done, failed or cancelled), without waiting.

        Returns:
            True once it has ended.
        """
        if not self._final and self._wait_gpu is not None:
            self._wait_for_gpu(0.0)  # a launch that has ended is ended here
        return self._final

    def cancel(self) -> bool:
        """Withdraws a queued or admitted task (its arena goes back to the pool); False
        once it runs or has ended."""
        return self._sched._cancel(self)

    def stats(self) -> dict[str, Any]:
        """The task's figures: id, tenant, qos, partition, state, reservation and arena
        bytes, whether it holds its arena, stream priority, submit/start/finish times, queueing
        delay, latency and GPU time (milliseconds on the scheduler's clock; None until known).

        Returns:
            A new dict.
        """

        return self._stats_of(self._record())

    def _record(self) -> tuple[Any, ...]:
        """The figures stats() reports, as a tuple (what the scheduler keeps of an ended
        task: the dict is built only when asked for)."""
        return (self.id, self.tenant, self.qos, self.partition, self._state,
                self.reserved_bytes, self.reservation.arena_bytes, self.arena is not None,
                self.stream_priority, self.submitted_ms, self.started_ms, self.finished_ms,
                self.gpu_ms)  # fmt: skip

    @staticmethod
    def _stats_of(record: tuple[Any, ...]) -> dict[str, Any]:
        """stats() of a _record()."""

        def since(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        (tid, tenant, qos, partition, state, reserved, arena_bytes, holds, prio, submitted,
         started, finished, gpu) = record  # fmt: skip
        return {
            "id": tid,
            "tenant": tenant,
            "qos": qos,
            "partition": partition,
            "state": state,
            "reservation_bytes": reserved,
            "arena_bytes": arena_bytes,
            "holds_arena": holds,
            "stream_priority": prio,
            "submitted_ms": submitted,
            "started_ms": started,
            "finished_ms": finished,
            "queue_ms": since(submitted, started),
            "latency_ms": since(submitted, finished),
            "gpu_ms": gpu,
        }

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.tenant} {self.qos} {self._state}>"


def _settle(fut: Future[Any], state: str, outcome: Any) -> None:
    """Gives an ended task's outcome to its Future."""
    if state == "cancelled":
        fut.cancel()
        fut.set_running_or_notify_cancel()
    elif state == "done":
        fut.set_result(outcome)
    else:
        fut.set_exception(outcome)
