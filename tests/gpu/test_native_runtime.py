"""The C++ runtime on a real GPU: memory, launches, events, streams, graphs, errors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pygpukit import _native as nv
from pygpukit.backends import select_backend
from pygpukit.backends.cuda import toolchain
from pygpukit.errors import CUDAError, OutOfMemoryError

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void axpb(float* y, const float* x, int n, unsigned int stride,
                                long long offset, float a, double b) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i * stride] + (float)(b + (double)offset);
}

extern "C" __global__ void add_scalar(float* y, const float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + s;
}

extern "C" __global__ void mul_scalar(float* y, const float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * s;
}

extern "C" __global__ void add(float* z, const float* x, const float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] + y[i];
}

extern "C" __global__ void spin(float* y, int iters) {
  float v = y[threadIdx.x];
  for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;
  y[threadIdx.x] = v;
}

extern "C" __global__ void reverse_block(float* y, const float* x) {
  extern __shared__ float tile[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = x[i];
  __syncthreads();
  y[i] = tile[blockDim.x - 1 - threadIdx.x];
}
"""

BLOCK = 256


def grid(n: int) -> tuple[int]:
    return ((n + BLOCK - 1) // BLOCK,)


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nv.Module]:
    old = os.environ.get("PYGPUKIT_CACHE_DIR")
    os.environ["PYGPUKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    try:
        yield nv.Module(toolchain.compile_kernel(SOURCE, toolchain.device_arch()))
    finally:
        if old is None:
            del os.environ["PYGPUKIT_CACHE_DIR"]
        else:
            os.environ["PYGPUKIT_CACHE_DIR"] = old


class Buffers:
    """Device allocations freed at the end of a test."""

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def alloc(self, nbytes: int) -> int:
        ptr = nv.mem_alloc(nbytes)
        self.ptrs.append(ptr)
        return ptr

    def upload(self, a: np.ndarray, stream: nv.Stream | None = None) -> int:
        ptr = self.alloc(a.nbytes)
        nv.memcpy_htod(ptr, a, stream)
        return ptr

    def free(self) -> None:
        for ptr in self.ptrs:
            nv.mem_free(ptr)


@pytest.fixture
def bufs() -> Iterator[Buffers]:
    b = Buffers()
    yield b
    nv.synchronize()
    b.free()


def download(ptr: int, n: int, dtype: type = np.float32) -> np.ndarray:
    out: np.ndarray = np.empty(n, dtype)
    nv.memcpy_dtoh(out, ptr)
    return out


def poison(ptr: int, nbytes: int) -> None:
    nv.memset(ptr, 0xFF, nbytes)  # all-ones float32 is NaN, so unwritten outputs show


def test_device_and_driver_info() -> None:
    assert nv.driver_available() and nv.driver_unavailable_reason() == ""
    assert nv.driver_version() >= 12000
    assert nv.device_count() >= 1
    info = nv.device_info()
    assert info["sm_count"] > 0 and info["total_memory"] > 2**30
    assert toolchain.device_arch() == "sm_{}{}".format(*info["compute_capability"])
    free, total = nv.mem_get_info()
    assert 0 < free <= total
    assert select_backend()[0] in ("cuda", "cpu")


def test_launch_matches_float64_reference(module: nv.Module, bufs: Buffers) -> None:
    rng = np.random.default_rng(0)
    n, stride, offset, a, b = 100_003, 2, 7, 1.5, 0.25
    x = rng.standard_normal(n * stride).astype(np.float32)
    dx = bufs.upload(x)
    dy = bufs.alloc(n * 4)
    poison(dy, n * 4)
    f = module.get_function("axpb")
    assert f.name == "axpb" and f.num_regs > 0 and f.max_threads >= BLOCK
    f.launch(grid(n), (BLOCK, 1, 1), "PPiIqfd", (dy, dx, n, stride, offset, a, b))
    out = download(dy, n)
    ref = a * x[::stride].astype(np.float64) + b + offset
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=2e-6)


