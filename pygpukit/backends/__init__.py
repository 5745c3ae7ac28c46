"""Backends: NumPy (reference, CPU) and CUDA. `get_backend()` picks one per process."""

from __future__ import annotations

import logging

from pygpukit import settings

from .base import Backend

_backend: Backend | None = None


def get_backend() -> Backend:
    global _backend
    if _backend is None:
        _backend = _choose()
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
        return NumpyBackend()
    if reason:
        from pygpukit.errors import CUDAError

        raise CUDAError(f"the cuda backend was asked for ({settings.BACKEND} or gpk.set_backend), "
                        f"but CUDA is not usable: {reason}")  # fmt: skip
    from .cuda.backend import CudaBackend

    return CudaBackend()


def _cuda_status() -> tuple[bool, str]:
    """(usable, reason): a driver that loads, a device, and SM80 or newer. Never raises."""
    try:
        from .cuda.toolchain import cuda_usable

        return cuda_usable()
    except Exception as e:  # a broken install must fall back, not crash the import
        return False, f"{type(e).__name__}: {e}"


__all__ = ["Backend", "active_backend_name", "get_backend", "select_backend"]
