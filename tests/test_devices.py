"""The device API on the CPU backend's simulated devices (PYGPUKIT_CPU_DEVICES): Device,
device_count, `with gpk.Device(i)`, device= on creation functions, `.device`, copies,
mixing errors, per-device pools, and the scheduler across devices."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import settings
from pygpukit.backends import devices, get_backend

MIB = 1 << 20


@pytest.fixture
def three(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Three simulated devices, made fresh for the test (pools start empty)."""
    if get_backend().name != "cpu":
        pytest.skip("simulated devices are the CPU backend's")
    monkeypatch.setenv(settings.CPU_DEVICES, "3")
    saved = dict(devices._backends), dict(devices._pools), devices.ACTIVE[0]
    prim = devices.primary_ordinal()
    for o in list(devices._backends):
        if o != prim:
            del devices._backends[o]
    yield
    devices._backends.clear()
    devices._backends.update(saved[0])
    devices._pools.clear()
    devices._pools.update(saved[1])
    devices.ACTIVE[0] = saved[2]


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_device_objects_and_count(three: None) -> None:
    assert gpk.device_count() == 3
    assert gpk.current_device() == gpk.Device("cpu") == gpk.Device("cpu:0")
    d = gpk.Device("cpu:2")
    assert (repr(d), str(d), d.kind, d.id) == ("<Device cpu:2>", "cpu:2", "cpu", 2)
    assert len({gpk.Device("cpu:1"), gpk.Device("CPU:1")}) == 1
    assert gpk.Device("cpu:1") != gpk.Device(1)  # a GPU ordinal is another device kind
    with pytest.raises(gpk.errors.GPUKitValueError, match="device 3 does not exist.*3 devices"):
        gpk.zeros(2, device=3)
    with pytest.raises(gpk.errors.GPUKitValueError, match="PYGPUKIT_CPU_DEVICES"):
        with gpk.Device("cpu:7"):
            pass
    with pytest.raises(gpk.DTypeError, match="device must be"):
        gpk.ones(2, device=1.5)
    with pytest.raises(gpk.errors.GPUKitValueError, match="expected 'cpu"):
        gpk.ones(2, device="tpu:0")


def test_cpu_devices_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(settings.CPU_DEVICES, bad)
        with pytest.raises(gpk.SettingError, match="PYGPUKIT_CPU_DEVICES"):
            settings.cpu_devices()
    monkeypatch.setenv(settings.CPU_DEVICE_MEMORY, "lots")
    with pytest.raises(gpk.SettingError, match="PYGPUKIT_CPU_DEVICE_MEMORY"):
        settings.cpu_device_memory()


def test_with_device_places_creation_and_ops(three: None) -> None:
    x, y = _rand((4, 5), 1), _rand((5, 3), 2)
    with gpk.Device(1):  # a GPU ordinal names the simulated device of that number
        assert gpk.current_device() == gpk.Device("cpu:1")
        a, b = gpk.from_numpy(x), gpk.asarray(y)
        c = gpk.nn.gelu(a @ b, approximate="tanh") + 1.0
        with gpk.Device("cpu:2"):  # nested: the inner block wins, the outer comes back
            z = gpk.zeros((2, 2))
        assert gpk.current_device() == gpk.Device("cpu:1")
    assert gpk.current_device() == gpk.Device("cpu")
    assert a.device == b.device == c.device == gpk.Device("cpu:1")
    assert z.device == gpk.Device("cpu:2")
    h = x.astype(np.float64) @ y.astype(np.float64)
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))) + 1.0
    np.testing.assert_allclose(c.to_numpy(), want, rtol=1e-5, atol=1e-5)
    # An op on device 1's arrays outside the block runs on device 1.
    d = (a * 2.0).sum(axis=0)
    assert d.device == gpk.Device("cpu:1")
    np.testing.assert_allclose(d.to_numpy(), (x.astype(np.float64) * 2).sum(0), rtol=1e-5)


