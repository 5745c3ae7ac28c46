"""Every op of the elementwise registry (ir/elementwise.py) is complete: its NumPy reference
evaluates to the dtype its rule gives, its CUDA lowering compiles with NVRTC for sm_80 and
sm_90 for each dtype kind it takes, integer and bool lowerings compute NumPy's values
(compiled as host C++), and each of its public spellings records it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.ir import DType, dtypes
from pygpukit.ir.elementwise import OPS, Elementwise
from pygpukit.ir.evaluate import evaluate

FLOAT_TRY = (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16)
INT_TRY = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.bool_)
NAMES = sorted(OPS)


def _attr_sets(decl: Elementwise) -> list[dict[str, Any]]:
    """Each value of a spelled-out attribute; a cast goes to float16 and to int32."""
    if decl.name == "cast":
        return [{"dtype": "float16"}, {"dtype": "int32"}]
    sets: list[dict[str, Any]] = [{}]
    for a in decl.attrs:
        sets = [s | {a.name: v} for s in sets for v, _ in a.cuda]
    return sets


def _in_dtypes(decl: Elementwise, d: DType) -> list[DType]:
    return [dtypes.bool_, d, d] if decl.name == "where" else [d] * decl.arity


def _accepts(decl: Elementwise, d: DType, attrs: dict[str, Any]) -> DType | None:
    try:
        return decl.result_dtype(_in_dtypes(decl, d), attrs)
    except TypeError:
        return None


def _cases(decl: Elementwise) -> list[tuple[list[DType], dict[str, Any], DType]]:
    """(input dtypes, attrs, result dtype) for every float and integer/bool dtype it takes."""
    out = []
    for attrs in _attr_sets(decl):
        for d in FLOAT_TRY + INT_TRY:
            r = _accepts(decl, d, attrs)
            if r is not None:
                out.append((_in_dtypes(decl, d), attrs, r))
    return out


def _sample(rng: np.random.Generator, d: DType, n: int) -> np.ndarray:
    if d == dtypes.bool_:
        return rng.random(n) < 0.5
    if d.is_int:
        info = np.iinfo(d.np)
        vals = rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64)
        vals[:4] = [info.min, info.max, 0, 1] if n >= 4 else vals[:4]
        return vals.astype(d.np)
    return rng.uniform(0.1, 3.0, n).astype(d.np)


@pytest.mark.parametrize("name", NAMES)
def test_reference_gives_the_rules_dtype(name: str) -> None:
    decl = OPS[name]
    rng = np.random.default_rng(3)
    for ins, attrs, r in _cases(decl):
        arrays = [_sample(rng, d, 6).reshape(2, 3) for d in ins]
        if name == "pow" and r.is_int:
            arrays[1] = np.abs(arrays[1].astype(np.int64)).astype(ins[1].np) % 5
        out = evaluate(name, arrays, attrs, r)
        assert out.dtype == r.np and out.shape == (2, 3), (name, ins, attrs)


def _one_op_kernels(decl: Elementwise) -> list[str]:
    """The op's one-op kernels: float32, float64 (no float suffix) and bfloat16 (computed in
    float); int32 and bool, or every integer width where the op takes no float."""
    from pygpukit.backends.cuda.codegen.elementwise import EwSpec, generate
    from pygpukit.backends.cuda.codegen.expr import step_expr

    cases = _cases(decl)
    takes_float = any(ins[-1].is_float for ins, _, _ in cases)
    wanted = {dtypes.float32, dtypes.float64, dtypes.bfloat16, dtypes.int32, dtypes.bool_}
    texts = []
    for ins, attrs, r in cases:
        if takes_float and ins[-1] not in wanted:
            continue
        expr = step_expr(decl.name, attrs, decl.arity)
        modes = ("contig",) * decl.arity
        texts.append(generate(EwSpec(expr, tuple(ins), r, modes, "contig", 0)).text)
    return texts


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_cuda_lowering_compiles(arch: str) -> None:
    toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC here: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    from pygpukit.backends.cuda.codegen.prelude import PRELUDE

    # One source for all ops (one NVRTC call): each kernel without its copy of the prelude.
    bodies = []
    for name in NAMES:
        texts = _one_op_kernels(OPS[name])
        assert texts, name
        bodies += [t[len(PRELUDE) :] for t in texts if t.startswith(PRELUDE)]
    source = PRELUDE + "\n".join(dict.fromkeys(bodies))
    assert toolchain.compile_kernel(source, arch, ("-std=c++17",))


# ---- integer and bool lowerings, run as host C++ ------------------------------------------


def _c_value(v: Any, d: DType) -> str:
    if d == dtypes.bool_:
        return "true" if v else "false"
    v = int(v)
    return "(-9223372036854775807LL - 1)" if v == -(2**63) else f"{v}LL"


def _host_program(cases: list[tuple[str, list[np.ndarray], DType, dict[str, Any]]]) -> str:
    from pygpukit.backends.cuda.codegen import cdtypes as ct
    from pygpukit.backends.cuda.codegen.expr import ExprCode, emit, step_expr

    lines = ["#include <cstdio>", "typedef long long i64;", "int main() {"]
    for name, arrays, r, attrs in cases:
        ins = [dtypes.as_dtype(a.dtype) for a in arrays]
        lines.append("  {")
        for k, (a, d) in enumerate(zip(arrays, ins, strict=True)):
            vals = ", ".join(_c_value(v, d) for v in a)
            lines.append(f"    static const {ct.storage(d)} a{k}[] = {{{vals}}};")
        lines.append(f"    for (int i = 0; i < {len(arrays[0])}; ++i) {{")
        code = ExprCode()
        loads = [code.tmp(ct.compute(d), f"a{k}[i]") for k, d in enumerate(ins)]
        res = emit(step_expr(name, attrs, len(ins)), ins, loads, code)
        lines += ["      " + s for s in code.lines]
        lines.append(f'      printf("%lld ", (long long)({ct.to_storage(res, r, r)}));')
        lines += ["    }", '    printf("\\n");', "  }"]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_integer_and_bool_lowerings_compute_numpys_values(tmp_path: Path) -> None:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    rng = np.random.default_rng(5)
    cases = []
    for name in NAMES:
        decl = OPS[name]
        for ins, attrs, r in _cases(decl):
            # Integer and bool results of integer and bool inputs, from plain C templates
            # (the prelude's helpers are device code).
            if r.is_float or any(d.is_float for d in ins) or "pgk_" in decl.cuda_template(r):
                continue
            # Extremes included: wraparound is part of what is checked.
            cases.append((name, [_sample(rng, d, 64) for d in ins], r, attrs))
    assert {"bitwise_and", "bitwise_or", "bitwise_xor", "invert"} <= {c[0] for c in cases}
    src = tmp_path / "ops.cpp"
    src.write_text(_host_program(cases))
    exe = tmp_path / "ops"
    # -fwrapv: signed overflow wraps, as it does on the GPU (and as NumPy's does).
    cmd = [cxx, "-std=c++17", "-O1", "-fwrapv", "-w", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    rows = out.splitlines()
    assert len(rows) == len(cases)
    for (name, arrays, r, attrs), row in zip(cases, rows, strict=True):
        got = np.array([int(v) for v in row.split()], dtype=np.int64)
        want = evaluate(name, arrays, attrs, r).astype(np.int64)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {[a.dtype for a in arrays]}")


# ---- public API --------------------------------------------------------------------------


def _public(spelling: str) -> Any:
    obj: Any = gpk
    for part in spelling.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", NAMES)
def test_every_public_spelling_records_the_op(name: str) -> None:
    decl = OPS[name]
    rng = np.random.default_rng(7)
    d = next((d for d in FLOAT_TRY + INT_TRY if _accepts(decl, d, {"dtype": "float16"})), None)
    assert d is not None
    ins = [gpk.from_numpy(_sample(rng, t, 6)) for t in _in_dtypes(decl, d)]
    for spelling in decl.api:
        fn = _public(spelling)
        out = fn(*ins, "float16") if name == "cast" else fn(*ins)
        assert out.node.op == name, (spelling, out.node.op)
        args = [x.to_numpy() for x in ins]
        if spelling.startswith("GPUArray.__r"):  # reflected: x.__rsub__(y) is y - x
            args.reverse()
        ref = evaluate(name, args, {"dtype": "float16"}, out.dtype)
        # The NumPy backend is the reference evaluator itself; a CUDA math function may
        # round differently in the last bit.
        tol = {"float16": 1e-3, "bfloat16": 1e-2}.get(out.dtype.name, 1e-6)
        np.testing.assert_allclose(out.to_numpy(), ref, rtol=tol, atol=0)
