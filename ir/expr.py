"""The small expression IR inside fused_elementwise and fused_reduce nodes.

An expression is a nested tuple (hashable, so it can live in node attrs):
  ("in", k)                      input k of the fused node, broadcast to the output shape
  ("const", value, dtype)        a scalar
  (op, *attrs, *operands)        an op of ir/elementwise.py: its attribute values in declared
                                 order, then its operand expressions; so ("cast", dtype, e),
                                 ("gelu", approximate, e), ("add", e1, e2), ("where", c, x, y)
Every subexpression has the dtype the unfused op would have had (ir.ops rules), so the
NumPy reference and the generated CUDA code agree on types; float work is done in
float32 (float64 for float64) and rounded once, at the store.
"""

from __future__ import annotations

from typing import Any

from . import ops
from .dtypes import DType, as_dtype
from .elementwise import OPS, Elementwise

Expr = tuple[Any, ...]
_SCALAR: tuple[int, ...] = ()


def node_expr(op: str, attrs: dict[str, Any], operands: list[Expr] | tuple[Expr, ...]) -> Expr:
    """The expression of elementwise op `op` (with these node attrs) over `operands`."""
    return (op, *OPS[op].attr_values(attrs), *operands)


def split(expr: Expr) -> tuple[Elementwise, dict[str, Any], tuple[Expr, ...]]:
    """An op's expression as (its declaration, its attributes, its operand expressions)."""
    decl = OPS[expr[0]]
    n = len(decl.attrs)
    attrs = {a.name: v for a, v in zip(decl.attrs, expr[1 : 1 + n], strict=True)}
    return decl, attrs, expr[1 + n :]


def operands(expr: Expr) -> tuple[Expr, ...]:
    """The operand expressions (none for inputs and constants)."""
    if expr[0] in ("in", "const"):
        return ()
    return expr[1 + len(OPS[expr[0]].attrs) :]


def dtype_of(expr: Expr, input_dtypes: list[DType]) -> DType:
    head = expr[0]
    if head == "in":
        return input_dtypes[expr[1]]
    if head == "const":
        return as_dtype(expr[2])
    _, attrs, kids = split(expr)
    specs = [(_SCALAR, dtype_of(e, input_dtypes)) for e in kids]
    return ops.infer(head, specs, attrs)[1]


def inputs_used(expr: Expr) -> set[int]:
    if expr[0] == "in":
        return {expr[1]}
    out: set[int] = set()
    for e in operands(expr):
        out |= inputs_used(e)
    return out


def count_ops(expr: Expr) -> int:
    if expr[0] in ("in", "const"):
        return 0
    return 1 + sum(count_ops(e) for e in operands(expr))


def to_source(expr: Expr, names: list[str] | None = None) -> str:
    """Readable form for graph dumps: mul(add(in0, 1.0), in1); `names` replaces in0, in1."""
    head = expr[0]
    if head == "in":
        return names[expr[1]] if names is not None else f"in{expr[1]}"
    if head == "const":
        return repr(expr[1])
    _, attrs, kids = split(expr)
    parts = []
    for e in kids:  # a plain loop: one frame per level of a deep fused chain, not two
        parts.append(to_source(e, names))
    args = ", ".join(parts)
    if head == "cast":
        return f"{as_dtype(attrs['dtype']).short}({args})"
    if attrs:
        return f"{head}[{', '.join(str(v) for v in attrs.values())}]({args})"
    return f"{head}({args})"
