"""Reduction kernels: sum, mean, prod, max, min, argmax, argmin, any, all of an expression
over any axes.

The iteration space is split into kept dims (one output each) and reduced dims. 'block'
gives one block per output with a warp-shuffle tree (long contiguous rows); 'thread' gives
one thread per output walking its row (short rows, or rows strided in memory, where
neighbouring threads then read neighbouring addresses). Accumulation: float for
f32/f16/bf16, double for f64 and for the mean of integers, int64 for integer sums and
products, a 0/1 int for any/all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pygpukit.ir import DType, dtypes
from pygpukit.ir.expr import Expr, dtype_of

from . import cdtypes as ct
from .expr import ExprCode, emit, uses_error_word
from .prelude import PRELUDE
from .source import KernelSource, stable_hash

BLOCK = 256


@dataclass(frozen=True)
class ReduceSpec:
    expr: Expr
    in_dtypes: tuple[DType, ...]
    op: str  # sum mean prod max min argmax argmin any all
    out_dtype: DType
    rank_out: int
    rank_red: int
    strategy: str  # block | thread


def acc_dtype(spec: ReduceSpec) -> DType:
    e = dtype_of(spec.expr, list(spec.in_dtypes))
    if spec.op in ("any", "all"):
        return dtypes.bool_
    if spec.op in ("sum", "mean", "prod"):
        if spec.out_dtype.is_int:
            return dtypes.int64
        if spec.out_dtype == dtypes.float64 or e == dtypes.float64 or not e.is_float:
            return dtypes.float64
        return dtypes.float32
    if spec.op in ("argmax", "argmin"):
        return dtypes.float64 if e == dtypes.float64 else (e if not e.is_float else dtypes.float32)
    return spec.out_dtype


def _acc_ctype(d: DType) -> str:
    # Warp shuffles move 32 and 64-bit words only.
    return "int" if d.name == "bool" or (d.is_int and d.itemsize < 4) else ct.compute(d)


def _init(spec: ReduceSpec, acc: DType) -> str:
    c = _acc_ctype(acc)
    if spec.op in ("sum", "mean", "any"):
        return f"({c})0"
    if spec.op in ("prod", "all"):
        return f"({c})1"
    low = spec.op in ("max", "argmax")
    if acc.is_float:
        inf = "__int_as_float(0x7f800000)"
        if c == "double":
            inf = "__longlong_as_double(0x7ff0000000000000LL)"
        return ("-" if low else "") + inf
    if acc.name == "bool":
        return "0" if low else "1"
    lim = {"int8": 7, "uint8": 8, "int16": 15, "int32": 31, "int64": 63}[acc.name]
    if acc.name == "uint8":
        return "0" if low else "255"
    return f"(({c})(-{(1 << lim) - 1}LL - 1))" if low else f"(({c}){(1 << lim) - 1}LL)"


def params(spec: ReduceSpec) -> tuple[list[str], str]:
    decl = [f"{ct.storage(spec.out_dtype)}* __restrict__ out"]
    decl += [f"const {ct.storage(d)}* __restrict__ in{k}" for k, d in enumerate(spec.in_dtypes)]
    decl += ["i64 n_out", "i64 R"]
    decl += [f"i64 ks{d}" for d in range(spec.rank_out)]
    decl += [f"i64 rs{d}" for d in range(spec.rank_red)]
    for k in range(len(spec.in_dtypes)):
        decl += [f"i64 kst{k}_{d}" for d in range(spec.rank_out)]
        decl += [f"i64 rst{k}_{d}" for d in range(spec.rank_red)]
    decl += ["i64* err", "i64 tag"]
    n_in = len(spec.in_dtypes)
    fmt = "P" * (1 + n_in) + "qq" + "q" * (spec.rank_out + spec.rank_red) * (1 + n_in) + "Pq"
    return decl, fmt


def _decompose(var: str, sizes: str, strides: str, rank: int, n_in: int, dst: str) -> list[str]:
    lines = [f"i64 q_{var} = {var};"]
    for d in reversed(range(rank)):
        c = f"q_{var} % {sizes}{d}" if d else f"q_{var}"
        lines.append(f"{{ const i64 c = {c};" + (f" q_{var} /= {sizes}{d};" if d else ""))
        lines += [f"  {dst}{k} += c * {strides}{k}_{d};" for k in range(n_in)]
        lines.append("}")
    return lines


def _element(spec: ReduceSpec, acc: DType) -> list[str]:
    """Evaluate the expression at reduced index r and fold it into (a, ai)."""
    n_in = len(spec.in_dtypes)
    lines = [f"i64 ro{k} = bo{k};" for k in range(n_in)]
    lines += _decompose("r", "rs", "rst", spec.rank_red, n_in, "ro")
    code = ExprCode()
    loads = [code.tmp(ct.compute(d), ct.load(f"in{k}[ro{k}]", d))
             for k, d in enumerate(spec.in_dtypes)]  # fmt: skip
    v = emit(spec.expr, list(spec.in_dtypes), loads, code)
    e = dtype_of(spec.expr, list(spec.in_dtypes))
    lines += code.lines
    c = _acc_ctype(acc)
    if spec.op in ("sum", "mean", "prod"):
        sym = "*" if spec.op == "prod" else "+"
        lines.append(f"a {sym}= ({c})({ct.to_compute(v, e, acc) if e.name != 'bool' else v});")
    elif spec.op in ("any", "all"):
        sym = "|" if spec.op == "any" else "&"
        lines.append(f"a {sym}= (int)(({v}) != 0);")  # NaN is nonzero, as in NumPy
    elif spec.op in ("max", "min"):
        # Rounded to the result dtype first, as the reference compares stored values.
        rv = ct.round_through(v, e, spec.out_dtype)
        lines.append(f"a = pgk_{spec.op}<{c}>(a, ({c})({rv}));")
    else:
        lines.append(f"pgk_{spec.op}_fold(a, ai, ({c})({v}), r);")
    return lines


_ARGMAX = r"""
template <class T> __device__ __forceinline__ void pgk_argmax_fold(T& a, i64& ai, T b, i64 bi) {
  const bool an = a != a, bn = b != b;
  bool take;
  if (an || bn) take = an && bn ? bi < ai : bn;
  else take = b > a || (b == a && bi < ai);
  if (take) { a = b; ai = bi; }
}
// NumPy's argmin: the first NaN, else the first smallest.
template <class T> __device__ __forceinline__ void pgk_argmin_fold(T& a, i64& ai, T b, i64 bi) {
  const bool an = a != a, bn = b != b;
  bool take;
  if (an || bn) take = an && bn ? bi < ai : bn;
  else take = b < a || (b == a && bi < ai);
  if (take) { a = b; ai = bi; }
}
"""


def _combine(spec: ReduceSpec, c: str, other: str, other_i: str) -> str:
    if spec.op in ("sum", "mean"):
        return f"a += {other};"
    if spec.op == "prod":
        return f"a *= {other};"
    if spec.op in ("any", "all"):
        return f"a {'|' if spec.op == 'any' else '&'}= {other};"
    if spec.op in ("max", "min"):
        return f"a = pgk_{spec.op}<{c}>(a, {other});"
    return f"pgk_{spec.op}_fold(a, ai, {other}, {other_i});"


def _finish(spec: ReduceSpec, acc: DType) -> str:
    if spec.op in ("argmax", "argmin"):
        return "out[o] = ai == 0x7fffffffffffffffLL ? 0 : ai;"
    val = "a"
    if spec.op == "mean":
        val = f"(a / ({ct.compute(acc)})R)"
    src = dtypes.bool_ if acc.name == "bool" else acc
    return f"out[o] = {ct.to_storage(val, src, spec.out_dtype)};"


def generate(spec: ReduceSpec) -> KernelSource:
    """The kernel of `spec`, made once per spec."""
    # Keyed by the spec's repr too: specs compare equal across 0.0 and -0.0 constants.
    return _generate(spec, repr(spec))


@functools.lru_cache(maxsize=2048)
def _generate(spec: ReduceSpec, text: str) -> KernelSource:
    acc = acc_dtype(spec)
    c = _acc_ctype(acc)
    decl, fmt = params(spec)
    name = "pgk_red_" + stable_hash(spec)
    n_in = len(spec.in_dtypes)
    uses_err = uses_error_word(spec.expr, list(spec.in_dtypes))
    lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(']
    lines.append("    " + ",\n    ".join(decl) + ") {")
    lines.append("PGK_PDL_ENTRY")
    if not uses_err:
        lines.append("(void)err; (void)tag;")
    block = spec.strategy == "block"
    if block:
        lines += [f"__shared__ {c} sh_a[32];", "__shared__ i64 sh_i[32];",
                  "for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {"]  # fmt: skip
    else:
        lines.append("for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n_out;"
                     " o += (i64)gridDim.x * blockDim.x) {")  # fmt: skip
    lines += [f"i64 bo{k} = 0;" for k in range(n_in)]
    lines += _decompose("o", "ks", "kst", spec.rank_out, n_in, "bo")
    lines += [f"{c} a = {_init(spec, acc)};", "i64 ai = 0x7fffffffffffffffLL;"]
    start, stride = ("threadIdx.x", "blockDim.x") if block else ("0", "1")
    lines.append(f"for (i64 r = {start}; r < R; r += {stride}) {{")
    lines += _element(spec, acc)
    lines.append("}")
    if block:
        lines += [
            "for (int off = 16; off > 0; off >>= 1) {",
            f"  {c} oa = __shfl_down_sync(0xffffffffu, a, off);",
            "  i64 oi = __shfl_down_sync(0xffffffffu, ai, off);",
            "  " + _combine(spec, c, "oa", "oi"),
            "}",
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            "if (lane == 0) { sh_a[warp] = a; sh_i[warp] = ai; }",
            "__syncthreads();",
            "if (warp == 0) {",
            f"  a = lane < (blockDim.x >> 5) ? sh_a[lane] : ({c})({_init(spec, acc)});",
            "  ai = lane < (blockDim.x >> 5) ? sh_i[lane] : 0x7fffffffffffffffLL;",
            "  for (int off = 16; off > 0; off >>= 1) {",
            f"    {c} oa = __shfl_down_sync(0xffffffffu, a, off);",
            "    i64 oi = __shfl_down_sync(0xffffffffu, ai, off);",
            "    " + _combine(spec, c, "oa", "oi"),
            "  }",
            "  if (lane == 0) { " + _finish(spec, acc) + " }",
            "}",
            "__syncthreads();",
        ]
    else:
        lines.append(_finish(spec, acc))
    lines.append("}")
    lines.append("}")
    return KernelSource(PRELUDE + _ARGMAX + "\n".join(lines) + "\n", name, fmt)
