"""The expression IR of ir/expr.py as CUDA C statements in compute types.

Each subexpression has the dtype the unfused op would have (ir.ops rules, via
ir.expr.dtype_of), is evaluated in that dtype's compute type, and integer results wrap
at their own width after every op, like NumPy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pygpukit.ir import DType, dtypes
from pygpukit.ir.expr import Expr, dtype_of

from . import cdtypes as ct

_FLOAT_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin", "cos": "cos",
             "tanh": "tanh", "erf": "erf"}  # fmt: skip
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@dataclass
class ExprCode:
    lines: list[str] = field(default_factory=list)
    n: int = 0

    def tmp(self, ctype: str, code: str) -> str:
        name = f"t{self.n}"
        self.n += 1
        self.lines.append(f"{ctype} {name} = {code};")
        return name


def _fn(name: str, d: DType) -> str:
    return name + ("f" if ct.compute(d) == "float" else "")


def _wrap(code: str, d: DType) -> str:
    return f"(({ct.compute(d)})({code}))" if d.is_int else code


def _unary(op: str, a: str, src: DType, r: DType, attr: str) -> str:
    x = ct.to_compute(a, src, r) if r.is_float or op in ("neg", "abs") else a
    if op == "neg":
        return _wrap(f"-{x}", r)
    if op == "abs":
        if r.name == "bool":
            return x
        return f"{_fn('fabs', r)}({x})" if r.is_float else _wrap(f"({x} < 0 ? -{x} : {x})", r)
    if op == "logical_not":
        return f"(!({a} != 0))"
    if op in _FLOAT_FN:
        return f"{_fn(_FLOAT_FN[op], r)}({x})"
    one = "1.0f" if ct.compute(r) == "float" else "1.0"
    if op == "rsqrt":
        return f"({one} / {_fn('sqrt', r)}({x}))"
    if op == "sigmoid":
        return f"pgk_sigmoid({x})"
    if op == "silu":
        return f"({x} * pgk_sigmoid({x}))"
    if op == "gelu":
        return f"pgk_gelu_{'tanh' if attr == 'tanh' else 'erf'}({x})"
    raise KeyError(f"no CUDA code for unary op {op!r}")


def _binary(op: str, a: str, b: str, da: DType, db: DType, r: DType) -> str:
    if op in _CMP:
        c = dtypes.result_type(da, db)
        return f"({ct.to_compute(a, da, c)} {_CMP[op]} {ct.to_compute(b, db, c)})"
    if op == "logical_and":
        return f"(({a} != 0) && ({b} != 0))"
    if op == "logical_or":
        return f"(({a} != 0) || ({b} != 0))"
    x, y = ct.to_compute(a, da, r), ct.to_compute(b, db, r)
    if r.name == "bool":
        bool_ops = {"add": "||", "maximum": "||", "mul": "&&", "minimum": "&&"}
        return f"({x} {bool_ops[op]} {y})"
    if op in ("add", "sub", "mul", "div"):
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
        return _wrap(f"{x} {sym} {y}", r)
    if op == "maximum":
        return f"pgk_max<{ct.compute(r)}>({x}, {y})"
    if op == "minimum":
        return f"pgk_min<{ct.compute(r)}>({x}, {y})"
    if op == "pow":
        if r.is_float:
            return f"{_fn('pow', r)}({x}, {y})"
        return f"pgk_ipow<{ct.compute(r)}>({x}, {y}, err, tag)"
    raise KeyError(f"no CUDA code for binary op {op!r}")


def emit(expr: Expr, in_dtypes: list[DType], in_codes: list[str], code: ExprCode) -> str:
    """Appends statements to `code`; returns the variable (or literal) holding the value."""
    head = expr[0]
    if head == "in":
        return in_codes[expr[1]]
    if head == "const":
        return ct.literal(expr[1], dtypes.as_dtype(expr[2]))
    r = dtype_of(expr, in_dtypes)
    if head == "cast":
        src = dtype_of(expr[2], in_dtypes)
        a = emit(expr[2], in_dtypes, in_codes, code)
        return code.tmp(ct.compute(r), ct.round_through(a, src, r))
    if head == "gelu":
        src = dtype_of(expr[2], in_dtypes)
        a = emit(expr[2], in_dtypes, in_codes, code)
        return code.tmp(ct.compute(r), _unary("gelu", a, src, r, expr[1]))
    kids = expr[1:]
    vals = [emit(k, in_dtypes, in_codes, code) for k in kids]
    kd = [dtype_of(k, in_dtypes) for k in kids]
    if head == "where":
        x, y = ct.to_compute(vals[1], kd[1], r), ct.to_compute(vals[2], kd[2], r)
        return code.tmp(ct.compute(r), f"(({vals[0]}) ? {x} : {y})")
    if len(kids) == 1:
        return code.tmp(ct.compute(r), _unary(head, vals[0], kd[0], r, ""))
    return code.tmp(ct.compute(r), _binary(head, vals[0], vals[1], kd[0], kd[1], r))


def uses_error_word(expr: Expr, in_dtypes: list[DType]) -> bool:
    """Whether the expression needs `err`/`tag` in scope (integer pow)."""
    if expr[0] in ("in", "const"):
        return False
    start = 2 if expr[0] in ("cast", "gelu") else 1
    if expr[0] == "pow" and not dtype_of(expr, in_dtypes).is_float:
        return True
    return any(uses_error_word(e, in_dtypes) for e in expr[start:])


def step_expr(op: str, attrs: dict, n_inputs: int) -> Expr:
    """A single elementwise op as a one-op expression, so it takes the same generator."""
    ins = tuple(("in", k) for k in range(n_inputs))
    if op == "cast":
        return ("cast", attrs["dtype"], ins[0])
    if op == "gelu":
        return ("gelu", attrs.get("approximate", "none"), ins[0])
    return (op, *ins)
