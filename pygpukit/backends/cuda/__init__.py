"""The CUDA backend: driver, NVRTC and launches through pygpukit._native."""

from __future__ import annotations


def __getattr__(name: str) -> object:
    # Importing the backend loads the driver; keep `import pygpukit.backends.cuda` cheap.
    if name == "CudaBackend":
        from .backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)
