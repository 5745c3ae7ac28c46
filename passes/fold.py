"""Constant folding: ops over uniform constants (`full`) become one `full`.

Only values with a constant-size description are produced (`full`, and `arange` for exact
integer affine maps), so a big tensor is never folded into node attrs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.ir import Graph, Node
from pygpukit.ir.elementwise import OPS as ELEMENTWISE
from pygpukit.ir.evaluate import evaluate

from .rewrite import const_value, rewrite

_VIEWS = ("reshape", "permute", "expand")
_MANTISSA = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def _full(n: Node, value: Any) -> Node:
    v = n.dtype.np.type(value).item()
    if isinstance(v, float) and not math.isfinite(v) and not n.dtype.is_float:
        raise ValueError("not representable")
    return Node("full", (), {"shape": n.shape, "dtype": n.dtype.name, "value": v}, n.shape,
                n.dtype, n.loc, "constant_folding")  # fmt: skip


def _eval_scalar(n: Node, values: list[Any]) -> Any:
    # Through the evaluator the NumPy backend runs, so the folded value rounds like the op.
    arrays = [np.asarray(v, dtype=i.dtype.np) for v, i in zip(values, n.inputs, strict=True)]
    return np.asarray(evaluate(n.op, arrays, n.attrs, n.dtype)).reshape(()).item()


def _fold_reduce(n: Node, value: Any) -> Any:
    count = math.prod(n.inputs[0].shape) // max(math.prod(n.shape), 1)
    if count == 0:
        return None
    if n.op in ("max", "min"):
        return value
    if n.op in ("argmax", "argmin"):
        return 0
    if n.op in ("any", "all"):
        return bool(value)
    if n.op == "prod":
        # A product of ones is one, of integer zeros zero (a float zero's sign would
        # alternate); other products round or overflow: leave them to the kernel.
        exact = value == 1 or (value == 0 and not isinstance(value, float))
        return value if exact else None
    if n.op == "mean":
        return value
    if n.dtype.is_int or n.dtype.kind == "b":
        return int(value) * count
    total = float(value) * count
    if float(value).is_integer() and abs(total) < 2 ** _MANTISSA.get(n.dtype.name, 0):
        return total  # every partial sum is an exact integer: any order gives this
    return None  # other float sums round per partial sum; leave them to the kernel


def _fold_arange(n: Node) -> Node | None:
    """Exact integer maps of arange: cast between ints, + c, * c."""
    a = next((i for i in n.inputs if i.op == "arange"), None)
    if a is None or not (a.dtype.is_int and n.dtype.is_int):
        return None
    start, step = a.attrs["start"], a.attrs["step"]
    if not all(isinstance(v, int) for v in (start, step)):
        return None
    if n.op == "cast" and n.shape == a.shape:
        pass
    elif n.op in ("add", "mul", "sub") and n.shape == a.shape:
        other = n.inputs[1] if n.inputs[0] is a else n.inputs[0]
        c = const_value(other)
        if not isinstance(c, int) or isinstance(c, bool):
            return None
        if n.op == "add":
            start += c
        elif n.op == "sub":
            if n.inputs[0] is not a:
                return None
            start -= c
        else:
            start, step = start * c, step * c
    else:
        return None
    last = start + step * (max(a.shape[0], 1) - 1)
    info = np.iinfo(n.dtype.np)
    if not (info.min <= start <= info.max and info.min <= last <= info.max):
        return None
    attrs = {"shape": n.shape, "dtype": n.dtype.name, "start": start, "step": step}
    return Node("arange", (), attrs, n.shape, n.dtype, n.loc, "constant_folding")


def constant_folding(graph: Graph) -> Graph:
    def rule(n: Node) -> Node | None:
        if not n.inputs or n.op == "input":
            return None
        values = [const_value(i) for i in n.inputs]
        try:
            if all(v is not None for v in values):
                if n.op in ELEMENTWISE:
                    return _full(n, _eval_scalar(n, values))
                if n.op in _VIEWS or (n.op == "index" and len(n.inputs) == 1):
                    return _full(n, values[0])
                if n.op == "concat" and len({(repr(v), i.dtype) for v, i in
                                            zip(values, n.inputs, strict=True)}) == 1:  # fmt: skip
                    return _full(n, values[0])
                if n.kind == "reduce":
                    r = _fold_reduce(n, values[0])
                    return None if r is None else _full(n, r)
                return None
            if n.op in ("cast", "add", "sub", "mul"):
                return _fold_arange(n)
        except (ValueError, TypeError, ArithmeticError, OverflowError):
            return None  # a value the kernel would reject at run time: let it run and fail
        return None

    return rewrite(graph, rule)
