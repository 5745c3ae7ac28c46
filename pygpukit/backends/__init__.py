"""Backends: NumPy (reference, CPU) and CUDA. `get_backend()` picks one per process."""

from __future__ import annotations

import logging
import os

from .base import Backend

_backend: Backend | None = None


def get_backend() -> Backend:
    global _backend
    if _backend is None:
        _backend = _choose()
    return _backend


def _choose() -> Backend:
    want = os.environ.get("PYGPUKIT_BACKEND", "").lower()
    if want not in ("", "cpu", "cuda"):
        raise ValueError(f"PYGPUKIT_BACKEND must be 'cpu' or 'cuda', got {want!r}")
    from .numpy_backend import NumpyBackend

    if want == "cpu":
        return NumpyBackend()
    ok, reason = _cuda_status()
    if ok:
        from .cuda.backend import CudaBackend

        return CudaBackend()
    if want == "cuda":
        from pygpukit.errors import CUDAError

        raise CUDAError(f"PYGPUKIT_BACKEND=cuda, but CUDA is not usable: {reason}")
    logging.getLogger(__name__).warning(
        "no usable CUDA GPU (%s); running on the NumPy backend", reason
    )
    return NumpyBackend()


def _cuda_status() -> tuple[bool, str]:
    """(usable, reason): a driver that loads, a device, and SM80 or newer. Never raises."""
    try:
        from .cuda.toolchain import cuda_usable

        return cuda_usable()
    except Exception as e:  # a broken install must fall back, not crash the import
        return False, f"{type(e).__name__}: {e}"


__all__ = ["Backend", "get_backend"]
