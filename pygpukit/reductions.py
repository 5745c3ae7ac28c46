"""NumPy's reductions beyond sum/mean/max/min/argmax: prod, any, all, argmin (IR reduce
ops, on the same machinery), and var/std composed from mean and a sum of squares."""

from __future__ import annotations

from typing import Any

from pygpukit import errors
from pygpukit.ir import dtypes

from .array import ArrayLike, GPUArray, _operand, reduce


def prod(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Product of the elements over axis (None: all; an int or a tuple of ints), as
    np.prod: integers and bools multiply in int64, f16/bf16 in float32; 1 for no element."""
    return reduce("prod", x, axis, keepdims)


def any(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    """Whether any element over axis is nonzero (NaN counts as nonzero), as np.any; a bool
    array (False for no element)."""
    return reduce("any", x, axis, keepdims)


def all(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    """Whether every element over axis is nonzero, as np.all; a bool array (True for no
    element)."""
    return reduce("all", x, axis, keepdims)


def argmin(x: ArrayLike, axis: int | None = None, keepdims: bool = False) -> GPUArray:
    """Index (int64) of the first smallest element over axis (None: of the flattened
    array), as np.argmin: a NaN counts as the smallest."""
    return reduce("argmin", x, axis, keepdims)


def _ddof(op: str, ddof: Any) -> float:
    if isinstance(ddof, bool) or not isinstance(ddof, int | float):
        raise errors.user_error(errors.DTypeError, op, f"ddof must be a number, got {ddof!r}")
    return ddof


def _work_dtype(d: dtypes.DType) -> dtypes.DType:
    """var/std's working precision: float32 and float64 as they are, f16/bf16 in float32,
    integers and bools in the default float (docs/dtypes.md: float64 only from float64)."""
    if d.is_float:
        return d if d.itemsize >= 4 else dtypes.float32
    return dtypes.DEFAULT_FLOAT


def _var(op: str, x: ArrayLike, axis: Any, ddof: Any, keepdims: bool) -> GPUArray:
    """The variance in the working precision; errors name op."""
    d = _ddof(op, ddof)
    xa = x if isinstance(x, GPUArray) else _operand(x, op)
    xw = xa.astype(_work_dtype(xa.dtype))
    m = reduce("mean", xw, axis, True, op)
    n = xw.size // m.size if m.size else 1
    dev = xw - m
    return reduce("sum", dev * dev, axis, keepdims, op) / float(n - d if n > d else 0)


def _result_dtype(x: ArrayLike) -> dtypes.DType:
    d = x.dtype if isinstance(x, GPUArray) else _operand(x, "var").dtype
    return d if d.is_float else dtypes.DEFAULT_FLOAT


def var(x: ArrayLike, axis: Any = None, *, ddof: int | float = 0,
        keepdims: bool = False) -> GPUArray:  # fmt: skip
    """Variance over axis (None, an int or a tuple of ints), as np.var: the mean squared
    deviation from the mean, divided by N - ddof (inf or NaN where N - ddof <= 0, as
    NumPy). Two passes, the deviations taken from the mean first, so float32 keeps its
    precision for data far from zero; f16/bf16 compute in float32 and round once, integers
    and bools give the default float, float32 (docs/dtypes.md)."""
    x = x if isinstance(x, GPUArray) else _operand(x, "var")
    return _var("var", x, axis, ddof, keepdims).astype(_result_dtype(x))


def std(x: ArrayLike, axis: Any = None, *, ddof: int | float = 0,
        keepdims: bool = False) -> GPUArray:  # fmt: skip
    """Standard deviation over axis, as np.std: the square root of the variance (see var),
    taken in var's working precision and rounded once to the result dtype."""
    from .ops import sqrt

    x = x if isinstance(x, GPUArray) else _operand(x, "std")
    return sqrt(_var("std", x, axis, ddof, keepdims)).astype(_result_dtype(x))
