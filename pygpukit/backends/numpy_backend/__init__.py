"""NumPy backend: the reference executor, CI backend and CPU fallback."""

from .backend import HostValue, NumpyBackend

__all__ = ["HostValue", "NumpyBackend"]
