"""The `quant` group: each quantized GEMV (gemv_quant) at batch-1 decode shapes of
TinyLlama-1.1B and Llama-2-7B, against the copy bandwidth for the bytes it reads (weight
data, scales, zero points, x and y): of the large-buffer copy (pct_copy_bw) and of a copy
moving the same bytes in the same harness (pct_copy_same_bytes, the figure a few-MB
workload is read against: docs/kernels.md, "How they are measured"), beside torch's bf16
F.linear and gpt-fast-style weight-only baselines under torch.compile (int8:
F.linear(x, w.to(x.dtype)) * scales; int4: dequantize, then matmul), on the same device in
the same run. Weights are random, quantized on the device (quant_torch). The `quant_fused`
group (bench_quant_fused): the Llama-2-7B decode step's GEMVs with the step's fusions
against the same shape plain."""

from __future__ import annotations

import functools
import json
from typing import Any

from pygpukit.backends.cuda.kernels import gemv_quant
from pygpukit.ir.quant import QuantSpec

from . import quant_torch
from .kernels import (
    _close,
    _compiled,
    _sets_for,
    _stream,
    _torch,
    copy_us,
    time_graph,
    time_graphs_interleaved,
)

# (K, N): TinyLlama QKV, o, gate/up, down; Llama-2-7B QKV, gate/up, down.
SHAPES = ((2048, 2560), (2048, 2048), (2048, 11264), (5632, 2048),
          (4096, 12288), (4096, 22016), (11008, 4096))  # fmt: skip
FORMATS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("int8", {}), ("fp8", {"block": 0}), ("fp8", {"block": 128}), ("int4", {"group": 128}),
    ("int4", {"group": 128, "symmetric": False}),
)  # fmt: skip