def test_launch_argument_errors_name_the_kernel(module: nv.Module) -> None:
    f = module.get_function("add_scalar")
    with pytest.raises(TypeError, match="add_scalar.*takes 4 arguments"):
        f.launch(1, 32, "PPfi", (0, 0, 1.0))
    with pytest.raises(TypeError, match="add_scalar.*argument 0"):
        f.launch(1, 32, "PPfi", (1.5, 0, 1.0, 4))
    with pytest.raises(TypeError, match="add_scalar.*argument 3"):
        f.launch(1, 32, "PPfi", (0, 0, 1.0, 2**40))
    with pytest.raises(TypeError, match="unknown format char 'z'"):
        f.launch(1, 32, "PPfz", (0, 0, 1.0, 4))
    with pytest.raises(CUDAError):
        module.get_function("no_such_kernel")
    with pytest.raises(CUDAError):
        nv.Module(b"definitely not a cubin")


def test_events_time_a_kernel(module: nv.Module, bufs: Buffers) -> None:
    y = bufs.upload(np.zeros(BLOCK, np.float32))
    s = nv.Stream()
    start, end = nv.Event(), nv.Event()
    start.record(s)
    module.get_function("spin").launch(1, BLOCK, "Pi", (y, 1 << 18), stream=s)
    end.record(s)
    end.synchronize()
    assert end.query() and start.query()
    assert start.elapsed_time(end) > 0.0
    untimed = nv.Event(timing=False)
    untimed.record(s)
    with pytest.raises(CUDAError):
        start.elapsed_time(untimed)


def test_event_recorded_on_a_fresh_thread() -> None:
    """A thread that made no CUDA call before (a serving engine's) records an event on the
    default stream: the event makes its context current (it raised
    CUDA_ERROR_INVALID_CONTEXT)."""
    import threading

    start, end = nv.Event(), nv.Event()
    start.record(None)
    failed: list[BaseException] = []

    def other() -> None:
        try:
            end.record(None)
        except BaseException as e:  # noqa: BLE001 (reported to the test's thread)
            failed.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not failed, failed
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_graph_replays_and_sees_new_input(module: nv.Module, bufs: Buffers) -> None:
    rng = np.random.default_rng(1)
    n = 4096
    x = rng.standard_normal(n).astype(np.float32)
    s = nv.Stream()
    dx, dt, dz = bufs.upload(x), bufs.alloc(n * 4), bufs.alloc(n * 4)
    add_scalar = module.get_function("add_scalar")
    mul_scalar = module.get_function("mul_scalar")
    add = module.get_function("add")

    s.begin_capture()
    assert s.is_capturing()
    add_scalar.launch(grid(n), BLOCK, "PPfi", (dt, dx, 1.0, n), stream=s)
    mul_scalar.launch(grid(n), BLOCK, "PPfi", (dt, dt, 2.0, n), stream=s)
    add.launch(grid(n), BLOCK, "PPPi", (dz, dt, dx, n), stream=s)
    graph = s.end_capture()
    assert not s.is_capturing()
    assert graph.num_nodes == 3
    exe = graph.instantiate()

    for trial in range(3):
        poison(dz, n * 4)
        nv.synchronize()
        exe.launch(s)
        s.synchronize()
        np.testing.assert_allclose(download(dz, n), 3.0 * x.astype(np.float64) + 2.0, rtol=1e-6)
        x = rng.standard_normal(n).astype(np.float32) * (trial + 2)
        nv.memcpy_htod(dx, x, s)


def test_pageable_copies_refused_during_capture(bufs: Buffers) -> None:
    d = bufs.alloc(1024)
    s = nv.Stream()
    s.begin_capture()
    with pytest.raises(CUDAError, match="captured"):
        nv.memcpy_htod_async(d, np.zeros(256, np.float32), s)
    graph = s.end_capture()
    assert graph.num_nodes == 0


