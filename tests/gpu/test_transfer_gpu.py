"""The Rust transfer engine on a real GPU: round trips of random data of many sizes and
dtypes against NumPy (staged and pinned), sources dropped while their copy is in flight,
an upload overlapping a running kernel (measured with events), and to_numpy_async while a
CUDA Graph replays."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native as nv
from pygpukit.backends.cuda import toolchain, transfers

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

SPIN = r"""
extern "C" __global__ void spin(long long cycles, int* out) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  if (threadIdx.x == 0) out[blockIdx.x] = 1;
}
"""
SPIN_CYCLES = 400_000_000  # about 0.2 s at 2 GHz: far longer than any copy below

SIZES = [1, 3, 17, 4095, 4096, 4097, 65_537, (1 << 20) + 7, (8 << 20) + 13, 33_554_467, 64 << 20]
DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16, np.float32,
          np.float64]  # fmt: skip


@pytest.fixture(scope="module")
def spin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    old = os.environ.get("PYGPUKIT_CACHE_DIR")
    os.environ["PYGPUKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    try:
        yield nv.Module(toolchain.compile_kernel(SPIN, toolchain.device_arch())).get_function(
            "spin"
        )
    finally:
        if old is None:
            del os.environ["PYGPUKIT_CACHE_DIR"]
        else:
            os.environ["PYGPUKIT_CACHE_DIR"] = old


def random_array(rng: np.random.Generator, nbytes: int, dtype: Any) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    n = max(1, nbytes // itemsize)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return rng.standard_normal(n).astype(dtype)


def pinned_array(nbytes: int) -> tuple[Any, np.ndarray]:
    buf = nv.HostBuffer(nbytes)
    return buf, np.frombuffer(buf, np.uint8)


def _ptr(a: Any) -> int:
    """The device address of a realized GPUArray (synchronizes the device: take addresses
    before launching what must still run)."""
    return int(a.__cuda_array_interface__["data"][0])


@pytest.mark.parametrize("nbytes", SIZES)
def test_round_trip_of_random_bytes(nbytes: int) -> None:
    rng = np.random.default_rng(nbytes)
    host = rng.integers(0, 256, nbytes, dtype=np.uint8)
    x = gpk.from_numpy(host)
    np.testing.assert_array_equal(x.to_numpy(), host)
    np.testing.assert_array_equal(x.to_numpy_async().result(), host)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("nbytes", [24, 5000, (3 << 20) + 8])
def test_round_trip_of_dtypes_and_odd_shapes(dtype: Any, nbytes: int) -> None:
    rng = np.random.default_rng()
    host = random_array(rng, nbytes, dtype)
    host = host[: host.size - host.size % 3].reshape(3, -1)
    x = gpk.from_numpy(host)
    got = x.to_numpy()
    assert got.dtype == host.dtype and got.shape == host.shape
    np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))
    # A device op in between: the upload was ordered before it, the download after it.
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal((x & 0x5A).to_numpy_async().result(), host & 0x5A)
    else:
        np.testing.assert_array_equal((x + x).to_numpy_async().result(), host + host)


@pytest.mark.parametrize("nbytes", [100, (9 << 20) + 3])
def test_pinned_memory_is_copied_directly(nbytes: int) -> None:
    engine = transfers.engine()
    rng = np.random.default_rng()
    buf, src = pinned_array(nbytes)
    src[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    d = gpk.empty((nbytes,), "uint8")
    d.realize()
    before = engine.stats()
    transfers.upload(_ptr(d), src, None).wait()
    outbuf, out = pinned_array(nbytes)
    transfers.download(out, _ptr(d), None).wait()
    after = engine.stats()
    np.testing.assert_array_equal(out, src)
    assert after["direct_bytes"] - before["direct_bytes"] == 2 * nbytes
    assert after["staged_bytes"] == before["staged_bytes"]
    del buf, outbuf


def test_sources_dropped_while_their_copy_is_in_flight(spin: Any) -> None:
    """The copies wait behind a spinning kernel on the backend's stream; their sources
    (pinned and pageable) and the handles are dropped at once, and memory is churned."""
    rng = np.random.default_rng()
    n = 16 << 20
    data_pinned = rng.integers(0, 256, n, dtype=np.uint8)
    data_pageable = rng.integers(0, 256, n, dtype=np.uint8)
    a, b = gpk.empty((n,), "uint8"), gpk.empty((n,), "uint8")
    a.realize(), b.realize()
    flag = gpk.empty((1,), "int32")
    flag.realize()
    pa, pb, pflag = _ptr(a), _ptr(b), _ptr(flag)
    buf, src = pinned_array(n)
    src[:] = data_pinned
    page = data_pageable.copy()
    spin.launch(1, 32, "qP", (SPIN_CYCLES, pflag), stream=None)
    t = transfers.upload(pa, src, None)
    busy = not t.done()
    transfers.upload(pb, page, None)
    del buf, src, t, page
    gc.collect()
    churn = [nv.HostBuffer(n) for _ in range(2)]  # would take the freed pinned memory
    for c in churn:
        np.frombuffer(c, np.uint8)[:] = 0xAB
    np.testing.assert_array_equal(a.to_numpy(), data_pinned)
    np.testing.assert_array_equal(b.to_numpy(), data_pageable)
    assert busy, "the kernel finished before the copy was checked: nothing was in flight"


def test_upload_overlaps_a_running_kernel(spin: Any) -> None:
    """A kernel spins on a stream of its own while from_numpy uploads 64 MiB: timing events
    around both show the copy ran inside the kernel's interval."""
    engine = transfers.engine()
    rng = np.random.default_rng()
    host = rng.integers(0, 256, 64 << 20, dtype=np.uint8)
    flag = gpk.empty((1,), "int32")
    flag.realize()
    pflag = _ptr(flag)
    ks = nv.Stream(0, True)
    k0, k1, c0, c1 = (nv.Event(True) for _ in range(4))
    k0.record(ks)
    spin.launch(1, 32, "qP", (SPIN_CYCLES, pflag), stream=ks)
    k1.record(ks)
    c0.record(engine.h2d_stream)
    x = gpk.from_numpy(host)
    c1.record(engine.h2d_stream)
    c1.synchronize()
    k1.synchronize()
    copy_start, copy_end = k0.elapsed_time(c0), k0.elapsed_time(c1)
    kernel_end = k0.elapsed_time(k1)
    assert copy_end > 0.0 and copy_start < kernel_end, (copy_start, copy_end, kernel_end)
    assert copy_end < kernel_end, "the copy waited for the kernel"
    np.testing.assert_array_equal(x.to_numpy(), host)


def test_to_numpy_async_while_a_graph_runs() -> None:
    rng = np.random.default_rng()

    @gpk.compile
    def step(x: Any, w: Any) -> Any:
        for _ in range(8):
            x = gpk.tanh(x @ w)
        return x

    xs = rng.standard_normal((256, 512)).astype(np.float32)
    ws = (rng.standard_normal((512, 512)) / 24).astype(np.float32)
    x, w = gpk.from_numpy(xs), gpk.from_numpy(ws)
    for _ in range(3):
        step(x, w).to_numpy()  # captured, then replayed
    token = rng.integers(0, 50_000, 8)
    tok = gpk.from_numpy(token)
    y = step(x, w)  # a replay queued on the backend's stream
    t_tok = tok.to_numpy_async()  # queued behind the replay
    t_y = y.to_numpy_async()
    ref = xs.astype(np.float64)
    for _ in range(8):
        ref = np.tanh(ref @ ws.astype(np.float64))
    np.testing.assert_array_equal(t_tok.result(), token)
    np.testing.assert_allclose(t_y.result(), ref, rtol=2e-2, atol=2e-3)
