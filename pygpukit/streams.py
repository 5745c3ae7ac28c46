"""User-facing CUDA streams and events (thin wrappers over pygpukit._native)."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import CUDAError


def _native_cuda() -> Any:
    from pygpukit import _native

    if not _native.driver_available():
        raise CUDAError(f"CUDA is not available: {_native.driver_unavailable_reason()}")
    return _native


class Stream:
    """A CUDA stream. Work the backend queues runs on the legacy default stream, so a
    kernel launched on another stream sees it only after a synchronisation."""

    def __init__(self, priority: int = 0, non_blocking: bool = True) -> None:
        self._s = _native_cuda().Stream(priority, non_blocking)

    @property
    def handle(self) -> int:
        """The raw `CUstream` handle, as an int (for interop with other CUDA libraries)."""
        return int(self._s.handle)

    @property
    def native(self) -> Any:
        """The underlying `pygpukit._native.Stream` (what `gpk.jit` kernels launch on)."""
        return self._s

    def synchronize(self) -> None:
        """Wait until all work queued on this stream has finished."""
        self._s.synchronize()

    def query(self) -> bool:
        """Whether all work queued on this stream has finished, without waiting.

        Returns:
            True when the stream is idle.
        """
        return bool(self._s.query())

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"gpk.Stream(handle=0x{self.handle:x})"


class Event:
    """A CUDA event: record it on a stream, wait for it, time between two of them.

    Args:
        timing: Whether `elapsed_time` may read it (as torch.cuda.Event's enable_timing).
        blocking: Whether `synchronize` sleeps until the GPU signals the event (as
            torch.cuda.Event's blocking) rather than spinning a CPU core on it, which is
            what the driver does otherwise: lower latency, but a core taken from the
            process's other threads for as long as the wait lasts.
    """

    def __init__(self, timing: bool = True, blocking: bool = False) -> None:
        self._e = _native_cuda().Event(timing, blocking)

    def record(self, stream: Stream | None = None) -> Event:
        """Record the event on `stream` (None: the legacy default stream the backend uses).

        Args:
            stream: The stream, or None.

        Returns:
            The event itself, so `e = gpk.Event().record()` works.
        """
        self._e.record(None if stream is None else stream.native)
        return self

    def synchronize(self) -> None:
        """Wait until the work before the recorded event has finished."""
        self._e.synchronize()

    def query(self) -> bool:
        """Whether the work before the recorded event has finished, without waiting.

        Returns:
            True when it has.
        """
        return bool(self._e.query())

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to `end`."""
        return float(self._e.elapsed_time(end._e))


def synchronize() -> None:
    """Wait for all queued GPU work; raises errors kernels recorded (bad indices)."""
    from pygpukit.backends import get_backend

    get_backend().synchronize()


__all__ = ["Event", "Stream", "synchronize"]
