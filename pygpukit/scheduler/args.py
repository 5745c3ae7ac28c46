"""Checks of the scheduler's arguments, before any reaches the Rust core: each bad one
raises an error that names the call and the argument, and is also the builtin NumPy or
Python would raise (TypeError for a wrong type, ValueError for a value out of its domain,
OverflowError for an integer past what the core stores)."""

from __future__ import annotations

import math
import numbers
import re

from pygpukit.errors import DTypeError, GPUKitOverflowError, GPUKitValueError

INT32_MIN, INT32_END = -(2**31), 2**31
U64_END = 2**64


def _integer(where: str, name: str, value: object) -> int:
    if type(value) is int:  # the usual case, without the ABC check (every submit)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DTypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def byte_count(where: str, name: str, value: object) -> int:
    """A number of bytes: an int in [0, 2**64)."""
    v = _integer(where, name, value)
    if v < 0:
        raise GPUKitValueError(f"{where}: {name} must be >= 0 bytes, got {v}")
    if v >= U64_END:
        raise GPUKitOverflowError(f"{where}: {name} must be < 2**64 bytes, got {v}")
    return v


def int32(where: str, name: str, value: object) -> int:
    """An int that fits 32 bits (priorities: the core and CUDA store them as int)."""
    v = _integer(where, name, value)
    if not INT32_MIN <= v < INT32_END:
        raise GPUKitOverflowError(f"{where}: {name} must be in [-2**31, 2**31), got {v}")
    return v


def at_least(where: str, name: str, value: object, least: int) -> int:
    """An int >= least."""
    v = _integer(where, name, value)
    if v < least:
        raise GPUKitValueError(f"{where}: {name} must be >= {least}, got {v}")
    return v


def real(where: str, name: str, value: object, low: float, high: float = math.inf,
         *, open_low: bool = False) -> float:  # fmt: skip
    """A finite real number in [low, high] ((low, high] when open_low). Infinite and NaN
    values are refused: a time or cost that is not finite stops every clock it reaches."""
    if type(value) is float or type(value) is int:  # the usual case, without the ABC check
        v = float(value)
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DTypeError(f"{where}: {name} must be a number, got {type(value).__name__} "
                         f"{value!r}")  # fmt: skip
    else:
        v = float(value)
    bad_low = v <= low if open_low else v < low
    if not math.isfinite(v) or bad_low or v > high:
        span = ""
        if math.isfinite(low) or math.isfinite(high):
            lo = f"({low}" if open_low else f"[{low}"
            hi = f"{high}]" if math.isfinite(high) else "inf)"
            span = f" in {lo}, {hi}"
        raise GPUKitValueError(f"{where}: {name} must be a finite number{span}, got {v}")
    return v


def text(where: str, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise DTypeError(f"{where}: {name} must be a str, got {type(value).__name__} {value!r}")
    return value


__all__ = ["at_least", "byte_count", "int32", "real", "text"]


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def memory_size(where: str, name: str, value: object) -> int:
    """A number of bytes given as an int or a string with a unit: "512MB" (10**6 bytes a
    MB, as in SI), "1.5GiB" (2**30 a GiB), "4096"."""
    if not isinstance(value, str):
        return byte_count(where, name, value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", value)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise GPUKitValueError(f"{where}: {name} must be bytes or a size like '512MB' or "
                               f"'1.5GiB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
                               f"got {value!r}")  # fmt: skip
    return byte_count(where, name, int(float(m.group(1)) * _UNITS[unit]))
