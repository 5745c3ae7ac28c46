"""GEMM benchmark: PyGPUkit (GPUArray API over torch memory, zero-copy through DLPack)
against torch eager (cuBLAS), torch.compile and CuPy, on the same device buffers.

C = A @ B with square N x N operands, for bf16 / f16 (fp32 accumulation), tf32 (float32
storage, opt-in on both sides: gpk.set_tf32 and torch allow_tf32) and f32 (exact fp32).
Every implementation is checked against a float64 product first (no timing of a wrong
result), then timed with time_loop (device events, warm-up, median, rotating input sets).
ratio = torch eager time / ours: >= 0.95 meets the target.

    python -m pygpukit.bench --only gemm
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from .timing import sets_for, time_loop

SIZES = (4096, 8192)
# tag: (storage dtype, tf32, relative error bound of the result against float64)
DTYPES: dict[str, tuple[str, bool, float]] = {
    "bf16": ("bfloat16", False, 1e-2),
    "f16": ("float16", False, 2e-3),
    "tf32": ("float32", True, 3e-3),
    "f32": ("float32", False, 2e-5),
}
TARGET = 0.95


def _rel_err(out: Any, ref: Any) -> float:
    o = out.double()
    return float((o - ref).norm() / ref.norm())


def _compile_mm() -> Any:
    import torch

    try:
        return torch.compile(lambda a, b: a @ b, dynamic=False)
    except Exception:
        return None


def bench_one(n: int, tag: str, use_compile: bool = True, use_cupy: bool = True
              ) -> dict[str, Any]:  # fmt: skip
    import torch

    import pygpukit as gpk

    name, tf32, tol = DTYPES[tag]
    tdt = getattr(torch, name)
    itemsize = torch.empty((), dtype=tdt).element_size()
    n_sets = sets_for(2 * n * n * itemsize)
    g = torch.Generator(device="cuda").manual_seed(n * 31 + len(tag))
    mk = lambda: torch.randn(n, n, device="cuda", dtype=tdt, generator=g)  # noqa: E731
    a_s, b_s = [mk() for _ in range(n_sets)], [mk() for _ in range(n_sets)]
    ga = [gpk.from_dlpack(t) for t in a_s]
    gb = [gpk.from_dlpack(t) for t in b_s]
    flops = 2.0 * n**3
    row: dict[str, Any] = {"bench": "gemm", "workload": f"gemm {tag} {n}", "dtype": tag, "n": n,
                           "input_sets": n_sets}  # fmt: skip
    impls: dict[str, Any] = {}
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    gpk.set_tf32(tf32)
    try:
        ref = a_s[0].double() @ b_s[0].double()

        def ours(i: int) -> Any:
            return (ga[i] @ gb[i]).realize()

        def eager(i: int) -> Any:
            return torch.mm(a_s[i], b_s[i])

        impls.update(ours=ours, torch_eager=eager)
        comp = _compile_mm() if use_compile else None
        if comp is not None:
            impls["torch_compile"] = lambda i: comp(a_s[i], b_s[i])
        if use_cupy and not tf32:  # CuPy reads CUPY_TF32 at import only: no per-call switch
            try:
                import cupy

                ca = [cupy.from_dlpack(t) for t in a_s]
                cb = [cupy.from_dlpack(t) for t in b_s]
                impls["cupy"] = lambda i: cupy.matmul(ca[i], cb[i])
            except Exception as e:
                row["cupy_error"] = f"{type(e).__name__}: {e}"[:200]
        for impl, fn in impls.items():
            try:
                out = fn(0)
                t_out = out if impl.startswith("torch") else torch.from_dlpack(out)
                err = _rel_err(t_out, ref)
                del out, t_out
                row[f"{impl}_rel_err"] = float(f"{err:.3g}")
                if not math.isfinite(err) or err > tol:
                    row[f"{impl}_error"] = f"relative error {err:.3g} > {tol:g}"
                    continue
                us = time_loop(fn, n_sets)
                row[f"{impl}_ms"] = round(us / 1e3, 4)
                row[f"{impl}_tflops"] = round(flops / (us * 1e-6) / 1e12, 1)
            except Exception as e:  # a peer failing must not lose the others
                row[f"{impl}_error"] = f"{type(e).__name__}: {e}"[:300]
        del ref
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
        gpk.set_tf32(False)
    if "ours_ms" in row and "torch_eager_ms" in row:
        row["ratio_vs_torch"] = round(row["torch_eager_ms"] / row["ours_ms"], 3)
        row["target"] = TARGET
        row["target_met"] = row["ratio_vs_torch"] >= TARGET
    for peer in ("torch_compile", "cupy"):
        if "ours_ms" in row and f"{peer}_ms" in row:
            row[f"ratio_vs_{peer}"] = round(row[f"{peer}_ms"] / row["ours_ms"], 3)
    impls.clear()  # drops the closures over the operands before the cache is emptied
    for seq in (ga, gb, a_s, b_s):
        seq.clear()
    torch.cuda.empty_cache()
    return row


def run(rows: list[dict[str, Any]], sizes: Sequence[int] = SIZES,
        tags: Sequence[str] = tuple(DTYPES), use_compile: bool = True,
        use_cupy: bool = True) -> None:  # fmt: skip
    """Appends one row per (size, dtype) to rows, printing each as JSON."""
    for n in sizes:
        for tag in tags:
            r = bench_one(n, tag, use_compile, use_cupy)
            rows.append(r)
            print(json.dumps(r), flush=True)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'workload':<16} {'ours ms':>9} {'TFLOP/s':>8} {'torch ms':>9} {'compile':>9} "
            f"{'cupy ms':>9} {'vs torch':>8} {'vs comp':>8} {'vs cupy':>8}  >=0.95?")  # fmt: skip
    lines = [head]

    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in rows:
        if r.get("bench") != "gemm":
            continue
        errs = [f"{k}: {v}" for k, v in r.items() if k.endswith("_error")]
        met = {True: "met", False: "MISSED"}.get(r.get("target_met"), "-")  # type: ignore[arg-type]
        lines.append(
            f"{r['workload']:<16} {f(r.get('ours_ms'), '9.3f')} {f(r.get('ours_tflops'), '8.1f')} "
            f"{f(r.get('torch_eager_ms'), '9.3f')} {f(r.get('torch_compile_ms'), '9.3f')} "
            f"{f(r.get('cupy_ms'), '9.3f')} {f(r.get('ratio_vs_torch'), '8.3f')} "
            f"{f(r.get('ratio_vs_torch_compile'), '8.3f')} {f(r.get('ratio_vs_cupy'), '8.3f')}"
            f"  {met}" + (f"  ({'; '.join(errs)})" if errs else "")
        )
    return "\n".join(lines)
