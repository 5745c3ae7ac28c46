"""Host/device copies of the CUDA backend, through the Rust transfer engine.

Importing this module registers the native module's copy C ABI with the Rust extension
(`_rust.register_copy_capi(_native.copy_capi())`); the engine (`_rust.TransferEngine`, one
per device, created on first use) then runs copies on its own upload and download streams,
ordered with the backend's stream through events, and keeps each copy's host array alive
until the copy has run. Pageable arrays are staged through the engine's pinned chunks;
page-locked memory (a HostBuffer, torch's pinned tensors) is copied by DMA directly.

Priorities: "high" for a decode step's small uploads, "normal" for user copies, "low" for
model loading and eviction. Model loading goes through the engine's bulk upload
(upload_staged, `TransferEngine.htod_bulk`), which stages its pageable sources on several
threads at once: one thread's host memcpy is far slower than the DMA it feeds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit import _native, _rust

_rust.register_copy_capi(_native.copy_capi())

_engines: dict[int, Any] = {}
_lock = threading.Lock()


def engine() -> Any:
    """The current device's transfer engine, created (with its streams) on first use."""
    device = int(_native.get_device())
    eng = _engines.get(device)
    if eng is None:
        with _lock:
            eng = _engines.get(device)
            if eng is None:
                eng = _engines[device] = _rust.TransferEngine()
    return eng


def stream_id(stream: Any) -> int:
    """A stream as the engine takes it: None (the legacy default stream) is 0."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    return int(stream.handle)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def upload(dst: int, array: np.ndarray, stream: Any, priority: str = "normal") -> Any:
    """Copies the C-contiguous `array` to device address `dst` after the work queued on
    `stream` and before the work queued on it later; returns the engine's Transfer. A
    pageable array may be changed once this returns."""
    if not array.flags.c_contiguous:
        raise ValueError("upload needs a C-contiguous array")
    return engine().htod(dst, _address(array), array.nbytes, array, priority, stream_id(stream))


def download(out: np.ndarray, src: int, stream: Any, priority: str = "normal",
             deferred: bool = False) -> Any:  # fmt: skip
    """Copies out.nbytes from device address `src` into the C-contiguous, writable `out`
    after the work queued on `stream`. Unless deferred, `out` holds the data on return
    (pinned `out`: once the transfer is done); deferred copies reach `out` when the
    returned Transfer is found done."""
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("download needs a C-contiguous, writable array")
    return engine().dtoh(_address(out), src, out.nbytes, out, priority, stream_id(stream),
                         deferred)  # fmt: skip


def upload_staged(jobs: Sequence[tuple[int, np.ndarray]], stream: Any,
                  progress: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """Copies each C-contiguous array of `jobs` to its device address (model loading)
    through the engine's bulk upload: staged through pinned buffers on several threads at
    once, after the work queued on `stream` and before the work queued on it later.
    progress(nbytes) is called on this thread as pieces are issued. Returns once every
    copy has landed: the arrays (views of a memory map) may be closed at once."""
    raw = []
    for dst, array in jobs:
        if not array.flags.c_contiguous:
            raise ValueError("upload_staged needs C-contiguous arrays")
        raw.append((dst, _address(array), array.nbytes))
    keep = [array for _, array in jobs]
    engine().htod_bulk(raw, keep, stream_id(stream), progress).wait()
