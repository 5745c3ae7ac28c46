"""Backends: NumPy (reference, CPU) and CUDA. `get_backend()` picks one per process."""

from __future__ import annotations

import logging

from pygpukit import settings

from . import devices
from .base import Backend

_backend: Backend | None = None  # the primary device's (see devices.py)


def get_backend() -> Backend:
    """The backend of this thread's current device: the primary device's unless a
    `with gpk.Device(i):` block (or an array's own device) says otherwise."""
    global _backend
    if _backend is None:
        _backend = _choose()
        devices.register_primary(_backend)
    if devices.ACTIVE[0]:
        o = devices.current.ordinal
        if o is not None and o != _backend.ordinal:
            return devices.backend_for(o)
    return _backend


def active_backend_name() -> str | None:
    """The name of the backend this process runs on, or None before the first use."""
    return None if _backend is None else _backend.name


def select_backend() -> tuple[str, str]:
    """(name, why CUDA is unusable or ''): the backend get_backend() would start. The
    PYGPUKIT_BACKEND / gpk.set_backend choice when there is one, else cuda when usable."""
    want = settings.backend()
    if want == "cpu":
        return "cpu", ""
    ok, reason = _cuda_status()
    return ("cuda" if ok or want == "cuda" else "cpu"), reason


def _choose() -> Backend:
    name, reason = select_backend()
    from .numpy_backend import NumpyBackend

    if name == "cpu":
        if reason:
            logging.getLogger(__name__).warning(
                "no usable CUDA GPU (%s); running on the NumPy backend", reason
            )
        return NumpyBackend(quota_bytes=settings.cpu_device_memory())
    if reason:
        from pygpukit.errors import CUDAError

        raise CUDAError(f"the cuda backend was asked for ({settings.BACKEND} or gpk.set_backend), "
                        f"but CUDA is not usable: {reason}")  # fmt: skip
    from pygpukit import _native

    from .cuda.backend import CudaBackend

    backend = CudaBackend()
    backend.ordinal = int(_native.get_device())  # the device the process selected
    return backend


def _cuda_status() -> tuple[bool, str]:
    """(usable, reason): a driver that loads, a device, and SM80 or newer. Never raises."""
    try:
        from .cuda.toolchain import cuda_usable

        return cuda_usable()
    except Exception as e:  # a broken install must fall back, not crash the import
        return False, f"{type(e).__name__}: {e}"


__all__ = ["Backend", "active_backend_name", "get_backend", "select_backend"]
