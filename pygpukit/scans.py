"""cumsum and cumprod: the IR's scan op along one axis."""

from __future__ import annotations

from typing import Any

from pygpukit import errors
from pygpukit.ir import shapes, user_location

from . import runtime
from .array import ArrayLike, GPUArray, _dtype_arg, _ints, _operand


def _scan(op: str, kind: str, x: ArrayLike, axis: int | None, dtype: Any) -> GPUArray:
    xa = x if isinstance(x, GPUArray) else _operand(x, op)
    if dtype is not None:
        xa = xa.astype(_dtype_arg(op, dtype))
    if axis is None or xa.ndim == 0:  # NumPy scans a 0-d array as one of shape (1,)
        xa = xa.reshape(-1)
    (ax,) = _ints(op, (0 if axis is None else axis,))
    try:
        ax = shapes.normalize_axis(ax, xa.ndim)
    except shapes.AxisRuleError as e:
        raise errors.op_error(op, e, [(xa.shape, xa.dtype)], user_location()) from None
    out = GPUArray(runtime.record("scan", (xa._node,), {"kind": kind, "axis": ax}, op))
    if dtype is not None and out.dtype != xa.dtype:
        out = out.astype(xa.dtype)  # NumPy accumulates in the dtype asked for
    return out


def cumsum(x: ArrayLike, axis: int | None = None, dtype: Any = None) -> GPUArray:
    """Running sums along axis (None: of the flattened array), as np.cumsum: integers and
    bools accumulate in int64, f16/bf16 in float32 (rounded to their dtype per element);
    `dtype` gives the accumulation and result dtype."""
    return _scan("cumsum", "add", x, axis, dtype)


def cumprod(x: ArrayLike, axis: int | None = None, dtype: Any = None) -> GPUArray:
    """Running products along axis (None: of the flattened array), as np.cumprod, with
    cumsum's dtypes."""
    return _scan("cumprod", "mul", x, axis, dtype)
