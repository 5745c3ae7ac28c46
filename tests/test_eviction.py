"""LRU eviction to host under pool pressure, on the CPU backend with a small quota."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends import numpy_backend
from pygpukit.memory import Storage, eviction_stats

MIB = 1 << 20
QUOTA = 4 * MIB


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> numpy_backend.NumpyBackend:
    from pygpukit import backends

    b = numpy_backend.NumpyBackend(arena_bytes=MIB, quota_bytes=QUOTA)
    monkeypatch.setattr(backends, "_backend", b)
    return b


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32) + 0.5  # never all zeros


def test_round_trip_preserves_data_and_counts(backend):
    rng = np.random.default_rng()
    host = [_rand(rng, 256, 256) for _ in range(24)]  # 24 x 256 KiB: 1.5x the quota
    arrays = [gpk.asarray(h) for h in host]
    st = eviction_stats(backend.pool)
    assert st["evictions"] > 0
    assert backend.pool_stats()["in_use_bytes"] <= QUOTA
    evicted = [a for a in arrays if backend.storage(a._node.realized).evicted]
    assert evicted and evicted[0] is arrays[0]  # least recently used went first
    for a, h in zip(arrays, host, strict=True):
        np.testing.assert_array_equal(a.to_numpy(), h)
    assert eviction_stats(backend.pool)["restores"] >= len(evicted)


def test_lazy_ops_and_views_on_evicted_arrays(backend):
    rng = np.random.default_rng()
    a_h, b_h = _rand(rng, 256, 256), _rand(rng, 256, 256)
    a, b = gpk.asarray(a_h), gpk.asarray(b_h)
    va = a[3:200:2, 5:].T  # a strided view sharing a's block
    filler = [gpk.asarray(_rand(rng, 256, 256)) for _ in range(20)]
    assert backend.storage(a._node.realized).evicted
    np.testing.assert_allclose((a * 2.0 + b).to_numpy(), a_h * 2.0 + b_h, rtol=1e-6)
    np.testing.assert_array_equal(va.to_numpy(), a_h[3:200:2, 5:].T)
    for _ in range(2):  # evict again, and read the view through a moved block
        filler += [gpk.asarray(_rand(rng, 256, 256)) for _ in range(16)]
        filler = filler[-12:]
        np.testing.assert_array_equal(va.to_numpy(), a_h[3:200:2, 5:].T)
    assert eviction_stats(backend.pool)["restores"] >= 2


def test_pinned_storages_stay_and_impossible_requests_evict_nothing(backend):
    rng = np.random.default_rng()
    keep_h = _rand(rng, 256, 256)
    keep = gpk.asarray(keep_h)
    st = backend.storage(keep._node.realized)
    addr = st.addr
    st.pin()
    try:
        others = [gpk.asarray(_rand(rng, 256, 256)) for _ in range(30)]
        assert not st.evicted and st.addr == addr
        before = eviction_stats(backend.pool)["evictions"]
        with pytest.raises(gpk.OutOfMemoryError):
            gpk.empty((2 * QUOTA // 4,), gpk.float32)
        assert eviction_stats(backend.pool)["evictions"] == before
        held = [s for o in others if not (s := backend.storage(o._node.realized)).evicted]
        for s in held:
            s.pin()
        with pytest.raises(gpk.OutOfMemoryError):  # everything is pinned: nothing can move
            gpk.empty((MIB // 4,), gpk.float32)
        for s in held:
            s.unpin()
        gpk.empty((MIB // 4,), gpk.float32)  # now it fits by evicting
    finally:
        st.unpin()
    np.testing.assert_array_equal(keep.to_numpy(), keep_h)


def test_freeing_evicted_arrays_returns_nothing_twice(backend):
    rng = np.random.default_rng()
    arrays = [gpk.asarray(_rand(rng, 256, 256)) for _ in range(24)]
    evicted = [a for a in arrays if backend.storage(a._node.realized).evicted]
    assert evicted
    for a in evicted:
        a.free()
    del arrays, evicted, a
    gc.collect()
    st = backend.pool_stats()
    assert st["in_use_bytes"] == 0 and st["live_blocks"] == 0
    assert eviction_stats(backend.pool)["tracked"] == 0


def test_compiled_graph_pins_what_it_captured(backend):
    rng = np.random.default_rng()
    w_h = _rand(rng, 128, 128)
    w = gpk.asarray(w_h)

    @gpk.compile
    def step(x):
        return gpk.nn.gelu(x @ w)

    x_h = _rand(rng, 16, 128)
    x = gpk.asarray(x_h)
    want = step(x).to_numpy()
    w_st = backend.storage(w._node.realized)
    x_st = backend.storage(x._node.realized)
    filler = [gpk.asarray(_rand(rng, 256, 256)) for _ in range(24)]
    assert not w_st.evicted and w_st.pins > 0  # the bound graph keeps its weight in place
    assert x_st.evicted and x_st.pins == 0  # an argument is pinned only during a call
    np.testing.assert_allclose(step(x).to_numpy(), want, rtol=1e-6)
    del filler


def test_scheduler_admission_evicts_idle_arrays(backend):
    rng = np.random.default_rng()
    w_h = _rand(rng, 256, 256)
    w = gpk.asarray(w_h)

    @gpk.compile
    def big(x):
        return (x @ w) * 0.5 + x

    x_h = _rand(rng, 256, 256)
    x = gpk.asarray(x_h)
    want = x_h @ w_h * 0.5 + x_h
    idle_h = [_rand(rng, 256, 256) for _ in range(8)]
    idle = [gpk.asarray(h) for h in idle_h]
    with gpk.Scheduler(memory=QUOTA) as sched:
        tasks = [sched.submit(big, x, sim_ms=1.0) for _ in range(3)]
        for t in tasks:
            np.testing.assert_allclose(t.result(10).to_numpy(), want, rtol=1e-5)
        st = sched.stats()
        assert st["eviction"]["evictions"] > 0 and st["reserved_bytes"] == 0
    for a, h in zip(idle, idle_h, strict=True):
        np.testing.assert_array_equal(a.to_numpy(), h)


def test_unregistered_pools_never_evict():
    from pygpukit import _rust

    pool = _rust.Pool(arena_bytes=MIB, quota_bytes=MIB)
    a = Storage(pool, 512 * 1024)
    with pytest.raises(gpk.OutOfMemoryError):
        Storage(pool, 768 * 1024)
    assert not a.evicted


def test_dlpack_export_pins_until_the_consumer_lets_go(backend):
    rng = np.random.default_rng()
    h = _rand(rng, 256, 256)
    a = gpk.asarray(h)
    st = backend.storage(a._node.realized)
    view = np.from_dlpack(a)  # zero-copy: the consumer holds the address
    filler = [gpk.asarray(_rand(rng, 256, 256)) for _ in range(24)]
    assert not st.evicted and st.pins == 1
    np.testing.assert_array_equal(view, h)
    del view
    gc.collect()
    assert st.pins == 0
    filler += [gpk.asarray(_rand(rng, 256, 256)) for _ in range(16)]
    assert st.evicted
    np.testing.assert_array_equal(a.to_numpy(), h)
