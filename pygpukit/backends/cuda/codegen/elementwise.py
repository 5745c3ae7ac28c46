"""Elementwise kernels: one expression over an N-d iteration space.

Operands (the output and each input) are 'contig' (linear index), 'scalar' (one element,
broadcast) or 'strided' (per-dim element strides, 0 where broadcast). When nothing is
strided, a vector variant moves up to 16 bytes per load and store. Dynamic offsets (a
0-d integer array read from device memory, times a stride) serve indexing with a device
scalar and the KV-cache store `cache[:, pos] = k`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pygpukit.ir import DType
from pygpukit.ir.expr import Expr, dtype_of

from . import cdtypes as ct
from .expr import ExprCode, emit, uses_error_word
from .prelude import PRELUDE
from .source import KernelSource, stable_hash


@dataclass(frozen=True)
class EwSpec:
    expr: Expr
    in_dtypes: tuple[DType, ...]
    out_dtype: DType
    in_modes: tuple[str, ...]  # contig | scalar | strided
    out_mode: str  # contig | strided
    rank: int  # dims of the (collapsed) iteration space; used by strided operands
    dyn: tuple[tuple[int, DType], ...] = ()  # (operand: -1 output / k input, index dtype)
    vec: int = 1  # elements per thread in the all-contiguous variant


def _name(spec: EwSpec) -> str:
    return "pgk_ew_" + stable_hash(spec)


def params(spec: EwSpec) -> tuple[list[str], str]:
    """C parameter declarations and the launch fmt, in launch order."""
    decl = [f"{ct.storage(spec.out_dtype)}* __restrict__ out"]
    decl += [f"const {ct.storage(d)}* __restrict__ in{k}" for k, d in enumerate(spec.in_dtypes)]
    decl.append("i64 n")
    fmt = "P" * (1 + len(spec.in_dtypes)) + "q"
    strided = _strided_ops(spec)
    if strided:
        decl += [f"i64 s{d}" for d in range(spec.rank)]
        fmt += "q" * spec.rank
        for o in strided:
            decl += [f"i64 st{_op(o)}_{d}" for d in range(spec.rank)]
            fmt += "q" * spec.rank
    for j, (_, d) in enumerate(spec.dyn):
        decl += [f"const {ct.storage(d)}* dp{j}", f"i64 dsize{j}", f"i64 dstride{j}"]
        fmt += "Pqq"
    decl += ["i64* err", "i64 tag"]
    fmt += "Pq"
    return decl, fmt


def _op(o: int) -> str:
    return "o" if o < 0 else str(o)


def _strided_ops(spec: EwSpec) -> list[int]:
    ops = [-1] if spec.out_mode == "strided" else []
    return ops + [k for k, m in enumerate(spec.in_modes) if m == "strided"]


def _body(spec: EwSpec, idx: str, offs: dict[int, str]) -> list[str]:
    """Load inputs at element `idx` (or the given offsets), evaluate, store."""
    code = ExprCode()
    loads = []
    for k, (d, m) in enumerate(zip(spec.in_dtypes, spec.in_modes, strict=True)):
        at = {"contig": idx, "scalar": "0", "strided": offs.get(k, "0")}[m]
        if k in offs and m != "strided":
            at = f"{at} + {offs[k]}"
        loads.append(code.tmp(ct.compute(d), ct.load(f"in{k}[{at}]", d)))
    res = emit(spec.expr, list(spec.in_dtypes), loads, code)
    rd = dtype_of(spec.expr, list(spec.in_dtypes))
    at = offs.get(-1, "0") if spec.out_mode == "strided" else idx
    if spec.out_mode != "strided" and -1 in offs:
        at = f"{at} + {offs[-1]}"
    code.lines.append(f"out[{at}] = {ct.to_storage(res, rd, spec.out_dtype)};")
    return code.lines


def _dyn_lines(spec: EwSpec) -> tuple[list[str], dict[int, str]]:
    lines: list[str] = []
    base: dict[int, str] = {}
    for j, (o, _) in enumerate(spec.dyn):
        lines.append(f"const i64 dv{j} = pgk_dyn_index(dp{j}, dsize{j}, err, tag);")
        lines.append(f"if (dv{j} < 0) return;")
        base[o] = f"{base[o]} + " if o in base else ""
        base[o] += f"dv{j} * dstride{j}"
    for o in list(base):
        lines.append(f"const i64 base{_op(o)} = {base[o]};")
        base[o] = f"base{_op(o)}"
    return lines, base


def _strided_loop(spec: EwSpec, base: dict[int, str]) -> list[str]:
    strided = _strided_ops(spec)
    lines = ["for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n;",
             "     i += (i64)gridDim.x * blockDim.x) {"]  # fmt: skip
    offs: dict[int, str] = {}
    if strided:
        lines.append("  i64 r = i;")
        for o in strided:
            lines.append(f"  i64 off{_op(o)} = {base.get(o, '0')};")
            offs[o] = f"off{_op(o)}"
        for d in reversed(range(spec.rank)):
            c = f"r % s{d}" if d else "r"
            lines.append(f"  {{ const i64 c = {c};" + (f" r /= s{d};" if d else ""))
            lines += [f"    off{_op(o)} += c * st{_op(o)}_{d};" for o in strided]
            lines.append("  }")
    for o, b in base.items():
        if o not in offs:
            offs[o] = b
    lines += ["  " + s for s in _body(spec, "i", offs)]
    lines.append("}")
    return lines


def _vector_loop(spec: EwSpec) -> list[str]:
    v = spec.vec
    lines = []
    vec_ops = [(-1, spec.out_dtype)] + [
        (k, d) for k, (d, m) in enumerate(zip(spec.in_dtypes, spec.in_modes, strict=True))
        if m == "contig"
    ]  # fmt: skip
    for o, d in vec_ops:
        st = ct.storage(d)
        lines.append(f"struct __align__({v * _itemsize(d)}) V{_op(o)} {{ {st} v[{v}]; }};")
    lines += [
        "const i64 nv = n / " + str(v) + ";",
        "const i64 step = (i64)gridDim.x * blockDim.x;",
        "for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < nv; j += step) {",
    ]
    for o, _ in vec_ops[1:]:
        lines.append(f"  const V{o} a{o} = reinterpret_cast<const V{o}*>(in{o})[j];")
    lines.append("  Vo res;")
    lines.append(f"  #pragma unroll\n  for (int u = 0; u < {v}; ++u) {{")
    body = _body(spec, "u", {})
    for o, _ in vec_ops[1:]:
        body = [s.replace(f"in{o}[u]", f"a{o}.v[u]") for s in body]
    body = [s.replace("out[u] =", "res.v[u] =") for s in body]
    lines += ["    " + s for s in body]
    lines += ["  }", "  reinterpret_cast<Vo*>(out)[j] = res;", "}"]
    lines += [
        f"for (i64 i = nv * {v} + blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += step) {{"
    ]
    lines += ["  " + s for s in _body(spec, "i", {})]
    lines.append("}")
    return lines


def _itemsize(d: DType) -> int:
    return 1 if d.name == "bool" else d.itemsize


def generate(spec: EwSpec) -> KernelSource:
    """The kernel of `spec`, made once per spec."""
    # Keyed by the spec's repr too: specs compare equal across 0.0 and -0.0 constants
    # (tuples compare floats by value), whose kernels differ.
    return _generate(spec, repr(spec))


@functools.lru_cache(maxsize=4096)
def _generate(spec: EwSpec, text: str) -> KernelSource:
    decl, fmt = params(spec)
    name = _name(spec)
    uses_err = bool(spec.dyn) or uses_error_word(spec.expr, list(spec.in_dtypes))
    lines = [f'extern "C" __global__ void __launch_bounds__(256) {name}(']
    lines.append("    " + ",\n    ".join(decl) + ") {")
    lines.append("  PGK_PDL_ENTRY")
    if not uses_err:
        lines.append("  (void)err; (void)tag;")
    if spec.vec > 1:
        assert not spec.dyn and "strided" not in spec.in_modes and spec.out_mode == "contig"
        lines += ["  " + s for s in _vector_loop(spec)]
    else:
        dl, base = _dyn_lines(spec)
        lines += ["  " + s for s in dl]
        lines += ["  " + s for s in _strided_loop(spec, base)]
    lines.append("}")
    return KernelSource(PRELUDE + "\n".join(lines) + "\n", name, fmt)
