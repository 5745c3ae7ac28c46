"""The Rust memory pool seen from Python: real memory, disjoint blocks, errors."""

from __future__ import annotations

import ctypes
import gc
import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygpukit._rust import Pool
from pygpukit.errors import GPUKitError, OutOfMemoryError

MIB = 1 << 20

STATS_KEYS = {
    "arenas",
    "reserved_bytes",
    "in_use_bytes",
    "peak_in_use_bytes",
    "live_blocks",
    "free_blocks",
    "largest_free_block",
    "alloc_count",
    "free_count",
    "quota_bytes",
    "oom_count",
    "arena_bytes",
}


def view(addr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy array over pool memory (no copy)."""
    buf = (ctypes.c_uint8 * nbytes).from_address(addr)
    return np.frombuffer(buf, dtype=np.uint8)


def test_numpy_arrays_over_pool_memory_hold_data():
    pool = Pool(arena_bytes=4 * MIB)
    rng = np.random.default_rng(1)
    addr = pool.alloc(1000 * 4)
    assert addr % 256 == 0
    assert pool.size_of(addr) == 4096
    a = view(addr, 4000).view(np.float32)
    data = rng.standard_normal(1000).astype(np.float32)
    a[:] = data
    # A second, independent view of the same address sees what the first wrote.
    b = np.frombuffer((ctypes.c_float * 1000).from_address(addr), dtype=np.float32)
    np.testing.assert_array_equal(b, data)
    assert float(b.sum()) == pytest.approx(float(data.sum()), rel=1e-5)
    pool.free(addr)


def test_live_blocks_never_overlap():
    pool = Pool(arena_bytes=2 * MIB)
    rnd = random.Random(7)
    live: dict[int, tuple[int, int]] = {}
    for step in range(600):
        if live and rnd.random() < 0.4:
            addr = rnd.choice(list(live))
            n, seed = live.pop(addr)
            np.testing.assert_array_equal(view(addr, n), pattern(n, seed))
            pool.free(addr)
            continue
        n = rnd.choice([0, 1, 255, 256, 257, rnd.randint(1, 5000), rnd.randint(1, 3 * MIB)])
        addr = pool.alloc(n)
        assert addr % 256 == 0 and addr not in live
        assert pool.size_of(addr) == max(256, -(-n // 256) * 256)
        if n:
            view(addr, n)[:] = pattern(n, step)
        live[addr] = (n, step)
    for addr, (n, seed) in live.items():
        np.testing.assert_array_equal(view(addr, n), pattern(n, seed))
    spans = sorted((a, a + max(n, 1)) for a, (n, _) in live.items())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    for addr in live:
        pool.free(addr)
    s = pool.stats()
    assert s["in_use_bytes"] == 0 and s["live_blocks"] == 0
    assert s["free_blocks"] == s["arenas"]
    assert pool.release_cached() == s["reserved_bytes"]
    assert pool.stats()["reserved_bytes"] == 0


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def test_zero_byte_allocations_are_distinct():
    pool = Pool(arena_bytes=MIB)
    addrs = [pool.alloc(0) for _ in range(10)]
    assert len(set(addrs)) == 10
    assert all(pool.size_of(a) == 256 for a in addrs)


def test_stats_keys_and_counts():
    pool = Pool(arena_bytes=MIB, quota_bytes=8 * MIB)
    s = pool.stats()
    assert set(s) == STATS_KEYS
    assert s["quota_bytes"] == 8 * MIB and s["arena_bytes"] == MIB
    assert Pool().stats()["quota_bytes"] is None
    a = pool.alloc(1000)
    b = pool.alloc(3 * MIB)  # larger than an arena: a dedicated one of 4 MiB
    s = pool.stats()
    assert s["arenas"] == 2 and s["reserved_bytes"] == 5 * MIB
    assert s["in_use_bytes"] == 1024 + 3 * MIB
    assert (s["alloc_count"], s["free_count"], s["live_blocks"]) == (2, 0, 2)
    pool.free(b)
    pool.free(a)
    s = pool.stats()
    assert s["peak_in_use_bytes"] == 1024 + 3 * MIB and s["in_use_bytes"] == 0
    assert s["largest_free_block"] == 4 * MIB


def test_oom_raises_and_leaves_the_pool_whole():
    pool = Pool(arena_bytes=MIB, quota_bytes=4 * MIB)
    held = [pool.alloc(900 * 1024) for _ in range(4)]
    for i, a in enumerate(held):
        view(a, 16)[:] = i
    before = pool.stats()
    with pytest.raises(OutOfMemoryError) as info:
        pool.alloc(2 * MIB)
    err = info.value
    assert isinstance(err, MemoryError) and isinstance(err, GPUKitError)
    msg = str(err)
    assert "2097152" in msg and "quota 4194304" in msg and "largest free block" in msg
    assert err.requested_bytes == 2 * MIB
    assert err.stats["in_use_bytes"] == before["in_use_bytes"]
    after = pool.stats()
    assert after["oom_count"] == before["oom_count"] + 1
    assert {k: v for k, v in after.items() if k != "oom_count"} == {
        k: v for k, v in before.items() if k != "oom_count"
    }
    for i, a in enumerate(held):
        assert (view(a, 16) == i).all()
    small = pool.alloc(1000)
    pool.free(small)
    pool.free(held[0])
    pool.free(held[1])
    # The two emptied arenas serve new requests without growing past the quota.
    big = pool.alloc(MIB)
    assert pool.size_of(big) == MIB


def test_oom_for_absurd_request():
    pool = Pool(arena_bytes=MIB)
    with pytest.raises(OutOfMemoryError):
        pool.alloc(2**64 - 1)
    with pytest.raises(ValueError):
        pool.alloc(-1)


def test_double_and_foreign_free_raise_value_error():
    pool = Pool(arena_bytes=MIB)
    a = pool.alloc(100)
    b = pool.alloc(100)
    pool.free(a)
    with pytest.raises(ValueError, match=hex(a)):
        pool.free(a)
    with pytest.raises(ValueError, match=hex(b + 16)):
        pool.free(b + 16)
    with pytest.raises(ValueError, match="outside every arena"):
        pool.free(12345)
    with pytest.raises(ValueError):
        pool.free(-a)
    with pytest.raises(ValueError):
        pool.size_of(a)
    s = pool.stats()
    assert (s["live_blocks"], s["free_count"]) == (1, 1)
    pool.free(b)


class FakeDevice:
    """Arena callables backed by ctypes buffers, recording every call."""

    def __init__(self, capacity: int | None = None):
        self.buffers: dict[int, ctypes.Array] = {}
        self.allocs: list[int] = []
        self.frees: list[tuple[int, int]] = []
        self.capacity = capacity

    def alloc(self, nbytes: int) -> int:
        used = sum(len(b) - 256 for b in self.buffers.values())
        if self.capacity is not None and used + nbytes > self.capacity:
            raise MemoryError(f"fake device full: {used} + {nbytes}")
        buf = ctypes.create_string_buffer(nbytes + 256)
        base = (ctypes.addressof(buf) + 255) & ~255
        self.buffers[base] = buf
        self.allocs.append(nbytes)
        return base

    def free(self, base: int, nbytes: int) -> None:
        assert base in self.buffers, "freed an arena twice or never allocated"
        self.frees.append((base, nbytes))
        del self.buffers[base]


def test_python_arena_source_is_called_and_given_back():
    dev = FakeDevice()
    pool = Pool(arena_bytes=MIB, alloc_arena=dev.alloc, free_arena=dev.free)
    a = pool.alloc(1000)
    b = pool.alloc(5 * MIB)
    assert dev.allocs == [MIB, 6 * MIB]
    bases = sorted(dev.buffers)
    assert any(base <= a < base + MIB for base in bases)
    view(b, 5 * MIB)[:] = 3
    assert pool.release_cached() == 0  # both arenas still hold a block
    pool.free(a)
    assert pool.release_cached() == MIB
    assert len(dev.frees) == 1 and dev.frees[0][1] == MIB
    pool.free(b)
    assert pool.release_cached() == 6 * MIB
    assert not dev.buffers
    del pool
    gc.collect()
    assert len(dev.frees) == 2


def test_dropping_the_pool_returns_its_arenas():
    dev = FakeDevice()
    pool = Pool(arena_bytes=MIB, alloc_arena=dev.alloc, free_arena=dev.free)
    pool.alloc(10)
    pool.alloc(2 * MIB)
    del pool
    gc.collect()
    assert not dev.buffers and len(dev.frees) == 2


def test_device_oom_releases_cache_then_raises_from_the_source_error():
    dev = FakeDevice(capacity=3 * MIB)
    pool = Pool(arena_bytes=MIB, alloc_arena=dev.alloc, free_arena=dev.free)
    keep = pool.alloc(MIB)
    tmp = pool.alloc(MIB)
    pool.free(tmp)
    # 2 MiB does not fit next to 2 MiB of arenas; the idle one is released and it fits.
    big = pool.alloc(2 * MIB)
    assert pool.stats()["arenas"] == 2 and len(dev.frees) == 1
    with pytest.raises(OutOfMemoryError) as info:
        pool.alloc(MIB)
    assert isinstance(info.value.__cause__, MemoryError)
    assert "fake device full" in str(info.value)
    pool.free(keep)
    pool.free(big)


def test_source_bugs_surface_unchanged():
    def bad_alloc(n):
        raise TypeError("boom")

    pool = Pool(arena_bytes=MIB, alloc_arena=bad_alloc, free_arena=lambda b, n: None)
    with pytest.raises(TypeError, match="boom"):
        pool.alloc(10)
    misaligned = Pool(arena_bytes=MIB, alloc_arena=lambda n: 0x1001, free_arena=lambda b, n: None)
    with pytest.raises(ValueError, match="aligned"):
        misaligned.alloc(10)
    with pytest.raises(ValueError):
        Pool(alloc_arena=bad_alloc)


def test_reentrant_callable_raises_instead_of_deadlocking():
    holder: dict[str, Pool] = {}
    dev = FakeDevice()

    def alloc(n):
        holder["pool"].alloc(1)
        return dev.alloc(n)

    holder["pool"] = Pool(arena_bytes=MIB, alloc_arena=alloc, free_arena=dev.free)
    with pytest.raises(RuntimeError, match="re-entrantly"):
        holder["pool"].alloc(10)
    assert holder["pool"].stats()["reserved_bytes"] == 0


def test_free_from_inside_an_arena_callable_is_deferred_not_lost():
    """A GC pass during cuMemAlloc may drop arrays and free their blocks."""
    holder: dict[str, object] = {}
    dev = FakeDevice()

    def alloc(n):
        pool = holder["pool"]
        victim = holder.pop("victim", None)
        if victim is not None:
            pool.free(victim)
        return dev.alloc(n)

    pool = Pool(arena_bytes=MIB, alloc_arena=alloc, free_arena=dev.free)
    holder["pool"] = pool
    victim = pool.alloc(1000)
    holder["victim"] = victim
    big = pool.alloc(2 * MIB)  # needs a new arena: the callable frees `victim`
    s = pool.stats()
    assert s["live_blocks"] == 1 and s["in_use_bytes"] == pool.size_of(big)
    with pytest.raises(ValueError):
        pool.size_of(victim)
    pool.free(big)
    assert pool.release_cached() == 3 * MIB


def test_threads_share_a_pool():
    pool = Pool(arena_bytes=MIB)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rnd = random.Random(seed)
            mine = []
            for _ in range(300):
                n = rnd.randint(0, 20000)
                a = pool.alloc(n)
                view(a, 8)[:] = seed
                mine.append(a)
                if rnd.random() < 0.5:
                    x = mine.pop(rnd.randrange(len(mine)))
                    assert (view(x, 8) == seed).all()
                    pool.free(x)
            for x in mine:
                assert (view(x, 8) == seed).all()
                pool.free(x)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert pool.stats()["in_use_bytes"] == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 4096), st.integers(4096, 3 * MIB), st.just(-1)),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([None, 4 * MIB, 10 * MIB]),
)
def test_random_sequences_keep_stats_consistent(ops, quota):
    """-1 frees the oldest live block; other values allocate that many bytes."""
    pool = Pool(arena_bytes=MIB, quota_bytes=quota)
    live: list[int] = []
    for op in ops:
        if op < 0:
            if live:
                pool.free(live.pop(0))
        else:
            try:
                live.append(pool.alloc(op))
            except OutOfMemoryError as e:
                assert quota is not None and e.stats["largest_free_block"] < op
        s = pool.stats()
        assert s["in_use_bytes"] == sum(pool.size_of(a) for a in live)
        assert quota is None or s["reserved_bytes"] <= quota
    for a in live:
        pool.free(a)
    reserved = pool.stats()["reserved_bytes"]
    assert pool.release_cached() == reserved
    assert pool.stats()["reserved_bytes"] == 0
