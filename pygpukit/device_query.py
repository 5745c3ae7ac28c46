"""The original project's device queries: gpk.is_cuda_available(), is_nvrtc_available(),
get_nvrtc_path(), get_sm_version() and validate_compute_capability(). The first three
answer on any machine; the last two need a GPU and otherwise raise CUDAError naming why.
"""

from __future__ import annotations

from pygpukit.errors import CUDAError, GPUKitError


def is_cuda_available() -> bool:
    """Whether the CUDA backend can run here: a driver, an SM80+ GPU and an NVRTC whose
    kernels that driver loads. Never raises."""
    try:
        from pygpukit.backends.cuda.toolchain import cuda_usable

        return cuda_usable()[0]
    except Exception:  # a broken install is "not available"; backend selection agrees
        return False


def is_nvrtc_available() -> bool:
    """Whether NVRTC (the runtime compiler gpk.jit and the kernels need) loads."""
    return get_nvrtc_path() is not None


def get_nvrtc_path() -> str | None:
    """The path of the NVRTC library that loads, or None when none does."""
    from pygpukit.backends.cuda import toolchain

    try:
        return toolchain.load_nvrtc()
    except GPUKitError:
        return None


def _compute_capability(device: int | None, who: str) -> tuple[int, int]:
    from pygpukit import _native

    reason = _native.driver_unavailable_reason()
    if reason:
        raise CUDAError(f"{who} needs a CUDA GPU: {reason}")
    major, minor = _native.device_info(device)["compute_capability"]
    return int(major), int(minor)


def get_sm_version(device: int | None = None) -> int:
    """The SM version of a device (default: the current one) as major*10+minor, e.g. 90."""
    major, minor = _compute_capability(device, "get_sm_version")
    return major * 10 + minor


def validate_compute_capability(device: int | None = None) -> None:
    """Raise CUDAError unless the device (default: the current one) is SM80 or newer,
    the least PyGPUkit's kernels support."""
    from pygpukit.backends.cuda.toolchain import MIN_SM

    major, minor = _compute_capability(device, "validate_compute_capability")
    if major * 10 + minor < MIN_SM:
        raise CUDAError(f"validate_compute_capability: the device is sm_{major}{minor}; "
                        f"PyGPUkit needs sm_{MIN_SM} or newer")  # fmt: skip


__all__ = [
    "get_nvrtc_path",
    "get_sm_version",
    "is_cuda_available",
    "is_nvrtc_available",
    "validate_compute_capability",
]
