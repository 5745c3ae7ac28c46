"""Task: one submitted launch of a compiled function, and its future."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygpukit.compile import Reservation

    from .scheduler import Scheduler


class Task:
    """A compiled-graph launch the scheduler admitted or queued. `result()` waits for it
    (without holding the GIL) and returns what the function returned, or raises what it
    raised (OutOfMemoryError if its arena could not be allocated, CancelledError)."""

    def __init__(self, sched: Scheduler, task_id: int, fn: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], tenant: str, qos: str, partition: str,
                 reservation: Reservation, sim_ms: float, submitted_ms: float) -> None:  # fmt: skip
        self.id = task_id
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.tenant, self.qos, self.partition = tenant, qos, partition
        self.reservation = reservation
        self.reserved_bytes = reservation.total  # submit(memory=...) may reserve more
        self.sim_ms = sim_ms
        self.submitted_ms = submitted_ms
        self.admitted_ms: float | None = None
        self.started_ms: float | None = None
        self.finished_ms: float | None = None
        self.gpu_ms: float | None = None
        self.stream_priority: int | None = None
        self.arena: Any = None  # the pool block reserved at admission
        self._state = "queued"
        self._high = False
        # Set by a device whose launches a waiting thread can wait on directly (CUDA: the
        # end event); it ends the task if it is first.
        self._wait_gpu: Callable[[], None] | None = None
        self._sched = sched
        self._future: Future[Any] = Future()

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
        wait = self._wait_gpu
        if wait is not None and timeout is None and not self._future.done():
            try:
                wait()
            except Exception:  # a kernel fault: the completer thread reports it
                pass
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the task and return the exception it raised, or None.

        Args:
            timeout: Seconds to wait at most, or None for no limit.

        Returns:
            The exception, or None when the task succeeded.
        """
        return self._future.exception(timeout)

    def done(self) -> bool:
        """Whether the task has ended (done, failed or cancelled), without waiting.

        Returns:
            True once it has ended.
        """
        return self._future.done()

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

        def since(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return {
            "id": self.id,
            "tenant": self.tenant,
            "qos": self.qos,
            "partition": self.partition,
            "state": self._state,
            "reservation_bytes": self.reserved_bytes,
            "arena_bytes": self.reservation.arena_bytes,
            "holds_arena": self.arena is not None,
            "stream_priority": self.stream_priority,
            "submitted_ms": self.submitted_ms,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "queue_ms": since(self.submitted_ms, self.started_ms),
            "latency_ms": since(self.submitted_ms, self.finished_ms),
            "gpu_ms": self.gpu_ms,
        }

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.tenant} {self.qos} {self._state}>"
