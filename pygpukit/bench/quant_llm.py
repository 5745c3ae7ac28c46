"""The `quant_llm` group: batch-1 decode of TinyLlama-1.1B and Llama-2-7B shapes (random
bf16 weights) with every linear weight bf16, int8, fp8 (block 128) or int4 (group 128),
quantized on the device (quant_torch, quantize_model's formats and read-only weights)
and run by the LLM bench's decode
(`generate_ids`: the compiled, captured decode step), beside gpt-fast-style weight-only
int8 / int4 torch models under torch.compile (gpt-fast's quantize.py forms: int8
F.linear(x, w.to(x.dtype)) * scales; int4 dequantize, then matmul) in the same run; and
the prefill of a 1 x 1024 prompt with each format's weights against bf16; and decode at
each of BATCHED rows (batched decode and serving: the quantized GEMV, one launch of up to
16 rows where they fit, or the format's GEMM) against bf16 at the same batch.

Models come from PGK_QUANT_LLM_MODELS (comma-separated names of llm.MODELS; default both).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import llm, quant_torch

FORMATS = ("bf16", "int8", "fp8", "int4")
STEPS = 64
BATCHED = (8, 16)
PREFILL_LEN = 1024
INT4_GROUP = 128


def _quantized_model(base: Any, fmt: str) -> Any:
    """The random bf16 model `base` with every linear weight (wqkv, wo, w_gate_up, w_down,
    lm_head) quantized on the device (quant_torch; int4 group INT4_GROUP, fp8 blocks of
    128), read-only as quantize_model leaves them; the float weights stay with `base`
    (the 7B shape's host quantization took minutes a format)."""
    import torch

    import pygpukit as gpk
    from pygpukit.llm.loader import LINEAR_KEYS
    from pygpukit.llm.model import Transformer
    from pygpukit.quant import QuantizedWeight

    t = base.transformer
    w: dict[str, Any] = dict(t.weights)
    for key in [k for k in w if k.split(".")[-1] in LINEAR_KEYS]:
        tw = torch.from_dlpack(w[key])
        spec, arrs = quant_torch.quantize(torch, tw, fmt, INT4_GROUP)
        ga = [gpk.from_dlpack(a) for a in arrs]
        for a in ga:
            a.readonly = True
        w[key] = QuantizedWeight(spec, (tw.shape[0], tw.shape[1]), ga[0], ga[1],
                                 ga[2] if len(ga) > 2 else None)  # fmt: skip
    torch.cuda.synchronize()
    return type(base)(base.config, Transformer(base.config, w, t.dtype), None, "random")


def _gptfast_quantizer(fmt: str) -> Callable[[Any], Any]:
    """Replace every nn.Linear of a gpt-fast model with gpt-fast's weight-only form."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Int8Linear(nn.Module):
        def __init__(self, w: Any) -> None:
            super().__init__()
            scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / 127.0
            q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
            self.register_buffer("weight", q)
            self.register_buffer("scales", scale.to(torch.bfloat16))

        def forward(self, x: Any) -> Any:
            return F.linear(x, self.weight.to(dtype=x.dtype)) * self.scales

    class Int4Linear(nn.Module):
        def __init__(self, w: Any) -> None:
            super().__init__()
            n, k = w.shape
            g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
            scale = g.abs().amax(dim=2).clamp_min(1e-12) / 7.0
            q = (torch.round(g / scale[..., None]).clamp(-8, 7) + 8).to(torch.uint8)
            q = q.reshape(n, k)
            self.register_buffer("data", q[:, 0::2] | (q[:, 1::2] << 4))
            self.register_buffer("scales", scale.to(torch.bfloat16))

        def forward(self, x: Any) -> Any:
            d = self.data
            q = torch.stack((d & 15, d >> 4), dim=-1).reshape(d.shape[0], -1)
            w = (q.to(x.dtype) - 8) * self.scales.repeat_interleave(INT4_GROUP, dim=1)
            return x @ w.T

    make = Int8Linear if fmt == "int8" else Int4Linear

    def transform(model: Any) -> Any:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, make(child.weight.data))
                    del child
        torch.cuda.empty_cache()
        return model

    return transform


def bench_quant_llm(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    """Rows per model: decode tok/s and prefill ms for each format, torch.compile peers."""
    import torch

    names = os.environ.get("PGK_QUANT_LLM_MODELS", ",".join(llm.MODELS)).split(",")

    def emit(r: dict[str, Any]) -> None:
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)

    for name in names:
        cfg = llm.MODELS[name]()
        base: dict[str, float] = {}
        bf16 = llm.random_model(cfg)
        for fmt in FORMATS:
            try:
                t0 = time.perf_counter()
                model = bf16 if fmt == "bf16" else _quantized_model(bf16, fmt)
                q_s = time.perf_counter() - t0 if fmt != "bf16" else 0.0
                r = llm.bench_pygpukit(cfg, 1, STEPS, model)
                r.update(impl=f"pygpukit {fmt}", weights=fmt, quantize_s=round(q_s, 2))
                base.setdefault(f"tok_{fmt}", r["tok_s"])
                if fmt != "bf16" and "tok_bf16" in base:
                    r["x_vs_bf16"] = round(r["tok_s"] / base["tok_bf16"], 2)
                emit(r)
                for b in BATCHED:
                    rb = llm.bench_pygpukit(cfg, b, STEPS, model)
                    rb.update(impl=f"pygpukit {fmt}", weights=fmt)
                    base.setdefault(f"tok_b{b}_{fmt}", rb["tok_s"])
                    if fmt != "bf16" and f"tok_b{b}_bf16" in base:
                        rb["x_vs_bf16"] = round(rb["tok_s"] / base[f"tok_b{b}_bf16"], 2)
                    emit(rb)
                p = llm.bench_prefill_pygpukit(cfg, 1, PREFILL_LEN, model, reps=3)
                p.update(impl=f"pygpukit {fmt}", weights=fmt)
                base.setdefault(f"prefill_{fmt}", p["ms"])
                if fmt != "bf16" and "prefill_bf16" in base:
                    p["x_of_bf16_ms"] = round(p["ms"] / base["prefill_bf16"], 2)
                emit(p)
                del model
            except Exception as e:  # one format failing must not lose the others
                traceback.print_exc()
                emit({"bench": "llm_decode", "model": llm.model_name(cfg),
                      "impl": f"pygpukit {fmt}", "error": repr(e)[:500]})  # fmt: skip
            torch.cuda.empty_cache()
        del bf16
        torch.cuda.empty_cache()
        if not use_compile:
            continue
        for fmt in ("bf16", "int8", "int4"):
            try:
                tf = None if fmt == "bf16" else _gptfast_quantizer(fmt)
                r = llm.bench_torch_compile(cfg, 1, STEPS, transform=tf)
                r.update(impl=f"torch_compile {fmt}", weights=fmt)
                ours = base.get(f"tok_{fmt}")
                if ours:
                    r["ours_x"] = round(ours / r["tok_s"], 2)
                emit(r)
            except Exception as e:
                traceback.print_exc()
                emit({"bench": "llm_decode", "model": llm.model_name(cfg),
                      "impl": f"torch_compile {fmt}", "error": repr(e)[:500]})  # fmt: skip
            torch.cuda.empty_cache()
