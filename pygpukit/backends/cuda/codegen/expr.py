"""The expression IR of ir/expr.py as CUDA C statements in compute types.

Each subexpression has the dtype the unfused op would have (ir.ops rules, via
ir.expr.dtype_of), is evaluated in that dtype's compute type from the op's C template
(ir/elementwise.py), and integer results wrap at their own width after every op, like
NumPy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pygpukit.ir import DType, dtypes
from pygpukit.ir.elementwise import Elementwise
from pygpukit.ir.expr import Expr, dtype_of, node_expr, operands, split

from . import cdtypes as ct

_OPERAND_NAMES = ("x", "y", "z")


@dataclass
class ExprCode:
    lines: list[str] = field(default_factory=list)
    n: int = 0

    def tmp(self, ctype: str, code: str) -> str:
        name = f"t{self.n}"
        self.n += 1
        self.lines.append(f"{ctype} {name} = {code};")
        return name


def _operand(code: str, mode: str, src: DType, common: DType, r: DType) -> str:
    if mode == "result":
        return ct.to_compute(code, src, r)
    if mode == "common":
        return ct.to_compute(code, src, common)
    if mode == "round":
        return ct.round_through(code, src, r)
    return code


def lower(decl: Elementwise, attrs: dict[str, Any], vals: list[str], kd: list[DType],
          r: DType) -> str:  # fmt: skip
    """The C expression of one op over operand codes `vals` (of dtypes kd), result dtype r."""
    modes = decl.operand_modes()
    common = dtypes.numpy_result_type(*kd) if "common" in modes else r
    subst = {
        name: _operand(v, mode, d, common, r)
        for name, v, mode, d in zip(_OPERAND_NAMES, vals, modes, kd, strict=False)
    }
    subst |= decl.cuda_attrs(decl.attr_values(attrs))
    cf = ct.compute(r)
    subst |= {"f": "f" if cf == "float" else "", "ct": cf, "err": "err, tag"}
    code = decl.cuda_template(r).format(**subst)
    return f"(({cf})({code}))" if r.is_int else code


def emit(expr: Expr, in_dtypes: list[DType], in_codes: list[str], code: ExprCode) -> str:
    """Appends statements to `code`; returns the variable (or literal) holding the value."""
    head = expr[0]
    if head == "in":
        return in_codes[expr[1]]
    if head == "const":
        return ct.literal(expr[1], dtypes.as_dtype(expr[2]))
    r = dtype_of(expr, in_dtypes)
    decl, attrs, kids = split(expr)
    vals = [emit(k, in_dtypes, in_codes, code) for k in kids]
    kd = [dtype_of(k, in_dtypes) for k in kids]
    return code.tmp(ct.compute(r), lower(decl, attrs, vals, kd, r))


def uses_error_word(expr: Expr, in_dtypes: list[DType]) -> bool:
    """Whether the expression needs `err`/`tag` in scope (integer pow)."""
    if expr[0] in ("in", "const"):
        return False
    decl = split(expr)[0]
    if "{err}" in decl.cuda_template(dtype_of(expr, in_dtypes)):
        return True
    return any(uses_error_word(e, in_dtypes) for e in operands(expr))


def step_expr(op: str, attrs: dict, n_inputs: int) -> Expr:
    """A single elementwise op as a one-op expression, so it takes the same generator."""
    return node_expr(op, attrs, [("in", k) for k in range(n_inputs)])
