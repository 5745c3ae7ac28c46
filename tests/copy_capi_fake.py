"""A fake of the native module's copy C ABI (native/src/capi_copy.h, PgkCopyApi) in
ctypes, so the Rust transfer engine's Python glue runs without a GPU. "Device memory" is
host memory; work queued on a stream runs only when something forces it (an event
synchronize, a wait of another stream being run, the stream's destruction), as in the
cargo tests' fake, so a copy never waited for shows up as missing bytes. Freed "pinned"
memory is poisoned and kept.

The engine keeps a plain reference to the table, so every table made here lives as long
as the process."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from typing import Any

NAME = b"pygpukit._native.copy_capi"
NOT_READY = 600
POISON = 0xEE

_fn, _int, _u64, _ptr, _size = (ctypes.CFUNCTYPE, ctypes.c_int, ctypes.c_uint64,
                                 ctypes.c_void_p, ctypes.c_size_t)  # fmt: skip
_intp, _u64p = ctypes.POINTER(_int), ctypes.POINTER(_u64)
_FIELDS = [
    ("stream_priority_range", _fn(_int, _intp, _intp)),
    ("stream_create", _fn(_int, _int, _u64p)),
    ("stream_destroy", _fn(None, _u64)),
    ("event_create", _fn(_int, _int, _u64p)),
    ("event_destroy", _fn(None, _u64)),
    ("event_record", _fn(_int, _u64, _u64)),
    ("event_query", _fn(_int, _u64)),
    ("event_synchronize", _fn(_int, _u64)),
    ("stream_wait_event", _fn(_int, _u64, _u64)),
    ("host_alloc", _fn(_int, _size, ctypes.POINTER(_ptr))),
    ("host_free", _fn(None, _ptr)),
    ("host_is_pinned", _fn(_int, _ptr)),
    ("memcpy_htod_async", _fn(_int, _u64, _ptr, _size, _u64)),
    ("memcpy_dtoh_async", _fn(_int, _ptr, _u64, _size, _u64)),
    ("last_error", _fn(_int, _ptr, _size)),
]


class PgkCopyApi(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32),
                *((name, kind) for name, kind in _FIELDS)]  # fmt: skip


_KEEP: list[Any] = []  # tables, callbacks and fakes: never freed (see the docstring)


class FakeCopyDevice:
    """The device behind one fake table. fail_uploads_after(n) makes the n-th upload
    from then on (0: the next) fail with code 700."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.streams: dict[int, dict[str, Any]] = {0: self._stream()}
        self.events: dict[int, tuple[int, int] | None] = {}
        self.pinned: dict[int, Any] = {}
        self.freed: list[Any] = []
        self.next_handle = 0
        self.fail_at: int | None = None
        self.uploads = 0
        self.error = (0, b"")
        self.table = PgkCopyApi(1, ctypes.sizeof(PgkCopyApi),
                                *(kind(getattr(self, name)) for name, kind in _FIELDS))  # fmt: skip
        _KEEP.append(self)

    @staticmethod
    def _stream() -> dict[str, Any]:
        return {"ops": deque(), "queued": 0, "executed": 0}

    def capsule(self) -> Any:
        """The table as the PyCapsule _rust.register_copy_capi takes."""
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.table), NAME, None)

    def fail_uploads_after(self, n: int) -> None:
        with self.lock:
            self.fail_at = n

    def _handle(self) -> int:
        self.next_handle += 1
        return self.next_handle

    def _run(self, stream: int, upto: int) -> None:
        s = self.streams[stream]
        while s["executed"] < upto:
            op = s["ops"].popleft()
            s["executed"] += 1
            if op[0] == "copy":
                ctypes.memmove(op[1], op[2], op[3])
            else:
                self._run(op[1], op[2])

    def _push(self, stream: int, op: tuple[Any, ...]) -> None:
        s = self.streams[stream]
        s["ops"].append(op)
        s["queued"] += 1

    # The C ABI.
    def stream_priority_range(self, least: Any, greatest: Any) -> int:
        least[0], greatest[0] = 0, -5
        return 0

    def stream_create(self, priority: int, out: Any) -> int:
        with self.lock:
            h = self._handle()
            self.streams[h] = self._stream()
            out[0] = h
        return 0

    def stream_destroy(self, stream: int) -> None:
        with self.lock:
            self._run(stream, self.streams[stream]["queued"])
            del self.streams[stream]

    def event_create(self, timing: int, out: Any) -> int:
        with self.lock:
            h = self._handle()
            self.events[h] = None
            out[0] = h
        return 0

    def event_destroy(self, event: int) -> None:
        with self.lock:
            del self.events[event]

    def event_record(self, event: int, stream: int) -> int:
        with self.lock:
            self.events[event] = (stream, self.streams[stream]["queued"])
        return 0

    def event_query(self, event: int) -> int:
        with self.lock:
            at = self.events[event]
            return 0 if at is None or self.streams[at[0]]["executed"] >= at[1] else NOT_READY

    def event_synchronize(self, event: int) -> int:
        with self.lock:
            at = self.events[event]
            if at is not None:
                self._run(*at)
        return 0

    def stream_wait_event(self, stream: int, event: int) -> int:
        with self.lock:
            at = self.events[event]
            if at is not None:
                self._push(stream, ("wait", *at))
        return 0

    def host_alloc(self, nbytes: int, out: Any) -> int:
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        with self.lock:
            self.pinned[ctypes.addressof(buf)] = buf
        out[0] = ctypes.addressof(buf)
        return 0

    def host_free(self, ptr: int) -> None:
        with self.lock:
            buf = self.pinned.pop(ptr)
            ctypes.memset(buf, POISON, len(buf))
            self.freed.append(buf)

    def host_is_pinned(self, ptr: int | None) -> int:
        p = ptr or 0
        with self.lock:
            return int(any(b <= p < b + len(buf) for b, buf in self.pinned.items()))

    def memcpy_htod_async(self, dst: int, src: int, nbytes: int, stream: int) -> int:
        with self.lock:
            self.uploads += 1
            if self.fail_at is not None:
                if self.fail_at == 0:
                    self.fail_at = None
                    self.error = (700, b"fake: an illegal memory access")
                    return 700
                self.fail_at -= 1
            self._push(stream, ("copy", dst, src, nbytes))
        return 0

    def memcpy_dtoh_async(self, dst: int, src: int, nbytes: int, stream: int) -> int:
        with self.lock:
            self._push(stream, ("copy", dst, src, nbytes))
        return 0

    def last_error(self, buf: int | None, cap: int) -> int:
        code, message = self.error
        if buf and cap:
            n = min(cap - 1, len(message))
            ctypes.memmove(buf, message, n)
            ctypes.memset(buf + n, 0, 1)
        return code

    @property
    def pinned_bytes(self) -> int:
        with self.lock:
            return sum(len(b) for b in self.pinned.values())
