"""Storage: one block of pool memory, host or device, owned by the Rust pool.

LRU eviction lives in the Rust pool (rust/pygpukit-core/src/pool/eviction.rs): a backend that
registers its copy callables (`enable_eviction`) makes its pool's storages evictable. Under
memory pressure (a pool allocation that fails) the pool itself copies the least recently used
storages that nothing pins to host arrays (copy_out), frees their blocks and retries. A
Storage of such a pool holds the pool's handle for it: any later use reads `storage.addr`,
which asks the pool, and the pool restores the block first (copy_in). So the device address
of a storage can change across an eviction: code that keeps an address beyond one use
(captured CUDA graphs, exported pointers) pins the storage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

CopyOut = Callable[[int, int], np.ndarray]
CopyIn = Callable[[np.ndarray, int], None]


def enable_eviction(pool: Any, copy_out: CopyOut, copy_in: CopyIn) -> None:
    """Make storages of `pool` allocated from now on evictable; copy_out(addr, nbytes)
    returns a host copy of a block, copy_in(host, addr) writes one back."""
    pool.enable_eviction(copy_out, copy_in)


def eviction_stats(pool: Any) -> dict[str, int]:
    """Evictions and restores so far (count and bytes), the evictable storages resident now
    (`tracked`, `resident_bytes`) and those evicted now (`evicted_now`, `evicted_now_bytes`);
    empty for a pool that does not evict."""
    stats = getattr(pool, "eviction_stats", None)
    got = stats() if stats is not None else None
    return {} if got is None else dict(got)


# Explicit releases so far (release(), the only way memory still referenced is freed):
# a compiled call checks its arrays for freed memory only when this moved since its last
# check. A list, so readers bind it once and read one item.
RELEASES = [0]


class Storage:
    """A pool block. Freed when the last value using it dies, or at once by `release()`."""

    __slots__ = ("_addr", "nbytes", "pool", "freed", "_h", "_pins", "gen", "readonly",
                 "__weakref__")  # fmt: skip
    # The pool's handle of an evictable storage (the pool keeps its address, pins and host
    # copy); None for one that never moves.
    _h: int | None
    _pins: int  # pins of a storage that never moves
    gen: int  # bumped when a read of `addr` finds that the block moved
    # Set with GPUArray.readonly: no kernel writes the block, so a kernel may read it before
    # its predecessor on the stream has finished (gemv.gemv's w_early).
    readonly: bool

    def __new__(cls, *args: Any, **kwargs: Any) -> Storage:
        # Subclasses that bypass __init__ (external memory, static views) get the defaults.
        self = object.__new__(cls)
        self._h = None
        self._pins = 0
        self.gen = 0
        self.readonly = False
        return self

    def __init__(self, pool: Any, nbytes: int) -> None:
        addr, h = pool.alloc_storage(nbytes)  # evicts others when it does not fit
        self.pool = pool
        self.nbytes = nbytes
        self.freed = False
        self._addr: int = addr
        self._h = h

    @property
    def addr(self) -> int:
        """The block's address now; restores an evicted block and marks it used."""
        h = self._h
        if h is None:
            return self._addr
        try:
            addr: int = self.pool.touch(h)
        except ValueError:
            if self.freed:  # released by another thread meanwhile
                return self._addr
            raise
        if addr != self._addr:
            self._addr = addr
            self.gen += 1
        return addr

    @addr.setter
    def addr(self, value: int) -> None:
        self._addr = value

    @property
    def evicted(self) -> bool:
        """Whether the block is held on the host now (its next use restores it)."""
        h = self._h
        return h is not None and bool(self.pool.is_evicted(h))

    @property
    def pins(self) -> int:
        """How many pin() calls are not yet matched by unpin()."""
        h = self._h
        return self._pins if h is None else int(self.pool.pins(h))

    def pin(self) -> None:
        """Keep the block resident at a fixed address until the matching unpin()."""
        h = self._h
        if h is None:
            self._pins += 1
            return
        addr = self.pool.pin(h)
        if addr != self._addr:
            self._addr = addr
            self.gen += 1

    def unpin(self) -> None:
        """Release one pin(); the block may be evicted again once none is left."""
        h = self._h
        if h is None:
            self._pins -= 1
        else:
            self.pool.unpin(h)

    def release(self) -> None:
        """Free the block now (the storage must not be read again)."""
        RELEASES[0] += 1
        self._release()

    def _release(self) -> None:
        if not self.freed:
            self.freed = True
            h = self._h
            if h is None:
                self.pool.free(self._addr)
            else:
                self._h = None
                self.pool.forget(h)  # frees the block, or drops the host copy

    def __del__(self) -> None:
        # The pool defers what a GC pass inside one of its own callables releases.
        try:
            h = self._h
            if h is None:
                if type(self) is Storage:
                    self._release()  # not release(): nothing can read it, no check is due
                else:
                    self.release()  # subclasses (external memory, static views) free their way
            elif not self.freed:  # _release() inline: compiled calls free a block per call
                self.freed = True
                self.pool.forget(h)
        except Exception:  # interpreter shutdown: the pool may already be gone
            pass


_new = object.__new__


def block(pool: Any, nbytes: int) -> Storage:
    """Storage(pool, nbytes) without the generic constructor's calls: a compiled function
    allocates its fresh outputs here on every call."""
    addr, h = pool.alloc_storage(nbytes)  # evicts others when it does not fit
    return adopt(pool, nbytes, addr, h)


def adopt(pool: Any, nbytes: int, addr: int, h: int | None) -> Storage:
    """The Storage of a block `pool.alloc_storage(nbytes)` returned as (addr, h), made
    elsewhere (the dispatch controller allocates an eager op's output in its own call)."""
    s: Storage = _new(Storage)
    s.pool, s.nbytes, s.freed, s._addr, s._h, s._pins, s.gen = pool, nbytes, False, addr, h, 0, 0
    s.readonly = False
    return s


def pin_all(storages: Iterable[Storage]) -> list[Storage]:
    """Pin each storage (restoring evicted ones); returns them for unpin_all."""
    done: list[Storage] = []
    try:
        for s in storages:
            s.pin()
            done.append(s)
    except BaseException:
        unpin_all(done)
        raise
    return done


def unpin_all(storages: Iterable[Storage]) -> None:
    for s in storages:
        s.unpin()


@contextmanager
def pinned(storages: Iterable[Storage]) -> Iterator[None]:
    """Storages stay resident at fixed addresses inside the block."""
    held = pin_all(storages)
    try:
        yield
    finally:
        unpin_all(held)
