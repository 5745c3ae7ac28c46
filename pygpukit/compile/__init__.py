"""@gpk.compile: tracing with guards, one planned schedule per signature, capture/replay."""

from .function import CompiledFunction, StaleOutputError, compile, scalar

__all__ = ["CompiledFunction", "StaleOutputError", "compile", "scalar"]
