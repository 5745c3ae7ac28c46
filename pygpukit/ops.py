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
    c = _node_of(condition, None, "where")
    nx, ny = _pair(x, y, "where")
    return GPUArray(runtime.record("where", (c, nx, ny)))


def clip(x: ArrayLike, a_min: ArrayLike | None, a_max: ArrayLike | None) -> GPUArray:
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
    return reduce("sum", x, axis, keepdims)


def mean(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:
    return reduce("mean", x, axis, keepdims)


def max(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    return reduce("max", x, axis, keepdims)


def min(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> GPUArray:  # noqa: A001
    return reduce("min", x, axis, keepdims)


def argmax(x: ArrayLike, axis: int | None = None, keepdims: bool = False) -> GPUArray:
    return reduce("argmax", x, axis, keepdims)


def reshape(x: ArrayLike, shape: Sequence[int]) -> GPUArray:
    return _arr(x).reshape(tuple(shape))


def transpose(x: ArrayLike, axes: Sequence[int] | None = None) -> GPUArray:
    return _arr(x).transpose(*(() if axes is None else (tuple(axes),)))


permute = transpose


def swapaxes(x: ArrayLike, a: int, b: int) -> GPUArray:
    return _arr(x).swapaxes(a, b)


def squeeze(x: ArrayLike, axis: int | Sequence[int] | None = None) -> GPUArray:
    return _arr(x).squeeze(axis)


def astype(x: ArrayLike, dtype: Any) -> GPUArray:
    return _arr(x).astype(dtype)


def concatenate(arrays: Sequence[ArrayLike], axis: int = 0) -> GPUArray:
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
    """Run everything pending under these arrays in one go (one graph, fused together)."""
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
