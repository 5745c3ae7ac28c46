"""Evaluating elementwise ops with their NumPy references, in the precision the kernels use.

The NumPy backend runs its elementwise steps and fused expressions through here, and
constant folding evaluates through the same functions, so a folded value rounds exactly
like the op it replaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import DType, as_dtype, numpy_result_type
from .elementwise import OPS
from .expr import Expr, dtype_of, split

_F32 = np.dtype(np.float32)


def compute_dtype(d: np.dtype) -> np.dtype:
    """f16 and bf16 compute in f32 (the kernels accumulate in f32); others as they are."""
    if d.itemsize == 2 and d.kind in "fV" or d.name == "bfloat16":
        return _F32
    return d


def up(a: np.ndarray) -> np.ndarray:
    """a in its compute dtype."""
    ct = compute_dtype(a.dtype)
    return a if a.dtype == ct else a.astype(ct)


def down(a: np.ndarray | np.generic, dtype: DType) -> np.ndarray:
    """A computed value rounded once to dtype."""
    return np.asarray(a).astype(dtype.np, copy=False)


def _operand(a: np.ndarray, mode: str, common: DType | None, dtype: DType) -> np.ndarray:
    if mode in ("result", "round"):
        return a.astype(dtype.np, copy=False)
    if mode == "common" and common is not None:
        return a.astype(common.np, copy=False)
    return a


def evaluate(op: str, arrays: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """One elementwise op as its unfused kernel computes it: operands converted as the op
    declares, float work in the compute precision, the result rounded once to dtype."""
    decl = OPS[op]
    modes = decl.operand_modes()
    common = None
    if "common" in modes:
        common = numpy_result_type(*[as_dtype(a.dtype) for a in arrays])
    kwargs = dict(zip([a.name for a in decl.attrs], decl.attr_values(attrs), strict=True))
    with np.errstate(all="ignore"):
        args = [up(_operand(a, m, common, dtype)) for a, m in zip(arrays, modes, strict=True)]
        return down(decl.reference(*args, **kwargs), dtype)


def evaluate_expr(expr: Expr, ins: list[np.ndarray]) -> np.ndarray:
    """An expression of ir/expr.py over the fused node's inputs, as the generated kernel
    computes it: every op in the compute precision, casts rounding through their dtype,
    the result not yet rounded to the node's dtype."""
    with np.errstate(all="ignore"):
        return _ev(expr, ins, [as_dtype(a.dtype) for a in ins])


def _ev(e: Expr, ins: list[np.ndarray], in_dtypes: list[DType]) -> np.ndarray:
    # Module level, not a recursive closure (a reference cycle per call).
    head = e[0]
    if head == "in":
        x = ins[e[1]]
        return x.astype(compute_dtype(x.dtype), copy=False)
    if head == "const":
        return np.asarray(e[1], dtype=compute_dtype(as_dtype(e[2]).np))
    decl, attrs, kids = split(e)
    args = [_ev(k, ins, in_dtypes) for k in kids]
    modes = decl.operand_modes()
    if "round" in modes:
        d = dtype_of(e, in_dtypes).np
        args = [a.astype(d).astype(compute_dtype(d), copy=False) if m == "round" else a
                for a, m in zip(args, modes, strict=True)]  # fmt: skip
    return np.asarray(decl.reference(*args, **attrs))
