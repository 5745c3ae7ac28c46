"""Seeded random arrays (PCG64 on the host, copied to the backend)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import errors
from .array import GPUArray
from .creation import DEFAULT_FLOAT, _dtype, _shape, from_numpy

_rng = np.random.default_rng()


def seed(value: int) -> None:
    """Seed the generator behind gpk.random.* for reproducible draws."""
    global _rng
    _rng = np.random.default_rng(value)


def _gen(seed_: int | None) -> np.random.Generator:
    return _rng if seed_ is None else np.random.default_rng(seed_)


def normal(shape: int | Sequence[int], mean: float = 0.0, std: float = 1.0, dtype: Any = None,
           seed: int | None = None, device: Any = None) -> GPUArray:  # fmt: skip
    """Normally distributed random numbers.

    Args:
        shape: The shape (an int for 1-D).
        mean: The distribution's mean.
        std: Its standard deviation.
        dtype: A float dtype (default float32).
        seed: Draw from a generator seeded with this (reproducible), else from the module's
            generator (`gpk.random.seed`).
        device: Where the array lives; default the current device.

    Returns:
        A new array, drawn on the host (PCG64) and copied to the backend.

    Raises:
        ShapeError: A negative dimension.
    """
    d = _dtype(dtype, DEFAULT_FLOAT, "normal")
    a = _gen(seed).normal(mean, std, size=_shape(shape, "normal", d.itemsize))
    return from_numpy(a.astype(d.np), device)


def uniform(shape: int | Sequence[int], low: float = 0.0, high: float = 1.0, dtype: Any = None,
            seed: int | None = None, device: Any = None) -> GPUArray:  # fmt: skip
    """Uniformly distributed random numbers in [low, high).

    Args:
        shape: The shape (an int for 1-D).
        low: The lower bound (included).
        high: The upper bound (excluded).
        dtype: A float dtype (default float32).
        seed: Draw from a generator seeded with this (reproducible), else from the module's
            generator (`gpk.random.seed`).
        device: Where the array lives; default the current device.

    Returns:
        A new array, drawn on the host (PCG64) and copied to the backend.

    Raises:
        ShapeError: A negative dimension.
    """
    d = _dtype(dtype, DEFAULT_FLOAT, "uniform")
    a = _gen(seed).uniform(low, high, size=_shape(shape, "uniform", d.itemsize))
    return from_numpy(a.astype(d.np), device)


def randint(low: int, high: int, shape: int | Sequence[int], dtype: Any = None,
            seed: int | None = None, device: Any = None) -> GPUArray:  # fmt: skip
    """Random integers in [low, high).

    Args:
        low: The lowest value (included).
        high: One above the highest value.
        shape: The shape (an int for 1-D).
        dtype: An integer dtype (default int64).
        seed: Draw from a generator seeded with this (reproducible), else from the module's
            generator (`gpk.random.seed`).
        device: Where the array lives; default the current device.

    Returns:
        A new array, drawn on the host (PCG64) and copied to the backend.

    Raises:
        DTypeError: `dtype` is not an integer dtype.
    """
    d = _dtype(dtype, _dtype("int64", DEFAULT_FLOAT), "randint")
    if not d.is_int:
        raise errors.user_error(errors.DTypeError, "randint", f"dtype must be an integer "
                                f"dtype, got {d.name}")  # fmt: skip
    size = _shape(shape, "randint", d.itemsize)
    return from_numpy(_gen(seed).integers(low, high, size=size).astype(d.np), device)
