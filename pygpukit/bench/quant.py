"""The `quant` group: each quantized GEMV (gemv_quant) at batch-1 decode shapes of
TinyLlama-1.1B and Llama-2-7B, against the copy bandwidth for the bytes it reads (weight
data, scales, zero points, x and y), beside torch's bf16 F.linear and gpt-fast-style
weight-only baselines under torch.compile (int8: F.linear(x, w.to(x.dtype)) * scales;
int4: dequantize, then matmul), on the same device in the same run. Weights are random,
quantized on the device (quant_torch)."""

from __future__ import annotations

import functools
import json
from typing import Any

from pygpukit.backends.cuda.kernels import gemv_quant
from pygpukit.ir.quant import QuantSpec

from . import quant_torch
from .kernels import _close, _compiled, _sets_for, _stream, _torch, time_graph

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
          vs_bf16: float | None = None) -> dict[str, Any]:  # fmt: skip
    gbs = nbytes / (us * 1e-6) / 1e9
    row: dict[str, Any] = {
        "bench": "kernels",
        "workload": name,
        "us": round(us, 2),
        "GB/s": round(gbs, 1),
        "pct_copy_bw": round(100 * gbs / copy_gbs, 1) if copy_gbs else None,
    }
    if vs_bf16 is not None:
        row["x_vs_bf16_linear"] = round(vs_bf16 / us, 2)
    rows.append(row)
    if vs_bf16 is None:
        print(json.dumps(row), flush=True)
    return row
