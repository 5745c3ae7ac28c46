"""The small expression IR inside fused_elementwise and fused_reduce nodes.

An expression is a nested tuple (hashable, so it can live in node attrs):
  ("in", k)                  input k of the fused node, broadcast to the output shape
  ("const", value, dtype)    a scalar
  ("cast", dtype, e)         conversion
  ("gelu", approximate, e)   'tanh' or 'none'
  (op, e1[, e2[, e3]])       any other unary/binary op of ir.ops, or "where"
Every subexpression has the dtype the unfused op would have had (ir.ops rules), so the
NumPy reference and the generated CUDA code agree on types; float work is done in
float32 (float64 for float64) and rounded once, at the store.
"""

from __future__ import annotations

from typing import Any

from . import ops
from .dtypes import DType, as_dtype

Expr = tuple[Any, ...]
_SCALAR: tuple[int, ...] = ()


def dtype_of(expr: Expr, input_dtypes: list[DType]) -> DType:
    head = expr[0]
    if head == "in":
        return input_dtypes[expr[1]]
    if head in ("const", "cast"):
        return as_dtype(expr[2] if head == "const" else expr[1])
    if head == "gelu":
        child = dtype_of(expr[2], input_dtypes)
        return ops.infer("gelu", [(_SCALAR, child)], {"approximate": expr[1]})[1]
    kids = [(_SCALAR, dtype_of(e, input_dtypes)) for e in expr[1:]]
    return ops.infer(head, kids, {})[1]


def inputs_used(expr: Expr) -> set[int]:
    if expr[0] == "in":
        return {expr[1]}
    if expr[0] == "const":
        return set()
    start = 2 if expr[0] in ("cast", "gelu") else 1
    out: set[int] = set()
    for e in expr[start:]:
        out |= inputs_used(e)
    return out


def count_ops(expr: Expr) -> int:
    if expr[0] in ("in", "const"):
        return 0
    start = 2 if expr[0] in ("cast", "gelu") else 1
    return 1 + sum(count_ops(e) for e in expr[start:])


def to_source(expr: Expr, names: list[str] | None = None) -> str:
    """Readable form for graph dumps: mul(add(in0, 1.0), in1); `names` replaces in0, in1."""
    head = expr[0]
    if head == "in":
        return names[expr[1]] if names is not None else f"in{expr[1]}"
    if head == "const":
        return repr(expr[1])
    if head == "cast":
        return f"{as_dtype(expr[1]).short}({to_source(expr[2], names)})"
    if head == "gelu":
        return f"gelu[{expr[1]}]({to_source(expr[2], names)})"
    return f"{head}({', '.join(to_source(e, names) for e in expr[1:])})"
