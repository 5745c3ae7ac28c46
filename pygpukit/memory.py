"""Storage: one block of pool memory, host or device, owned by the Rust pool.

LRU eviction: a backend that registers its pool (`enable_eviction`) makes its storages
evictable. Under memory pressure (a pool allocation that fails) the least recently used
storages that nothing pins are copied to host numpy arrays and their blocks freed; the
allocation is retried. Any later use reads `storage.addr`, which restores the block first,
so the device address of a storage can change across an eviction: code that keeps an
address beyond one use (captured CUDA graphs, exported pointers) pins the storage.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from pygpukit.errors import OutOfMemoryError

CopyOut = Callable[[int, int], np.ndarray]
CopyIn = Callable[[np.ndarray, int], None]


class _Lru:
    """The evictable storages of one pool, least recently used first."""

    def __init__(self, pool: Any, copy_out: CopyOut, copy_in: CopyIn) -> None:
        self.pool = pool
        self.copy_out = copy_out
        self.copy_in = copy_in
        # id(storage) -> weakref: the registry must not keep arrays alive.
        self.order: OrderedDict[int, weakref.ref[Storage]] = OrderedDict()
        # Re-entrant: releasing a storage from a GC pass inside an eviction takes it again.
        self.lock = threading.RLock()
        self.stats = {"evictions": 0, "evicted_bytes": 0, "restores": 0, "restored_bytes": 0}

    def alloc(self, nbytes: int) -> int:
        """A pool block; on OOM, evicts LRU unpinned storages until the allocation fits."""
        try:
            return int(self.pool.alloc(nbytes))
        except OutOfMemoryError as first:
            err = first
        with self.lock:
            quota = self.pool.quota_bytes
            if quota is not None:
                in_use = int(self.pool.stats()["in_use_bytes"])
                evictable = sum(s.nbytes for s in self._victims(1 << 62))
                if nbytes > quota - in_use + evictable:
                    raise err  # cannot fit even if everything moved out: disturb nothing
            while True:
                victims = self._victims(nbytes)
                if not victims:
                    raise err
                for s in victims:
                    self._evict(s)
                try:
                    return int(self.pool.alloc(nbytes))
                except OutOfMemoryError as again:  # fragmentation: free blocks not adjacent
                    err = again

    def _victims(self, nbytes: int) -> list[Storage]:
        out: list[Storage] = []
        got = 0
        for ref in list(self.order.values()):  # a snapshot: GC may release storages meanwhile
            s = ref()
            if s is None or s.pins or s.freed or s.host is not None:
                continue
            out.append(s)
            got += s.nbytes
            if got >= nbytes:
                break
        return out

    def _evict(self, s: Storage) -> None:
        s.host = self.copy_out(s._addr, s.nbytes)
        self.pool.free(s._addr)
        s.gen += 1
        self.order.pop(id(s), None)
        self.stats["evictions"] += 1
        self.stats["evicted_bytes"] += s.nbytes

    def restore(self, s: Storage) -> None:
        with self.lock:
            host = s.host
            if host is None or s.freed:
                return
            addr = self.alloc(s.nbytes)  # s is out of `order`, so it cannot evict itself
            self.copy_in(host, addr)
            s._addr = addr
            s.host = None
            s.gen += 1
            self.order[id(s)] = weakref.ref(s)
            self.stats["restores"] += 1
            self.stats["restored_bytes"] += s.nbytes

    def resident_bytes(self) -> int:
        return sum(s.nbytes for r in list(self.order.values()) if (s := r()) is not None)


_registries: dict[int, _Lru] = {}


def enable_eviction(pool: Any, copy_out: CopyOut, copy_in: CopyIn) -> None:
    """Make storages of `pool` allocated from now on evictable; copy_out(addr, nbytes)
    returns a host copy of a block, copy_in(host, addr) writes one back."""
    _registries[id(pool)] = _Lru(pool, copy_out, copy_in)


def eviction_stats(pool: Any) -> dict[str, int]:
    """Evictions and restores so far, and the storages evicted now (count and bytes)."""
    lru = _registries.get(id(pool))
    if lru is None:
        return {}
    out = dict(lru.stats)
    out["tracked"] = len(lru.order)
    return out


# Explicit releases so far (release(), the only way memory still referenced is freed):
# a compiled call checks its arrays for freed memory only when this moved since its last
# check. A list, so readers bind it once and read one item.
RELEASES = [0]


class Storage:
    """A pool block. Freed when the last value using it dies, or at once by `release()`."""

    __slots__ = ("_addr", "nbytes", "pool", "freed", "host", "pins", "gen", "_lru",
                 "readonly", "__weakref__")  # fmt: skip
    host: np.ndarray | None  # the host copy while evicted
    pins: int
    gen: int  # bumped when the block moves (evicted, restored)
    _lru: _Lru | None
    # Set with GPUArray.readonly: no kernel writes the block, so a kernel may read it before
    # its predecessor on the stream has finished (gemv.gemv's w_early).
    readonly: bool

    def __new__(cls, *args: Any, **kwargs: Any) -> Storage:
        # Subclasses that bypass __init__ (external memory, static views) get the defaults.
        self = object.__new__(cls)
        self._lru = None
        self.host = None
        self.pins = 0
        self.gen = 0
        self.readonly = False
        return self

    def __init__(self, pool: Any, nbytes: int) -> None:
        self.pool = pool
        self.nbytes = nbytes
        self.freed = False
        lru = _registries.get(id(pool))
        if lru is None:
            self._addr: int = pool.alloc(nbytes)
        else:
            self._addr = lru.alloc(nbytes)
            self._lru = lru
            lru.order[id(self)] = weakref.ref(self)

    @property
    def addr(self) -> int:
        """The block's address now; restores an evicted block and marks it used."""
        lru = self._lru
        if lru is not None:
            if self.host is not None:
                lru.restore(self)
            try:
                lru.order.move_to_end(id(self))
            except KeyError:  # released (or evicted) by another thread meanwhile
                pass
        return self._addr

    @addr.setter
    def addr(self, value: int) -> None:
        self._addr = value

    @property
    def evicted(self) -> bool:
        return self.host is not None

    def pin(self) -> None:
        """Keep the block resident at a fixed address until the matching unpin()."""
        lru = self._lru
        if lru is None:
            self.pins += 1
            return
        with lru.lock:
            if self.host is not None:
                lru.restore(self)
            self.pins += 1

    def unpin(self) -> None:
        lru = self._lru
        if lru is None:
            self.pins -= 1
            return
        with lru.lock:
            self.pins -= 1

    def release(self) -> None:
        RELEASES[0] += 1
        lru = self._lru
        if lru is None:
            self._release()
            return
        with lru.lock:  # not in the middle of another thread's eviction of this block
            self._release()

    def _release(self) -> None:
        if not self.freed:
            self.freed = True
            lru = self._lru
            if lru is not None:
                lru.order.pop(id(self), None)
            if self.host is not None:
                self.host = None  # the block went back at eviction
            else:
                self.pool.free(self._addr)

    def __del__(self) -> None:
        # No lock: nothing else references this storage, and a GC pass may run inside a
        # pool callable while another thread holds the registry lock.
        try:
            lru = self._lru
            if lru is None:
                if type(self) is Storage:
                    self._release()  # not release(): nothing can read it, no check is due
                else:
                    self.release()  # subclasses (external memory, static views) free their way
            elif not self.freed:  # _release() inline: compiled calls free a block per call
                self.freed = True
                lru.order.pop(id(self), None)
                if self.host is None:
                    self.pool.free(self._addr)
                else:
                    self.host = None
        except Exception:  # interpreter shutdown: the pool may already be gone
            pass


_new = object.__new__


def block(pool: Any, nbytes: int) -> Storage:
    """Storage(pool, nbytes) without the generic constructor's calls: a compiled function
    allocates its fresh outputs here on every call."""
    s: Storage = _new(Storage)
    s.pool, s.nbytes, s.freed, s.host, s.pins, s.gen, s._lru = pool, nbytes, False, None, 0, 0, None
    s.readonly = False
    lru = _registries.get(id(pool))
    if lru is None:
        s._addr = pool.alloc(nbytes)
        return s
    try:
        s._addr = pool.alloc(nbytes)
    except OutOfMemoryError:
        s._addr = lru.alloc(nbytes)  # evicts until it fits, or raises
    s._lru = lru
    lru.order[id(s)] = weakref.ref(s)
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
