"""Device-to-host copies that return before the data arrives.

The copy is a deferred download of the transfer engine (transfers.py): it lands in one of
the engine's pinned buffers on the download stream, after the backend's queued work, and
reaches the result array when the transfer is waited for, so work queued after the copy
keeps the GPU busy (a decode loop reads token i while step i+1 runs). The device error
word rides along in a second download behind the first, so a kernel error is still
reported at the wait without a full synchronisation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.memory import pin_all, unpin_all

from . import transfers
from .errorword import WORDS
from .value import DeviceValue


class HostTransfer:
    """A device value on its way to host memory; result() waits for it alone."""

    def __init__(self, backend: Any, value: DeviceValue) -> None:
        self._backend = backend
        self.shape, self.dtype = value.shape, value.dtype
        self._data = np.empty(value.size * value.dtype.itemsize, np.uint8)
        self._err = np.empty(WORDS, np.int64)
        # The source must stay put (no eviction, no reuse) until the copy has run.
        self._pins = pin_all([value.storage])
        try:
            stream = backend.stream
            self._copies = [
                transfers.download(self._data, value.ptr, stream, deferred=True),
                transfers.download(self._err, backend.err_addr, stream, deferred=True),
            ]
        except BaseException:
            self._release()
            raise
        self._result: np.ndarray | None = None

    def done(self) -> bool:
        """True once the copy has landed (result() will not wait)."""
        return self._result is not None or all(c.done() for c in self._copies)

    def result(self) -> np.ndarray:
        """The host copy; raises the recorded error if a kernel before the copy failed."""
        if self._result is None:
            try:
                for c in self._copies:
                    # done() asks without letting go of the interpreter lock: once the
                    # data has landed the error word has too, and a wait() that returns
                    # at once still hands the lock to a busy thread (the HTTP loop) and
                    # queues for it again (up to the switch interval).
                    if not c.done():
                        c.wait()
            finally:
                self._release()
            if int(self._err[0]):
                self._backend.synchronize()  # raises the recorded error with its op and line
            self._result = self._data.view(self.dtype.np).reshape(self.shape)
        return self._result

    def _release(self) -> None:
        """Unpins the source, once."""
        unpin_all(self._pins)
        self._pins = []
