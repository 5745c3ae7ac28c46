"""The Rust pool over device memory: arenas come from cuMemAlloc, blocks from the pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit import _native
from pygpukit.errors import CUDAError, OutOfMemoryError
from pygpukit.memory import Storage, block

from . import transfers

CUDA_ERROR_OUT_OF_MEMORY = 2


def _alloc_arena(nbytes: int) -> int:
    try:
        return int(_native.mem_alloc(nbytes))
    except CUDAError as e:
        if getattr(e, "code", None) == CUDA_ERROR_OUT_OF_MEMORY:
            # The pool treats MemoryError from its source as OOM (and keeps its state whole).
            raise MemoryError(str(e)) from None
        raise


def _free_arena(addr: int, nbytes: int) -> None:
    if _native is None:  # interpreter shutdown: module globals are gone, so is the context
        return
    _native.mem_free(addr)


def copy_out(addr: int, nbytes: int) -> np.ndarray:
    """A host copy of a block being evicted, through the transfer engine at low priority,
    after the work queued on the legacy stream (storages in use by a running graph on
    another stream are pinned and never evicted); returns once the host holds it."""
    host = np.empty(max(nbytes, 1), np.uint8)
    transfers.download(host[:nbytes], addr, None, "low")
    return host


def copy_in(host: np.ndarray, addr: int) -> None:
    """Writes an evicted block back, at low priority; returns once it has landed, so work
    on any stream may read it."""
    transfers.upload(addr, host, None, "low").wait()


def make_pool(arena_bytes: int, quota_bytes: int | None) -> Any:
    from pygpukit import _rust

    return _rust.Pool(arena_bytes=arena_bytes, quota_bytes=quota_bytes,
                      alloc_arena=_alloc_arena, free_arena=_free_arena)  # fmt: skip


def allocate(pool: Any, nbytes: int, what: str) -> Storage:
    """A Storage block; on OOM, cached arenas go back to the driver and it is tried once
    more, then OutOfMemoryError names `what` and carries the pool's stats."""
    try:
        return block(pool, nbytes)
    except OutOfMemoryError:
        pool.release_cached()
    try:
        return block(pool, nbytes)
    except OutOfMemoryError as e:
        stats = dict(pool.stats())
        msg = (f"{what}: out of device memory allocating {nbytes} bytes (in use "
               f"{stats.get('in_use_bytes')} B, reserved {stats.get('reserved_bytes')} B, "
               f"quota {stats.get('quota_bytes')})")  # fmt: skip
        err = OutOfMemoryError(msg)
        err.stats = stats  # type: ignore[attr-defined]
        raise err from e
