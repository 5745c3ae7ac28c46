"""LRU eviction inside the Rust pool, seen from Python: storages over a quota-bound pool
(and an unbounded one whose arena source runs out), with copy callables written here."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _rust
from pygpukit.backends import numpy_backend
from pygpukit.memory import Storage, enable_eviction, eviction_stats

MIB = 1 << 20
SIZE = 200_000  # not a multiple of the 256-byte granule: blocks are rounded up


def _copy_out(addr: int, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(addr), np.uint8).copy()


def _copy_in(host: np.ndarray, addr: int) -> None:
    ctypes.memmove(addr, host.ctypes.data, host.nbytes)


def _read(s: Storage) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * s.nbytes).from_address(s.addr), np.uint8).copy()


def _write(s: Storage, data: np.ndarray) -> None:
    ctypes.memmove(s.addr, data.ctypes.data, data.nbytes)


def _pool(quota: int | None = 4 * MIB, **kw) -> _rust.Pool:
    pool = _rust.Pool(arena_bytes=MIB, quota_bytes=quota, **kw)
    enable_eviction(pool, _copy_out, _copy_in)
    return pool


def _filled(pool: _rust.Pool, rng: np.random.Generator, n: int) -> tuple[list, list]:
    storages, data = [], []
    for _ in range(n):
        s = Storage(pool, SIZE)
        d = rng.integers(1, 256, SIZE, dtype=np.uint8)
        _write(s, d)
        storages.append(s)
        data.append(d)
    return storages, data


def _check_counts(pool: _rust.Pool, storages: list[Storage]) -> dict[str, int]:
    st = eviction_stats(pool)
    resident = [s for s in storages if not s.evicted]
    assert st["tracked"] == len(resident)
    assert st["resident_bytes"] == sum(s.nbytes for s in resident)
    assert st["evicted_now"] == len(storages) - len(resident)
    assert st["evicted_now_bytes"] == sum(s.nbytes for s in storages if s.evicted)
    assert pool.stats()["in_use_bytes"] <= 4 * MIB
    return st


def test_round_trip_of_random_data_under_a_quota():
    rng = np.random.default_rng()
    pool = _pool()
    storages, data = _filled(pool, rng, 60)  # about 12 MiB through a 4 MiB quota
    st = _check_counts(pool, storages)
    assert st["evictions"] > 0 and st["evicted_bytes"] == st["evictions"] * SIZE
    assert storages[0].evicted and not storages[-1].evicted  # least recently used first
    for i in rng.permutation(len(storages)):  # random order: each read may evict others
        np.testing.assert_array_equal(_read(storages[i]), data[i])
        _check_counts(pool, storages)
    st = eviction_stats(pool)
    assert st["restores"] > 0 and st["restored_bytes"] == st["restores"] * SIZE
    for s in storages:
        s.release()
    assert eviction_stats(pool)["tracked"] == eviction_stats(pool)["evicted_now"] == 0
    assert pool.stats()["in_use_bytes"] == 0


def test_arrays_computed_after_eviction_match_numpy(monkeypatch):
    from pygpukit import backends

    b = numpy_backend.NumpyBackend(arena_bytes=MIB, quota_bytes=4 * MIB)
    monkeypatch.setattr(backends, "_backend", b)
    rng = np.random.default_rng()
    hosts = [rng.standard_normal((128, 256)) + 0.5 for _ in range(40)]  # 5 MiB of float32
    arrays = [gpk.asarray(h.astype(np.float32)) for h in hosts]
    assert eviction_stats(b.pool)["evictions"] > 0
    got = arrays[0] * 0.0
    for a in arrays:  # realized step by step: each step needs two arrays resident
        got = (got + a * 0.5).realize()
    want = sum(h.astype(np.float32).astype(np.float64) * 0.5 for h in hosts)
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-5, atol=1e-4)


def test_pinned_storages_never_move_and_unpinned_ones_do():
    rng = np.random.default_rng()
    pool = _pool()
    storages, data = _filled(pool, rng, 12)
    pinned = [storages[i] for i in rng.choice(12, 5, replace=False)]
    addrs = {}
    for s in pinned:
        s.pin()
        addrs[id(s)] = s.addr
    more, more_data = _filled(pool, rng, 30)
    for s in pinned:
        assert not s.evicted and s.pins == 1 and s.addr == addrs[id(s)]
    # Everything else went; a request larger than what unpinned storages hold fails.
    evictions = eviction_stats(pool)["evictions"]
    with pytest.raises(gpk.OutOfMemoryError):
        Storage(pool, 4 * MIB - 5 * SIZE)
    assert eviction_stats(pool)["evictions"] == evictions  # and moved nothing
    for s in pinned:
        s.unpin()
        assert s.pins == 0
    with pytest.raises(ValueError, match="not pinned"):
        pinned[0].unpin()
    _filled(pool, rng, 20)
    assert all(s.evicted for s in pinned)
    for s, d in zip(storages + more, data + more_data, strict=True):
        np.testing.assert_array_equal(_read(s), d)


def test_storages_freed_by_gc_inside_a_copy_callable_are_deferred():
    rng = np.random.default_rng()
    holder: dict[str, object] = {}
    calls = []

    def copy_out(addr: int, nbytes: int) -> np.ndarray:
        calls.append(addr)
        if len(calls) == 1:
            # The last references go, inside a cycle only the collector frees: the victim
            # being copied and another resident storage; and a pin is let go.
            holder.pop("cycle")
            gc.collect()
            holder.pop("pinned").unpin()
        return _copy_out(addr, nbytes)

    pool = _rust.Pool(arena_bytes=MIB, quota_bytes=4 * MIB)
    pool.enable_eviction(copy_out, _copy_in)
    storages = [Storage(pool, SIZE) for _ in range(20)]  # 5 blocks per arena: the quota is full
    keep = storages[3]
    keep.pin()
    holder["pinned"] = keep
    victim, other = storages[0], storages[5]
    cycle: list[object] = [victim, other]
    cycle.append(cycle)
    holder["cycle"] = cycle
    rest = [s for i, s in enumerate(storages) if i not in (0, 5)]
    del storages, victim, other, cycle
    data = rng.integers(1, 256, SIZE, dtype=np.uint8)
    fresh = Storage(pool, SIZE)  # no room: evicts storages[0] and runs the callable
    fresh2 = Storage(pool, 2 * SIZE)
    _write(fresh, data)
    assert len(calls) >= 2 and keep.pins == 0
    st = eviction_stats(pool)
    assert st["tracked"] + st["evicted_now"] == 20 - 2 + 2  # two died, two were added
    block, big = 782 * 256, 1563 * 256  # SIZE and 2 * SIZE rounded to the granule
    assert pool.stats()["in_use_bytes"] == (st["tracked"] - 1) * block + big
    np.testing.assert_array_equal(_read(fresh), data)
    holder.clear()
    del fresh, fresh2, keep, rest
    gc.collect()
    assert pool.stats()["live_blocks"] == 0
    assert eviction_stats(pool)["tracked"] == eviction_stats(pool)["evicted_now"] == 0


class CopyFailed(Exception):
    pass


def test_a_raising_copy_callable_propagates_and_leaves_the_pool_usable():
    rng = np.random.default_rng()
    fail = {"out": False, "in": False}

    def copy_out(addr: int, nbytes: int) -> np.ndarray:
        if fail["out"]:
            raise CopyFailed("copy_out")
        return _copy_out(addr, nbytes)

    def copy_in(host: np.ndarray, addr: int) -> None:
        if fail["in"]:
            raise CopyFailed("copy_in")
        _copy_in(host, addr)

    pool = _rust.Pool(arena_bytes=MIB, quota_bytes=4 * MIB)
    enable_eviction(pool, copy_out, copy_in)
    storages, data = _filled(pool, rng, 20)
    fail["out"] = True
    with pytest.raises(CopyFailed, match="copy_out"):
        Storage(pool, SIZE)
    fail["out"] = False
    first = storages[0]
    assert not first.evicted  # the failed victim stayed where it was
    enable_eviction(pool, lambda a, n: first.addr, copy_in)
    with pytest.raises(RuntimeError, match="re-entrantly"):  # a callable calling back in
        Storage(pool, SIZE)
    enable_eviction(pool, copy_out, copy_in)
    more, more_data = _filled(pool, rng, 5)
    assert first.evicted
    fail["in"] = True
    with pytest.raises(CopyFailed, match="copy_in"):
        _ = first.addr
    assert first.evicted  # its fresh block went back to the pool
    _check_counts(pool, storages + more)
    fail["in"] = False
    for s, d in zip(storages + more, data + more_data, strict=True):
        np.testing.assert_array_equal(_read(s), d)
    _check_counts(pool, storages + more)


class FakeDevice:
    """Arenas from ctypes buffers, MemoryError past `capacity` (as cuMemAlloc's OOM)."""

    def __init__(self, capacity: int) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.capacity = capacity

    def alloc(self, nbytes: int) -> int:
        if sum(len(b) - 256 for b in self.buffers.values()) + nbytes > self.capacity:
            raise MemoryError("fake device full")
        buf = ctypes.create_string_buffer(nbytes + 256)
        base = (ctypes.addressof(buf) + 255) & ~255
        self.buffers[base] = buf
        return base

    def free(self, base: int, nbytes: int) -> None:
        del self.buffers[base]


def test_a_pool_without_quota_evicts_when_its_source_runs_out():
    rng = np.random.default_rng()
    dev = FakeDevice(4 * MIB)
    pool = _pool(None, alloc_arena=dev.alloc, free_arena=dev.free)
    storages, data = _filled(pool, rng, 40)
    assert eviction_stats(pool)["evictions"] > 0
    for i in rng.permutation(len(storages)):
        np.testing.assert_array_equal(_read(storages[i]), data[i])
    for s in storages:
        if not s.evicted:
            s.pin()
    with pytest.raises(gpk.OutOfMemoryError) as info:  # nothing can move: the device's error
        Storage(pool, MIB)
    assert isinstance(info.value.__cause__, MemoryError)