def test_current_device_is_per_thread(three: None) -> None:
    seen: list[Any] = []
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        ready.wait(10)
        seen.append(gpk.current_device())
        seen.append(gpk.ones(2).device)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with gpk.Device("cpu:2"):
        ready.set()
        done.wait(10)
        assert gpk.current_device() == gpk.Device("cpu:2")
    t.join(10)
    assert seen == [gpk.Device("cpu"), gpk.Device("cpu")]


CREATORS = [
    ("zeros", lambda dev: gpk.zeros((2, 3), device=dev), lambda: np.zeros((2, 3))),
    ("ones", lambda dev: gpk.ones((2, 3), device=dev), lambda: np.ones((2, 3))),
    ("full", lambda dev: gpk.full((3,), 2.5, device=dev), lambda: np.full(3, 2.5)),
    ("arange", lambda dev: gpk.arange(1, 9, 2, device=dev), lambda: np.arange(1, 9, 2)),
    ("linspace", lambda dev: gpk.linspace(0, 1, 5, device=dev), lambda: np.linspace(0, 1, 5)),
    ("eye", lambda dev: gpk.eye(3, k=1, device=dev), lambda: np.eye(3, k=1)),
    ("from_numpy", lambda dev: gpk.from_numpy(_rand((3, 2), 4), device=dev),
     lambda: _rand((3, 2), 4)),
    ("asarray", lambda dev: gpk.asarray([[1.5, -2.0]], device=dev), lambda: [[1.5, -2.0]]),
    ("normal", lambda dev: gpk.random.normal((4,), seed=7, device=dev),
     lambda: np.random.default_rng(7).normal(0.0, 1.0, 4).astype(np.float32)),
    ("uniform", lambda dev: gpk.random.uniform((4,), seed=8, device=dev),
     lambda: np.random.default_rng(8).uniform(0.0, 1.0, 4).astype(np.float32)),
    ("randint", lambda dev: gpk.random.randint(0, 9, (5,), seed=9, device=dev),
     lambda: np.random.default_rng(9).integers(0, 9, 5)),
]  # fmt: skip


@pytest.mark.parametrize("dev", [2, "cpu:2", gpk.Device("cpu:2")])
@pytest.mark.parametrize(("name", "make", "want"), CREATORS, ids=[c[0] for c in CREATORS])
def test_creation_functions_take_device(three: None, name: str, make: Any, want: Any,
                                        dev: Any) -> None:  # fmt: skip
    a = make(dev)
    assert a.device == gpk.Device("cpu:2"), name
    np.testing.assert_allclose(a.to_numpy().astype(np.float64),
                               np.asarray(want(), dtype=np.float64), rtol=1e-6)  # fmt: skip


def test_empty_and_like_functions_take_device(three: None) -> None:
    e = gpk.empty((4,), device=1)
    assert e.device == gpk.Device("cpu:1") and e.shape == (4,)
    x = gpk.from_numpy(_rand((2, 2), 5), device=1)
    assert gpk.zeros_like(x).device == gpk.Device("cpu:1")  # x's device by default
    o = gpk.ones_like(x, device=2)
    assert o.device == gpk.Device("cpu:2")
    np.testing.assert_array_equal(o.to_numpy(), np.ones((2, 2), np.float32))


def test_ops_mixing_devices_raise(three: None) -> None:
    a = gpk.from_numpy(_rand((3, 4), 1))
    b = gpk.from_numpy(_rand((3, 4), 2), device=1)
    with pytest.raises(gpk.DeviceMismatchError) as info:
        a + b  # noqa: B018 - the op raises when recorded
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, gpk.GPUKitError)
    msg = str(err)
    assert msg.startswith("add: input 0 is on cpu but input 1 is on cpu:1")
    assert "test_devices.py" in msg and "f32[3, 4]" in msg
    with pytest.raises(gpk.DeviceMismatchError, match="matmul"):
        b @ a.T  # noqa: B018
    with pytest.raises(gpk.DeviceMismatchError, match="where"):
        gpk.where(a > 0, a, b)


