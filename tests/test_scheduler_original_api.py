"""The original project's scheduler call: submit(fn, memory="512MB", bandwidth=0.20,
policy="guaranteed") and stats(task_id), on the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends import numpy_backend
from pygpukit.scheduler import args as check

MIB = 1 << 20


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> numpy_backend.NumpyBackend:
    from pygpukit import backends

    b = numpy_backend.NumpyBackend(arena_bytes=MIB, quota_bytes=2048 * MIB)
    monkeypatch.setattr(backends, "_backend", b)
    return b


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("512MB", 512 * 10**6),
        ("1.5GiB", 3 * 2**29),
        ("4096", 4096),
        (" 64 kib ", 64 * 1024),
        (1 << 20, 1 << 20),
        ("2TB", 2 * 10**12),
    ],
)
def test_memory_sizes(text: object, nbytes: int) -> None:
    assert check.memory_size("f", "memory", text) == nbytes


@pytest.mark.parametrize("text", ["512 parsecs", "MB", "-1MB", "1e3MB", ""])
def test_bad_memory_sizes(text: str) -> None:
    with pytest.raises(gpk.GPUKitError, match="512MB") as info:
        check.memory_size("Scheduler.submit", "memory", text)
    assert isinstance(info.value, ValueError)


def test_submit_with_memory_and_policy(backend: numpy_backend.NumpyBackend) -> None:
    rng = np.random.default_rng()
    xn, wn = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))

    @gpk.compile
    def fn(x, w):
        return gpk.tanh(x @ w)

    x, w = gpk.asarray(xn.astype(np.float32)), gpk.asarray(wn.astype(np.float32))
    with gpk.Scheduler(memory=1024 * MIB) as scheduler:
        task = scheduler.submit(fn, x, w, memory="512MB", bandwidth=0.20, policy="guaranteed")
        live = scheduler.stats(task.id)
        assert live["qos"] == "guaranteed" and live["reservation_bytes"] == 512 * 10**6
        np.testing.assert_allclose(task.result(10).to_numpy(), np.tanh(xn @ wn), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
        ended = scheduler.stats(task.id)
        assert ended == task.stats() == scheduler.stats(task)
        assert ended["state"] == "done" and ended["reservation_bytes"] == 512 * 10**6
        # Without memory=, the plan's need is reserved.
        t2 = scheduler.submit(fn, x, w, policy="best_effort")
        t2.result(10)
        assert scheduler.stats(t2.id)["reservation_bytes"] == fn.reservation(x, w).total
        with pytest.raises(gpk.GPUKitError, match="less than") as info:
            scheduler.submit(fn, x, w, memory=16)
        assert isinstance(info.value, ValueError)
        with pytest.raises(gpk.GPUKitError, match="qos must be one of"):
            scheduler.submit(fn, x, w, policy="platinum")
        with pytest.raises(gpk.GPUKitError, match="not both"):
            scheduler.submit(fn, x, w, qos="guaranteed", policy="guaranteed")
        with pytest.raises(ValueError, match="no task 999999"):
            scheduler.stats(999999)
        with pytest.raises(TypeError, match="task_id"):
            scheduler.stats("first")  # type: ignore[arg-type]
