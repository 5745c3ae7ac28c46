"""The device API on the CUDA backend. One GPU: Device(0) and its block, `.device`, a copy
to the same device, the thread's driver device. Two or more (skipped otherwise): work on
device 1 against float64 NumPy, peer (or host) copies both ways, the mixing error, a pool
per device, a compiled call captured on device 1, and the scheduler across two GPUs."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native
from pygpukit.backends import devices

pytestmark = pytest.mark.gpu


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def two(cuda: Any) -> Any:
    if _native.device_count() < 2:
        pytest.skip("needs two GPUs")
    return cuda


def test_device_zero(cuda: Any) -> None:
    assert gpk.device_count() == _native.device_count() >= 1
    here = gpk.current_device()
    assert here == gpk.Device(_native.get_device()) and here.kind == "cuda"
    x = _rand((64, 48), 1)
    with gpk.Device(here.id) as d:
        assert d == here and gpk.current_device() == here
        a = gpk.from_numpy(x)
        b = gpk.nn.silu(a * 2.0)
    assert a.device == b.device == here
    h = x.astype(np.float64) * 2
    np.testing.assert_allclose(b.to_numpy(), h / (1 + np.exp(-h)), rtol=1e-5, atol=1e-6)
    assert a.to(here) is a and gpk.copy_to(a, here.id) is a
    with pytest.raises(gpk.errors.GPUKitValueError, match="CPU backend"):
        gpk.zeros(3, device="cpu:0")
    n = gpk.device_count()
    with pytest.raises(gpk.errors.GPUKitValueError, match=f"device {n} does not exist"):
        gpk.ones(3, device=n)


def test_thread_device_is_its_own(cuda: Any) -> None:
    # use_device changes this thread's device only; -1 hands it back to the process's.
    base = _native.get_device()
    seen: list[int] = []

    def other() -> None:
        seen.append(_native.get_device())

    _native.use_device(base)
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    _native.use_device(-1)
    assert seen == [base] and _native.get_device() == base


def test_work_and_pools_on_device_one(two: Any) -> None:
    x, w = _rand((32, 64), 2), _rand((48, 64), 3)
    before0 = devices.backend_for(0).pool_stats()["in_use_bytes"]
    with gpk.Device(1):
        a, b = gpk.from_numpy(x), gpk.from_numpy(w)
        y = gpk.nn.gelu(a @ b.T)
        assert gpk.pool_stats()["in_use_bytes"] >= (x.nbytes + w.nbytes)
    assert y.device == gpk.Device(1)
    h = x.astype(np.float64) @ w.astype(np.float64).T
    from math import erf

    want = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    np.testing.assert_allclose(y.to_numpy(), want, rtol=2e-2, atol=2e-2)
    assert devices.backend_for(0).pool_stats()["in_use_bytes"] == before0
    assert devices.backend_for(1).pool is not devices.backend_for(0).pool


def test_copies_between_gpus(two: Any) -> None:
    from pygpukit.device_copy import peer_path

    x = _rand((128, 96), 4)
    a = gpk.from_numpy(x)
    b = a.to(1)
    assert b.device == gpk.Device(1)
    np.testing.assert_array_equal(b.to_numpy(), x)
    view = b.T[3:40]  # strided: made contiguous on device 1 first
    c = gpk.copy_to(view, 0)
    np.testing.assert_array_equal(c.to_numpy(), x.T[3:40])
    assert peer_path(1, 0) in ("peer", "host")
    d = (b * 2.0).to(0) + a
    np.testing.assert_allclose(d.to_numpy(), 3.0 * x, rtol=1e-6)


def test_mixing_gpus_raises(two: Any) -> None:
    a = gpk.ones((4, 4))
    b = gpk.ones((4, 4), device=1)
    with pytest.raises(gpk.DeviceMismatchError, match="add: input 0 is on cuda:0 but input 1 "
                       "is on cuda:1"):  # fmt: skip
        a + b  # noqa: B018


def test_compiled_call_captured_on_device_one(two: Any) -> None:
    w_host = _rand((64, 64), 5)
    w = gpk.from_numpy(w_host, device=1)

    @gpk.compile
    def step(x: gpk.GPUArray) -> gpk.GPUArray:
        return gpk.nn.silu(x @ w.T) + 1.0

    for seed in range(4):
        xh = _rand((8, 64), 10 + seed)
        y = step(gpk.from_numpy(xh, device=1))
        assert y.device == gpk.Device(1)
        h = xh.astype(np.float64) @ w_host.astype(np.float64).T
        np.testing.assert_allclose(y.to_numpy(), h / (1 + np.exp(-h)) + 1, rtol=1e-3, atol=1e-3)


def test_scheduler_across_two_gpus(two: Any) -> None:
    @gpk.compile
    def scale(x: gpk.GPUArray) -> gpk.GPUArray:
        return x * 3.0

    xs = [_rand((256, 256), 20 + k) for k in range(4)]
    with gpk.Scheduler(devices=[0, 1], memory=64 << 20) as s:
        tasks = [s.submit(scale, gpk.from_numpy(x, device=k % 2)) for k, x in enumerate(xs)]
        for k, (t, x) in enumerate(zip(tasks, xs, strict=True)):
            r = t.result(30)
            assert r.device == gpk.Device(k % 2)
            np.testing.assert_allclose(r.to_numpy(), 3.0 * x.astype(np.float64), rtol=1e-6)
        st = s.stats()["devices"]
        assert st["cuda:0"]["completed"] == 2 and st["cuda:1"]["completed"] == 2
