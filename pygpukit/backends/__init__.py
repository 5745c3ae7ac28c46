"""Backends: NumPy (reference, CPU) and CUDA. `get_backend()` picks one per process."""

from __future__ import annotations

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

    return NumpyBackend()


__all__ = ["Backend", "get_backend"]