def bench_quant(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    f = torch.nn.functional
    gen = torch.Generator(device="cuda").manual_seed(0)
    same_copy: dict[int, float] = {}  # copy_us by bytes moved
    for k, n in SHAPES:
        w = torch.randn(n, k, device="cuda", generator=gen)
        wb = w.to(torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        base = time_graph(functools.partial(_call, f.linear, x, wb), 1)
        _emit(rows, f"bf16 F.linear 1x{k} @ [{n}x{k}]^T", base, n * k * 2, copy_gbs)
        for fmt, kw in FORMATS:
            g, sym = kw.get("group", 128), kw.get("symmetric", True)
            spec, ts = quant_torch.quantize(torch, w, fmt, g, sym, kw.get("block", 0))
            nbytes = sum(t.numel() * t.element_size() for t in ts) + 2 * (k + n)
            sets = _sets_for(nbytes)
            copies = [ts] + [[t.clone() for t in ts] for _ in range(sets - 1)]

            def ours(i: int, spec: QuantSpec = spec, copies: Any = copies, k: int = k,
                     n: int = n, x: Any = x, y: Any = y) -> None:  # fmt: skip
                t = copies[i]
                gemv_quant.gemv_quant(x.data_ptr(), t[0].data_ptr(), t[1].data_ptr(),
                                      y.data_ptr(), spec, n, k, "bfloat16",
                                      scale_numel=t[1].numel(),
                                      zero=t[2].data_ptr() if len(t) > 2 else 0, w_early=True,
                                      stream=_stream())  # fmt: skip

            ours(0)
            torch.cuda.synchronize()
            want = x.double() @ quant_torch.dequantize(torch, spec, ts, k).T
            _close(y, want, f"gemv_quant {spec.label}", tol=1e-2)
            name = f"gemv_quant {spec.label} 1x{k} @ [{n}x{k}]^T"
            t_ours = time_graph(ours, sets)
            row = _emit(rows, name, t_ours, nbytes, copy_gbs, vs_bf16=base)
            if nbytes not in same_copy:
                same_copy[nbytes] = copy_us(nbytes)
            row["copy_same_bytes_us"] = round(same_copy[nbytes], 2)
            row["pct_copy_same_bytes"] = round(100 * same_copy[nbytes] / t_ours, 1)
            peer = _gpt_fast(torch, f, x, ts, spec) if use_compile else None
            if peer is not None:
                try:
                    t_peer = time_graph(functools.partial(_call, peer), 1)
                    row["torch_compile_gpt_fast_us"] = round(t_peer, 2)
                    row["x_vs_gpt_fast"] = round(t_peer / t_ours, 2)
                except Exception as exc:  # torch.compile may fail on odd setups
                    row["torch_compile_error"] = f"{type(exc).__name__}: {exc}"[:200]
            print(json.dumps(row), flush=True)
            del copies
        del w, wb


def _call(fn: Any, *args: Any) -> None:
    """fn(*args) as a timed call of input set i (the last argument, ignored)."""
    fn(*args[:-1])


def _gpt_fast(torch: Any, f: Any, x: Any, ts: list[Any], spec: QuantSpec) -> Any:
    """gpt-fast's weight-only forms under torch.compile (int8 per row, int4 grouped)."""
    if spec.format == "int8":
        w8, s = ts[0], ts[1].to(torch.bfloat16)
        fn = _compiled(lambda x, w8, s: f.linear(x, w8.to(x.dtype)) * s)
        return None if fn is None else (lambda: fn(x, w8, s))
    if spec.format != "int4":
        return None
    g = spec.group
    data, scale = ts[0], ts[1].to(torch.bfloat16)
    zero = ts[2] if len(ts) > 2 else None

    def deq_mm(x: Any, data: Any, scale: Any, zero: Any) -> Any:
        q = torch.stack((data & 15, data >> 4), dim=-1).reshape(data.shape[0], -1)
        z = 8 if zero is None else zero.repeat_interleave(g, dim=1)
        w = (q.to(x.dtype) - z) * scale.repeat_interleave(g, dim=1)
        return x @ w.T

    fn = _compiled(deq_mm)
    return None if fn is None else (lambda: fn(x, data, scale, zero))


def _emit(rows: list[dict[str, Any]], name: str, us: float, nbytes: int, copy_gbs: float,
          vs_bf16: float | None = None, vs_key: str = "x_vs_bf16_linear"
          ) -> dict[str, Any]:  # fmt: skip
    """A row of us microseconds for nbytes read; with vs_bf16, its ratio to that time
    (under vs_key). Printed here unless the caller adds to it first (vs_bf16 given)."""
    gbs = nbytes / (us * 1e-6) / 1e9
    row: dict[str, Any] = {
        "bench": "kernels",
        "workload": name,
        "us": round(us, 2),
        "GB/s": round(gbs, 1),
        "pct_copy_bw": round(100 * gbs / copy_gbs, 1) if copy_gbs else None,
    }
    if vs_bf16 is not None:
        row[vs_key] = round(vs_bf16 / us, 3 if vs_key == "x_vs_plain" else 2)
    rows.append(row)
    if vs_bf16 is None:
        print(json.dumps(row), flush=True)
    return row


# The `quant_fused` group: the Llama-2-7B decode step's quantized GEMVs as the step fuses
# them, beside the same shape unfused. (role, K, N, RMSNorm prologue, SwiGLU epilogue,
# residual): QKV and the LM head take the prologue, gate|up the prologue and SwiGLU (N the
# gate and up rows together), O and down the residual.
FUSED_ROLES = (("qkv", 4096, 12288, True, False, False), ("o", 4096, 4096, False, False, True),
               ("gate_up", 4096, 22016, True, True, False),
               ("down", 11008, 4096, False, False, True),
               ("lm_head", 4096, 32000, True, False, False))  # fmt: skip
FUSED_FORMATS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("int8", {}), ("fp8", {"block": 128}), ("int4", {"group": 128}))  # fmt: skip
# Each arm: gemv_quant's keyword arguments beside the role's fusions ("plain": none of
# them). "fused" is the launcher's default; the others switch one of its choices back.
FUSED_ARMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "fused": {"pro_early": True},
    "gain_late": {"pro_early": False},
    "gain_batch2": {"pro_early": True, "gain_batch": 2},
    "gain_batch4": {"pro_early": True, "gain_batch": 4},
}
PROLOGUE_ARMS = ("gain_late", "gain_batch2", "gain_batch4")  # switches of the prologue's
FUSED_CALLS, FUSED_REPS = 20, 30


