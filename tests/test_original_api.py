"""The original project's README API, one test per snippet, on the CPU backend: device
queries, gpk.jit with func= and keyword arguments, and its safety checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import _native
from pygpukit.backends.cuda import toolchain
from pygpukit.errors import GPUKitError

SCALE_SRC = """
extern "C" __global__
void scale(float* x, float factor, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] *= factor;
}
"""


def test_device_queries() -> None:
    assert gp.is_cuda_available() is toolchain.cuda_usable()[0]
    try:
        path = toolchain.load_nvrtc()
    except GPUKitError:
        path = None
    assert gp.get_nvrtc_path() == path
    assert gp.is_nvrtc_available() is (path is not None)
    if gp.is_cuda_available():
        major, minor = _native.device_info(None)["compute_capability"]
        assert gp.get_sm_version() == major * 10 + minor >= 80
        assert gp.validate_compute_capability() is None
    elif _native.driver_unavailable_reason():
        for query in (gp.get_sm_version, gp.validate_compute_capability):
            with pytest.raises(gp.CUDAError, match="needs a CUDA GPU") as info:
                query()
            assert isinstance(info.value, RuntimeError)


def test_validate_compute_capability_refuses_old_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "driver_unavailable_reason", lambda: "")
    monkeypatch.setattr(_native, "device_info", lambda d: {"compute_capability": (7, 5)})
    assert gp.get_sm_version() == 75
    with pytest.raises(gp.CUDAError, match="sm_75; PyGPUkit needs sm_80"):
        gp.validate_compute_capability()
    monkeypatch.setattr(_native, "device_info", lambda d: {"compute_capability": (8, 6)})
    gp.validate_compute_capability()


def test_jit_readme_snippet_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if gp.backend_name() != "cpu":  # the backend is chosen once, at the first array
        pytest.skip("the CPU backend's error; tests/gpu/test_jit_original_api.py runs it")
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    x = gp.asarray(np.random.default_rng().standard_normal((32, 32)).astype(np.float32))
    kernel = gp.jit(SCALE_SRC, func="scale")
    assert kernel.params == [("float*", "x", "P"), ("float", "factor", "f"), ("int", "n", "i")]
    with pytest.raises(gp.CUDAError, match="kernel scale needs the CUDA backend") as info:
        kernel(x, factor=0.5, n=x.size)
    assert "PYGPUKIT_BACKEND=cpu" in str(info.value)
    assert gp.jit(SCALE_SRC, "scale").params == kernel.params
    with pytest.raises(gp.CompileError, match="name"):
        gp.jit(SCALE_SRC)
    with pytest.raises(gp.CompileError, match="once"):
        gp.jit(SCALE_SRC, "scale", func="other")


def test_jit_checks_arguments_before_the_backend() -> None:
    kernel = gp.jit(SCALE_SRC, func="scale")
    ints = gp.asarray(np.arange(8, dtype=np.int32))
    with pytest.raises(gp.DTypeError, match=r"'x' \(float\*\) points to float32, got a "
                                            "GPUArray of dtype int32"):  # fmt: skip
        kernel(ints, factor=0.5, n=8)
    with pytest.raises(gp.DTypeError, match="raw address is not accepted"):
        kernel(0x7F0000000000, factor=0.5, n=8)
    x = gp.asarray(np.ones(8, dtype=np.float32))
    with pytest.raises(gp.DTypeError, match="missing n"):
        kernel(x, factor=0.5)
    with pytest.raises(gp.DTypeError, match="no parameter 'scale'"):
        kernel(x, scale=0.5, n=8)
    with pytest.raises(gp.DTypeError, match="given twice"):
        kernel(x, 0.5, 8, factor=0.5)
    with pytest.raises(gp.DTypeError, match="'n'"):
        kernel(x, factor=0.5, n=8.0)
    with pytest.raises(gp.DTypeError, match="float4x"):
        gp.jit('extern "C" __global__ void k(float4x* p) {}', "k")
    assert isinstance(gp.DTypeError("t"), TypeError)


class _DeviceBuffer:
    """A foreign device array: only __cuda_array_interface__."""

    def __init__(self, shape: tuple[int, ...], typestr: str, ptr: int) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, False), "version": 3}  # fmt: skip


class _RecordingFunction:
    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []

    def launch(self, *args: Any) -> None:
        self.launches.append(args)


def test_jit_launch_is_sized_from_the_first_array() -> None:
    """The packing and launch geometry a CUDA launch would get, with the launch recorded."""
    kernel = gp.jit(SCALE_SRC, func="scale")
    fn = _RecordingFunction()
    kernel._fn = fn
    buf = _DeviceBuffer((10, 100), "<f4", 0x1000)
    kernel(buf, factor=0.5, n=1000)
    kernel(buf, 0.25, 1000, block=(128,))
    kernel((3,), (64,), buf, 2.0, 7)  # the grid-first form
    kernel(buf, factor=1.5, n=1, grid=(1,), block=(32,))
    assert fn.launches == [
        ((4,), (256,), "Pfi", (0x1000, 0.5, 1000), 0, None),
        ((8,), (128,), "Pfi", (0x1000, 0.25, 1000), 0, None),
        ((3,), (64,), "Pfi", (0x1000, 2.0, 7), 0, None),
        ((1,), (32,), "Pfi", (0x1000, 1.5, 1), 0, None),
    ]
    with pytest.raises(gp.DTypeError, match="points to float32, got _DeviceBuffer of dtype "
                                            "float16"):  # fmt: skip
        kernel(_DeviceBuffer((4,), "<f2", 0x2000), factor=0.5, n=4)
    anything = gp.jit('extern "C" __global__ void k(const void* __restrict__ p, long long n) {}',
                      func="k")  # fmt: skip
    anything._fn = fn
    anything(_DeviceBuffer((6,), "<i8", 0x3000), n=6)
    assert fn.launches[-1] == ((1,), (256,), "Pq", (0x3000, 6), 0, None)
    scalars = gp.jit('extern "C" __global__ void k(int n) {}', func="k")
    scalars._fn = fn
    with pytest.raises(gp.DTypeError, match="no array argument"):
        scalars(n=3)