def test_streams_with_priorities(module: nv.Module, bufs: Buffers) -> None:
    least, greatest = nv.Stream.priority_range()
    assert greatest <= least
    hi, lo = nv.Stream(priority=greatest), nv.Stream(priority=least)
    assert hi.priority == greatest and lo.priority == least
    assert nv.Stream(priority=greatest - 100).priority == greatest
    blocking = nv.Stream(non_blocking=False)
    n = 10_000
    x = np.arange(n, dtype=np.float32)
    dx, d1, d2, d3 = bufs.upload(x), bufs.alloc(n * 4), bufs.alloc(n * 4), bufs.alloc(n * 4)
    f = module.get_function("mul_scalar")
    f.launch(grid(n), BLOCK, "PPfi", (d1, dx, 2.0, n), stream=hi)
    f.launch(grid(n), BLOCK, "PPfi", (d2, dx, 3.0, n), stream=lo.handle)
    f.launch(grid(n), BLOCK, "PPfi", (d3, dx, 4.0, n), stream=blocking)
    for st in (hi, lo, blocking):
        st.synchronize()
        assert st.query()
    for ptr, k in ((d1, 2.0), (d2, 3.0), (d3, 4.0)):
        np.testing.assert_array_equal(download(ptr, n), x * k)


def test_dynamic_shared_memory_opt_in(module: nv.Module, bufs: Buffers) -> None:
    f = module.get_function("reverse_block")
    want = min(100 * 1024, nv.device_info()["max_shared_per_block_optin"])
    f.set_max_dynamic_shared_memory(want)
    assert f.max_dynamic_shared_memory == want
    n = BLOCK * 8
    x = np.arange(n, dtype=np.float32)
    dx, dy = bufs.upload(x), bufs.alloc(n * 4)
    f.launch(n // BLOCK, BLOCK, "PP", (dy, dx), shared_mem=want)
    np.testing.assert_array_equal(download(dy, n), x.reshape(-1, BLOCK)[:, ::-1].ravel())


def test_large_pageable_copy_round_trips(bufs: Buffers) -> None:
    rng = np.random.default_rng()
    nbytes = 64 << 20
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    d = bufs.alloc(nbytes)
    s = nv.Stream()
    nv.memcpy_htod_async(d, data, s)
    data_copy = data.copy()
    data[:] = 0  # the async H2D must have consumed the pageable source already
    back = np.zeros(nbytes, np.uint8)
    nv.memcpy_dtoh_async(back, d, s)
    np.testing.assert_array_equal(back, data_copy)

    half = nbytes // 2
    d2 = bufs.alloc(half)
    nv.memcpy_dtod(d2, d + half, half)
    tail = np.empty(half, np.uint8)
    nv.memcpy_dtoh(tail, d2)
    np.testing.assert_array_equal(tail, data_copy[half:])


def test_pinned_host_buffers_copy_directly(bufs: Buffers) -> None:
    n = 1 << 20
    src, dst = nv.HostBuffer(n), nv.HostBuffer(n)
    np.frombuffer(memoryview(src), np.uint8)[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
    d = bufs.alloc(n)
    s = nv.Stream()
    nv.memcpy_htod_async(d, src, s)
    nv.memcpy_dtoh_async(dst, d, s)
    s.synchronize()
    np.testing.assert_array_equal(
        np.frombuffer(memoryview(dst), np.uint8), np.frombuffer(memoryview(src), np.uint8)
    )


def test_memset_d32(bufs: Buffers) -> None:
    d = bufs.alloc(1000 * 4)
    nv.memset_d32(d, 0x3F800000, 1000)  # 1.0f
    np.testing.assert_array_equal(download(d, 1000), np.ones(1000, np.float32))


def test_invalid_free_raises_and_the_process_survives(bufs: Buffers) -> None:
    with pytest.raises(CUDAError) as info:
        nv.mem_free(0xDEAD0000)
    assert "cuMemFree" in str(info.value)
    assert getattr(info.value, "code", 0) != 0
    d = bufs.upload(np.ones(16, np.float32))
    np.testing.assert_array_equal(download(d, 16), np.ones(16, np.float32))


def test_out_of_memory_is_an_error_not_a_crash() -> None:
    with pytest.raises(OutOfMemoryError) as info:
        nv.mem_alloc(1 << 50)
    assert "cuMemAlloc" in str(info.value)
    nv.synchronize()


def test_kernel_cache_persists_compiled_modules(module: nv.Module) -> None:
    cache = Path(nv.kernel_cache_dir())
    assert any(cache.glob("*.cubin"))