def bench_quant_fused(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    """Each FUSED_ROLES GEMV in each FUSED_FORMATS weight, every FUSED_ARMS arm timed
    interleaved (time_graphs_interleaved), each checked against float64 first."""
    del use_compile
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    for role, k, n, pro, glu, res in FUSED_ROLES:
        w = torch.randn(n, k, device="cuda", generator=gen)
        x = torch.randn(1, k, device="cuda", dtype=bf, generator=gen)
        gain = (torch.rand(k, device="cuda", generator=gen) + 0.5).to(bf)
        n_out = n // 2 if glu else n
        r = torch.randn(1, n_out, device="cuda", dtype=bf, generator=gen)
        ys = {a: torch.empty(1, n if a == "plain" else n_out, device="cuda", dtype=bf)
              for a in FUSED_ARMS}  # fmt: skip
        for fmt, kw in FUSED_FORMATS:
            spec, ts = quant_torch.quantize(torch, w, fmt, kw.get("group", 128), True,
                                            kw.get("block", 0))  # fmt: skip
            nbytes = sum(t.numel() * t.element_size() for t in ts) + 2 * (k + n)
            sets = _sets_for(nbytes)
            copies = [ts] + [[t.clone() for t in ts] for _ in range(sets - 1)]
            fns = {}
            for arm, extra in FUSED_ARMS.items():
                if not pro and arm in PROLOGUE_ARMS:
                    continue
                fused: dict[str, Any] = {}
                if arm != "plain":
                    fused = {"prologue": "rms_norm" if pro else "none", "pro": gain.data_ptr(),
                             "eps": 1e-5, "glu": glu, "residual": r.data_ptr() if res else 0,
                             **extra}  # fmt: skip
                call = _fused_call(x, ys[arm], spec, copies, n, k, fused)
                call(0)
                torch.cuda.synchronize()
                _close(ys[arm], _fused_want(torch, x, gain, r, spec, ts, k, arm, pro, glu, res),
                       f"gemv_quant {spec.label} {role} {arm}", tol=1e-2)  # fmt: skip
                fns[arm] = call
            us = time_graphs_interleaved(fns, sets, FUSED_CALLS, FUSED_REPS)
            for arm, t_arm in us.items():
                name = f"gemv_quant {spec.label} {role} 1x{k} @ [{n}x{k}]^T {arm}"
                row = _emit(rows, name, t_arm, nbytes, copy_gbs, us["plain"], "x_vs_plain")
                print(json.dumps(row), flush=True)
            del copies
        del w


def _fused_call(x: Any, y: Any, spec: QuantSpec, copies: list[Any], n: int, k: int,
                fused: dict[str, Any]) -> Any:  # fmt: skip
    """One launch of gemv_quant on weight set i of copies, with the arm's arguments."""

    def call(i: int) -> None:
        t = copies[i]
        gemv_quant.gemv_quant(x.data_ptr(), t[0].data_ptr(), t[1].data_ptr(), y.data_ptr(),
                              spec, n, k, "bfloat16", scale_numel=t[1].numel(),
                              zero=t[2].data_ptr() if len(t) > 2 else 0, w_early=True,
                              stream=_stream(), **fused)  # fmt: skip

    return call


def _fused_want(torch: Any, x: Any, gain: Any, r: Any, spec: QuantSpec, ts: list[Any], k: int,
                arm: str, pro: bool, glu: bool, res: bool) -> Any:  # fmt: skip
    """The float64 result of an arm of bench_quant_fused (x * gain rounded once to bf16,
    as the kernel's packed multiply; 1 / rms on raw x)."""
    wd = quant_torch.dequantize(torch, spec, ts, k)
    x64 = x.double()
    if arm == "plain":
        return x64 @ wd.T
    xg = (x64 * gain.double()).to(torch.bfloat16).double() if pro else x64
    y = xg @ wd.T
    if pro:
        y = y / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-5)
    if glu:
        h = y.shape[1] // 2
        gate, up = y[:, :h], y[:, h:]
        y = gate / (1 + torch.exp(-gate)) * up
    return y + r.double() if res else y
