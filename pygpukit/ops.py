"""The NumPy-style function API: gpk.exp(x), gpk.where(c, x, y), gpk.concatenate(...)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from pygpukit import errors
from pygpukit.ir import shapes, user_location

from . import runtime
from .array import (
    ArrayLike,
    GPUArray,
    _axes,
    _node_of,
    _pair,
    binary,
    broadcast_to,
    expand_dims,
    matmul,
    reduce,
    take,
    unary,
)
from .creation import eye, linspace, to_array
from .einsum import dot, einsum
from .reductions import all, any, argmin, prod, std, var  # noqa: A004 - NumPy's names
from .scans import cumprod, cumsum
from .sorting import argsort, sort, topk


def _arr(x: ArrayLike) -> GPUArray:
    return x if isinstance(x, GPUArray) else to_array(x, None, "asarray")


def exp(x: ArrayLike) -> GPUArray:
    """e**x, elementwise."""
    return unary("exp", x)


def log(x: ArrayLike) -> GPUArray:
    """Natural logarithm, elementwise."""
    return unary("log", x)


def sqrt(x: ArrayLike) -> GPUArray:
    """Square root, elementwise."""
    return unary("sqrt", x)


def rsqrt(x: ArrayLike) -> GPUArray:
    """1 / sqrt(x), elementwise."""
    return unary("rsqrt", x)


def sin(x: ArrayLike) -> GPUArray:
    """Sine, elementwise."""
    return unary("sin", x)


def cos(x: ArrayLike) -> GPUArray:
    """Cosine, elementwise."""
    return unary("cos", x)


def tanh(x: ArrayLike) -> GPUArray:
    """Hyperbolic tangent, elementwise."""
    return unary("tanh", x)


def sigmoid(x: ArrayLike) -> GPUArray:
    """1 / (1 + exp(-x)), elementwise."""
    return unary("sigmoid", x)


def erf(x: ArrayLike) -> GPUArray:
    """The error function, elementwise."""
    return unary("erf", x)


def softplus(x: ArrayLike) -> GPUArray:
    """log(1 + exp(x)), elementwise, without overflow (torch's softplus, beta 1); float
    inputs only."""
    return unary("softplus", x)


def abs(x: ArrayLike) -> GPUArray:  # noqa: A001 - NumPy's name
    """Absolute value, elementwise."""
    return unary("abs", x)


def negative(x: ArrayLike) -> GPUArray:
    """-x, elementwise."""
    return unary("neg", x)


def logical_not(x: ArrayLike) -> GPUArray:
    """not x, elementwise (any dtype; nonzero is true)."""
    return unary("logical_not", x)


def invert(x: ArrayLike) -> GPUArray:
    """~x: bitwise not of integers, logical not of bools (NumPy's invert)."""
    return unary("invert", x)


bitwise_invert = invert  # NumPy 2 / array API name


def add(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a + b, elementwise with broadcasting."""
    return binary("add", a, b)


def subtract(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a - b, elementwise with broadcasting."""
    return binary("sub", a, b)


def multiply(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a * b, elementwise with broadcasting."""
    return binary("mul", a, b)


def divide(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a / b (true division), elementwise with broadcasting."""
    return binary("div", a, b)


def power(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a ** b, elementwise with broadcasting."""
    return binary("pow", a, b)


def floor_divide(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a // b, elementwise with broadcasting, as NumPy's: the floor of the quotient;
    integers divided by zero give 0, floats inf or NaN."""
    return binary("floor_divide", a, b)


def remainder(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a % b, elementwise with broadcasting, as NumPy's (Python's): the remainder takes the
    divisor's sign; integers modulo zero give 0, floats NaN."""
    return binary("remainder", a, b)


mod = remainder  # NumPy's other name (np.mod is np.remainder)


def maximum(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """Elementwise maximum; NaN propagates."""
    return binary("maximum", a, b)


def minimum(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """Elementwise minimum; NaN propagates."""
    return binary("minimum", a, b)


def equal(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a == b, elementwise."""
    return binary("eq", a, b)


def not_equal(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a != b, elementwise."""
    return binary("ne", a, b)


def less(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a < b, elementwise."""
    return binary("lt", a, b)


def less_equal(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a <= b, elementwise."""
    return binary("le", a, b)


def greater(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a > b, elementwise."""
    return binary("gt", a, b)


def greater_equal(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a >= b, elementwise."""
    return binary("ge", a, b)


def logical_and(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a and b, elementwise (any dtypes; nonzero is true)."""
    return binary("logical_and", a, b)


def logical_or(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a or b, elementwise (any dtypes; nonzero is true)."""
    return binary("logical_or", a, b)


def bitwise_and(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a & b of integer or bool arrays (floats raise DTypeError, as in NumPy)."""
    return binary("bitwise_and", a, b)


def bitwise_or(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a | b of integer or bool arrays (floats raise DTypeError, as in NumPy)."""
    return binary("bitwise_or", a, b)


def bitwise_xor(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a ^ b of integer or bool arrays (floats raise DTypeError, as in NumPy)."""
    return binary("bitwise_xor", a, b)


def where(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> GPUArray:
    """Elementwise choice: `x` where `condition` is true, else `y`, as NumPy's `where`.

    Args:
        condition: An array of any dtype (nonzero is true).
        x: Values where the condition holds (an array or a Python scalar).
        y: Values elsewhere; `x` and `y` promote to one dtype (Python scalars are weak).

    Returns:
        A new array of the broadcast shape of the three arguments.

    Raises:
        ShapeError: The shapes do not broadcast.
    """
    c = _node_of(condition, None, "where")
    nx, ny = _pair(x, y, "where")
    return GPUArray(runtime.record("where", (c, nx, ny)))


def clip(x: ArrayLike, a_min: ArrayLike | None, a_max: ArrayLike | None) -> GPUArray:
    """Limit the values of `x` to [a_min, a_max], as NumPy's `clip`.

    Args:
        x: The array.
        a_min: The lower bound (a number or an array that broadcasts), or None for none.
        a_max: The upper bound, or None for none.

    Returns:
        A new array: `minimum(maximum(x, a_min), a_max)`.

    Raises:
        DTypeError: A bound that is not a number or an array (a string).
    """
    out = _arr(x)
    for bound in (a_min, a_max):
        if isinstance(bound, str):
            raise errors.user_error(errors.DTypeError, "clip", f"bounds must be numbers or "
                                    f"arrays, got {bound!r}")  # fmt: skip
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


def sum(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    """Sum over `axis`, as NumPy's `np.sum`.

    Args:
        x: The array (or anything `gpk.asarray` takes).
        axis: None (every element), an axis, or a tuple of axes; negative axes count from
            the end.
        keepdims: Keep the reduced axes with size 1, so the result broadcasts against `x`.

    Returns:
        A new array: integer and bool inputs sum in int64, as NumPy.

    Raises:
        AxisError: An axis out of range or repeated (a ValueError and an IndexError).
    """
    return reduce("sum", x, axis, keepdims)


def mean(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Arithmetic mean over `axis`, as NumPy's `np.mean`.

    Args:
        x: The array (or anything `gpk.asarray` takes).
        axis: None (every element), an axis, or a tuple of axes; negative axes count from
            the end.
        keepdims: Keep the reduced axes with size 1, so the result broadcasts against `x`.

    Returns:
        A new array: float64 for integer inputs, else the input's dtype.

    Raises:
        AxisError: An axis out of range or repeated (a ValueError and an IndexError).
    """
    return reduce("mean", x, axis, keepdims)


def max(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    """Maximum over `axis`, as NumPy's `np.max`.

    Args:
        x: The array (or anything `gpk.asarray` takes).
        axis: None (every element), an axis, or a tuple of axes; negative axes count from
            the end.
        keepdims: Keep the reduced axes with size 1, so the result broadcasts against `x`.

    Returns:
        A new array of the input's dtype.

    Raises:
        AxisError: An axis out of range or repeated (a ValueError and an IndexError).
    """
    return reduce("max", x, axis, keepdims)


def min(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    """Minimum over `axis`, as NumPy's `np.min`.

    Args:
        x: The array (or anything `gpk.asarray` takes).
        axis: None (every element), an axis, or a tuple of axes; negative axes count from
            the end.
        keepdims: Keep the reduced axes with size 1, so the result broadcasts against `x`.

    Returns:
        A new array of the input's dtype.

    Raises:
        AxisError: An axis out of range or repeated (a ValueError and an IndexError).
    """
    return reduce("min", x, axis, keepdims)


def argmax(x: ArrayLike, axis: int | None = None, keepdims: bool = False) -> GPUArray:
    """Index of the maximum along `axis`, as NumPy's `argmax` (the first one on ties).

    Args:
        x: The array.
        axis: An axis, or None for the index into the flattened array.
        keepdims: Keep the reduced axis with size 1.

    Returns:
        A new int64 array.

    Raises:
        AxisError: The axis is out of range.
    """
    return reduce("argmax", x, axis, keepdims)


def reshape(x: ArrayLike, shape: Sequence[int]) -> GPUArray:
    """`x` with a new shape and the same elements, as NumPy's `reshape`.

    Args:
        x: The array.
        shape: The new shape; one dimension may be -1 (inferred).

    Returns:
        A view of `x` when NumPy's would be one (writes through it change `x`), else a new
        array.

    Raises:
        ShapeError: The sizes differ, or more than one -1.
    """
    return _arr(x).reshape(tuple(shape))


def transpose(x: ArrayLike, axes: Sequence[int] | None = None) -> GPUArray:
    """`x` with its axes permuted, as NumPy's `transpose` (`gpk.permute` is the same).

    Args:
        x: The array.
        axes: A permutation of the axes, or None to reverse them.

    Returns:
        A view of `x`.

    Raises:
        ShapeError: `axes` is not a permutation of x's axes.
    """
    return _arr(x).transpose(*(() if axes is None else (tuple(axes),)))


permute = transpose


def swapaxes(x: ArrayLike, a: int, b: int) -> GPUArray:
    """`x` with axes `a` and `b` exchanged, as NumPy's `swapaxes`.

    Args:
        x: The array.
        a: One axis (negative counts from the end).
        b: The other axis.

    Returns:
        A view of `x`.

    Raises:
        AxisError: An axis out of range.
    """
    return _arr(x).swapaxes(a, b)


def squeeze(x: ArrayLike, axis: int | Sequence[int] | None = None) -> GPUArray:
    """`x` without axes of size 1, as NumPy's `squeeze`.

    Args:
        x: The array.
        axis: The axis or axes to remove, or None for every axis of size 1.

    Returns:
        A view of `x`.

    Raises:
        ShapeError: A named axis does not have size 1.
    """
    return _arr(x).squeeze(axis)


def astype(x: ArrayLike, dtype: Any) -> GPUArray:
    """`x` converted to `dtype`, as NumPy's `astype`.

    Args:
        x: The array.
        dtype: A dtype: `gpk.float16`, a name ("bf16", "int32"), a NumPy dtype or a Python
            type.

    Returns:
        A new array (never a view, even for the same dtype).

    Raises:
        DTypeError: The dtype is not supported.
    """
    return _arr(x).astype(dtype)


def concatenate(arrays: Sequence[ArrayLike], axis: int = 0) -> GPUArray:
    """Join arrays along an existing axis, as NumPy's `concatenate`.

    Args:
        arrays: The arrays; equal shapes except along `axis`. Their dtypes promote to one.
        axis: The axis to join along (negative counts from the end).

    Returns:
        A new array.

    Raises:
        ShapeError: No arrays, 0-d arrays, or shapes that differ off `axis`.
    """
    xs = [_arr(a) for a in arrays]
    if not xs:
        raise errors.user_error(errors.ShapeError, "concatenate", "need at least one array")
    if builtins.any(x.ndim == 0 for x in xs):
        raise errors.user_error(errors.ShapeError, "concatenate", "zero-dimensional arrays "
                                "cannot be concatenated")  # fmt: skip
    ax = _axes("concatenate", (axis,), xs[0])[0]
    return GPUArray(runtime.record("concat", tuple(x._node for x in xs), {"axis": ax},
                                   "concatenate"))  # fmt: skip


def stack(arrays: Sequence[ArrayLike], axis: int = 0) -> GPUArray:
    """Join arrays of one shape along a new axis, as NumPy's `stack`.

    Args:
        arrays: The arrays, all of the same shape.
        axis: Where the new axis goes in the result.

    Returns:
        A new array with one more dimension.

    Raises:
        ShapeError: No arrays, or arrays of different shapes.
    """
    xs = [_arr(a) for a in arrays]
    if not xs:
        raise errors.user_error(errors.ShapeError, "stack", "need at least one array")
    try:
        if len({x.shape for x in xs}) != 1:
            raise shapes.ShapeRuleError("all input arrays must have the same shape")
        ax = shapes.normalize_axis(axis, xs[0].ndim + 1)
    except shapes.ShapeRuleError as e:
        raise errors.op_error(
            "stack", e, [(x.shape, x.dtype) for x in xs], user_location()
        ) from None
    return concatenate([expand_dims(x, ax) for x in xs], axis=ax)


def realize(*xs: GPUArray) -> None:
    """Run everything pending under these arrays in one go: one graph, fused together.

    Args:
        *xs: The arrays to compute (lazy mode); realized ones cost nothing.
    """
    runtime.realize([x._node for x in xs])


__all__ = [
    "abs", "add", "all", "any", "argmax", "argmin", "argsort", "astype", "bitwise_and",
    "bitwise_invert", "bitwise_or", "bitwise_xor", "broadcast_to", "clip", "concatenate", "cos",
    "cumprod", "cumsum", "divide", "dot", "einsum", "equal", "erf", "exp", "expand_dims", "eye",
    "floor_divide", "greater", "greater_equal", "invert", "less", "less_equal", "linspace",
    "log", "logical_and", "logical_not", "logical_or", "matmul", "max", "maximum", "mean",
    "min", "minimum", "mod", "multiply", "negative", "not_equal", "permute", "power", "prod",
    "realize", "remainder", "reshape", "rsqrt", "sigmoid", "sin", "softplus", "sort", "sqrt",
    "squeeze", "stack", "std", "subtract", "sum", "swapaxes", "take", "tanh", "topk",
    "transpose", "var", "where",
]  # fmt: skip
