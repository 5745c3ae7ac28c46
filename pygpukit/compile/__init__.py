"""@gpk.compile: tracing with guards, one planned schedule per signature, capture/replay."""

from .background import wait_for_compiles
from .function import CompiledFunction, Reservation, StaleOutputError, compile, scalar

__all__ = [
    "CompiledFunction",
    "Reservation",
    "StaleOutputError",
    "compile",
    "scalar",
    "wait_for_compiles",
]
