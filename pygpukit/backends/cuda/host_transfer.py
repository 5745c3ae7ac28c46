"""Device-to-host copies that return before the data arrives.

A copy goes into a pinned buffer on the backend's stream, followed by an event; waiting
waits for that event only, so work queued after the copy keeps the GPU busy (a decode loop
reads token i while step i+1 runs). The device error word rides along in the same copy,
so a kernel error is still reported at the wait without a full synchronisation.
Pinned buffers are reused by size class: allocating pinned memory costs far more than a
small copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit import _native
from pygpukit.memory import pin_all, unpin_all

from .errorword import WORDS
from .value import DeviceValue

_ERR_BYTES = WORDS * 8
_MIN_CLASS = 256


def _size_class(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (nbytes - 1).bit_length())


class PinnedBuffers:
    """Pinned host buffers and their events, by size class, for reuse."""

    def __init__(self) -> None:
        self._free: dict[int, list[tuple[Any, Any]]] = {}

    def take(self, nbytes: int) -> tuple[Any, Any]:
        free = self._free.get(_size_class(nbytes))
        if free:
            return free.pop()
        return _native.HostBuffer(_size_class(nbytes)), _native.Event(False)

    def give(self, buf: Any, event: Any) -> None:
        self._free.setdefault(buf.nbytes, []).append((buf, event))


class HostTransfer:
    """A device value on its way to host memory; result() waits for it alone."""

    def __init__(self, backend: Any, value: DeviceValue) -> None:
        self._backend = backend
        self.shape, self.dtype = value.shape, value.dtype
        self._nbytes = value.size * value.dtype.itemsize
        self._buffers: PinnedBuffers = backend.pinned_buffers
        self._buf, self._event = self._buffers.take(self._nbytes + _ERR_BYTES)
        # The source must stay put (no eviction, no reuse) until the copy has run.
        self._pins = pin_all([value.storage])
        host = np.frombuffer(self._buf, np.uint8)
        stream = backend.stream
        if self._nbytes:
            _native.memcpy_dtoh_async(host[: self._nbytes], value.ptr, stream)
        err = host[self._nbytes : self._nbytes + _ERR_BYTES]
        _native.memcpy_dtoh_async(err, backend._err.addr, stream)
        self._event.record(stream)
        self._result: np.ndarray | None = None

    def done(self) -> bool:
        return self._result is not None or bool(self._event.query())

    def result(self) -> np.ndarray:
        if self._result is None:
            self._event.synchronize()
            host = np.frombuffer(self._buf, np.uint8)
            failed = int(host[self._nbytes : self._nbytes + _ERR_BYTES].view(np.int64)[0])
            data = host[: self._nbytes].copy()
            self._release()  # read everything first: the next transfer may take the buffer
            if failed:
                self._backend.synchronize()  # raises the recorded error with its op and line
            self._result = data.view(self.dtype.np).reshape(self.shape)
        return self._result

    def _release(self) -> None:
        """Unpins the source and returns the pinned buffer to the pool, once: a buffer
        given back twice would be handed to two transfers at the same time."""
        if self._buf is not None:
            unpin_all(self._pins)
            self._pins = []
            self._buffers.give(self._buf, self._event)
            self._buf = None

    def __del__(self) -> None:
        try:
            if self._buf is not None:
                self._event.synchronize()  # the copy must land before the buffer is reused
                self._release()
        except Exception:  # interpreter shutdown
            pass