@pytest.mark.parametrize("via", ["to", "copy_to"])
def test_copies_between_devices(three: None, via: str) -> None:
    x = _rand((4, 6), 3)
    a = gpk.from_numpy(x, device=1)
    view = a.T[1:5]  # a strided view, pending
    pending = a * 3.0
    for src, want in ((a, x), (view, x.T[1:5]), (pending, x.astype(np.float64) * 3)):
        out = src.to(2) if via == "to" else gpk.copy_to(src, gpk.Device("cpu:2"))
        assert out.device == gpk.Device("cpu:2") and src.device == gpk.Device("cpu:1")
        np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-6)
    assert a.to("cpu:1") is a  # already there
    back = a.to(0)
    np.testing.assert_allclose((back + gpk.from_numpy(x)).to_numpy(), 2.0 * x.astype(np.float64),
                               rtol=1e-6)  # fmt: skip
    # The copy is its own memory: writing the original does not change it.
    a[0, 0] = 100.0
    assert back.to_numpy()[0, 0] == x[0, 0]
    with pytest.raises(gpk.DTypeError, match="copy_to"):
        gpk.copy_to(x, 1)


def test_freed_array_copy_raises(three: None) -> None:
    a = gpk.ones(3, device=1)
    a.free()
    with pytest.raises(gpk.FreedArrayError, match="to"):
        a.to(0)


def test_each_device_has_its_own_pool(three: None) -> None:
    pools = {o: devices.backend_for(o).pool_stats()["in_use_bytes"] for o in (0, 1, 2)}
    a = gpk.from_numpy(_rand((256, 256), 6), device=2)  # 256 KiB
    after = {o: devices.backend_for(o).pool_stats()["in_use_bytes"] for o in (0, 1, 2)}
    assert after[2] - pools[2] >= 256 * 256 * 4
    assert after[0] == pools[0] and after[1] == pools[1]
    with gpk.Device(2):
        assert gpk.pool_stats()["in_use_bytes"] == after[2]
    del a


def test_device_memory_quota(three: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.CPU_DEVICE_MEMORY, str(MIB))
    for o in (1, 2):  # made again with the quota
        devices._backends.pop(o, None)
    with pytest.raises(gpk.OutOfMemoryError):
        gpk.from_numpy(np.ones(2 * MIB // 4, np.float32), device=1)
    assert devices.backend_for(1).pool_stats()["quota_bytes"] == MIB
    small = gpk.from_numpy(np.arange(1000, dtype=np.float32), device=2)
    np.testing.assert_array_equal(small.to_numpy(), np.arange(1000, dtype=np.float32))


def test_compiled_function_runs_on_its_arguments_device(three: None) -> None:
    w_host = _rand((8, 8), 11)
    w = gpk.from_numpy(w_host, device=1)

    @gpk.compile
    def step(x: gpk.GPUArray) -> gpk.GPUArray:
        return gpk.nn.silu(x @ w.T)

    for seed in (1, 2, 3):
        xh = _rand((2, 8), seed)
        y = step(gpk.from_numpy(xh, device=1))
        assert y.device == gpk.Device("cpu:1")
        h = xh.astype(np.float64) @ w_host.astype(np.float64).T
        np.testing.assert_allclose(y.to_numpy(), h / (1 + np.exp(-h)), rtol=1e-5, atol=1e-6)
    with pytest.raises(gpk.DeviceMismatchError, match="matmul"):
        step(gpk.from_numpy(_rand((2, 8), 4)))  # device 0's x against device 1's w

    @gpk.compile
    def add(x: gpk.GPUArray, y: gpk.GPUArray) -> gpk.GPUArray:
        return x + y

    with pytest.raises(gpk.DeviceMismatchError, match="arg"):
        add(gpk.ones(2), gpk.ones(2, device=2))


# -- the scheduler across devices ------------------------------------------------------


def _filler() -> Any:
    @gpk.compile
    def fill(n: int, v: float) -> gpk.GPUArray:
        return gpk.full((n, n), v) * 2.0

    return fill


def test_scheduler_places_on_the_device_with_room(three: None) -> None:
    fill = _filler()
    need = fill.reservation(64, 1.5).total
    with gpk.Scheduler(devices=[0, 2], memory=need + need // 2) as sched:
        with sched.paused():
            t1, t2, t3 = (sched.submit(fill, 64, 1.5, sim_ms=1.0) for _ in range(3))
            # t1 on device 0, t2 on device 2 (the one with room now), t3 queues
            st = sched.stats()
            assert st["devices"]["cpu"]["reserved_bytes"] == need
            assert st["devices"]["cpu:2"]["reserved_bytes"] == need
            assert st["reserved_bytes"] == 2 * need and st["queue_length"] == 1
            assert st["capacity_bytes"] == 2 * (need + need // 2)
        results = [t.result(10) for t in (t1, t2, t3)]
    assert [r.device for r in results[:2]] == [gpk.Device("cpu"), gpk.Device("cpu:2")]
    for r in results:
        np.testing.assert_array_equal(r.to_numpy(), np.full((64, 64), 3.0, np.float32))
    assert sched.devices == [gpk.Device("cpu"), gpk.Device("cpu:2")]
    # A plan per device: the call on device 2 missed the cache, saying why.
    assert any(r.startswith("device") and "cpu:2" in r for r in fill.stats()["reasons"])


def test_scheduler_submit_on_a_device_and_by_arguments(three: None) -> None:
    @gpk.compile
    def scale(x: gpk.GPUArray) -> gpk.GPUArray:
        return x * 3.0 - 1.0

    xh = _rand((16, 16), 21)
    with gpk.Scheduler(devices=["cpu:1", gpk.Device("cpu:2")], memory=[4 * MIB, 2 * MIB]) as s:
        assert s.stats()["capacity_bytes"] == 6 * MIB
        t = s.submit(scale, gpk.from_numpy(xh, device=2), sim_ms=0.5)  # follows its argument
        r = t.result(10)
        assert r.device == gpk.Device("cpu:2")
        want = xh.astype(np.float64) * 3 - 1
        np.testing.assert_allclose(r.to_numpy(), want, rtol=1e-6, atol=1e-6)
        assert s.stats((2, t.id))["state"] == "done"
        assert s.stats()["devices"]["cpu:2"]["completed"] == 1
        with pytest.raises(gpk.DeviceMismatchError, match="runs on cpu:1"):
            s.submit(scale, gpk.from_numpy(xh, device=2), device=1)
        with pytest.raises(gpk.errors.GPUKitValueError, match="not one of this scheduler's"):
            s.submit(scale, gpk.from_numpy(xh), device=0)
        fill = _filler()
        u = s.submit(fill, 8, 0.25, device="cpu:1", sim_ms=0.5)
        assert u.result(10).device == gpk.Device("cpu:1")


def test_scheduler_admits_per_device(three: None) -> None:
    fill = _filler()
    need = fill.reservation(64, 1.0).total
    with gpk.Scheduler(devices=[1, 2], memory={1: need, 2: 4 * need}) as s:
        with s.paused():
            a = s.submit(fill, 64, 1.0, device=1, sim_ms=1.0)
            b = s.submit(fill, 64, 1.0, device=1, sim_ms=1.0)  # device 1 is full: it queues
            c = s.submit(fill, 64, 1.0, device=2, sim_ms=1.0)  # device 2 has room: admitted
            st = s.stats()["devices"]
            assert st["cpu:1"]["queue_length"] == 1 and st["cpu:2"]["queue_length"] == 0
            with pytest.raises(gpk.AdmissionRejected, match="guaranteed"):
                s.submit(fill, 64, 1.0, device=1, qos="guaranteed", sim_ms=1.0)
        for t in (a, b, c):
            np.testing.assert_array_equal(t.result(10).to_numpy(),
                                          np.full((64, 64), 2.0, np.float32))  # fmt: skip


def test_scheduler_in_a_device_block_uses_that_device(three: None) -> None:
    fill = _filler()
    with gpk.Device(2):
        sched = gpk.Scheduler(memory=4 * MIB)
    with sched:
        r = sched.submit(fill, 4, 0.5, sim_ms=0.1).result(10)
    assert r.device == gpk.Device("cpu:2")
    np.testing.assert_array_equal(r.to_numpy(), np.ones((4, 4), np.float32))
    with pytest.raises(gpk.errors.GPUKitValueError, match="each once"):
        gpk.Scheduler(devices=[1, 1], memory=MIB)
