"""Where a compiled call's time goes on the CUDA backend, with CUDA Graph replay.

    python scripts/graph_profile.py [--batches 1,16] [--steps 32] [--json FILE] [--trace FILE]
        [--model tinyllama,llama2-7b] [--quantize bf16,int8,fp8,int4]
    python scripts/graph_profile.py --prefill 1x1024,4x512 [--no-peer] [--quantize int4]
        [--json FILE]

Prints (1) the host time of one call of a small compiled function (the dispatch cost: the
GPU work is a few microseconds), (2) the TinyLlama-shape decode step (random bf16 weights)
per batch: ms per token, the captured graph's node count, and (3) with torch's profiler
(CUPTI sees every kernel in the process, graph replays included) the per-kernel GPU time of
the decode steps, grouped by kernel name. scripts/device_llm.sh runs it after the LLM bench;
bench/results/h200-graphs-profile.json is the last run kept:

    python scripts/graph_profile.py --batches 1 --json bench/results/h200-graphs-profile.json

--model picks the decode step's shapes (names of pygpukit.bench.llm.MODELS, comma-separated;
default tinyllama) and --quantize its weights: every linear weight (wqkv, wo, w_gate_up,
w_down, lm_head) of the random bf16 model quantized on the device as the quant_llm bench
does (int8 per row, fp8 blocks of 128, int4 groups of 128; bf16: unquantized), one row per
model, format and batch. Each profiled row also has the decode steps' GPU time per launch
shape (kernel name, grid, block: the GEMVs of different N show apart), from the
difference of a profiled n-step generate and a 1-token one, so the prefill drops out.
With programmatic dependent launch a kernel starts while the one ahead runs and waits for
it inside, so kernel durations overlap: each launch's own time counts only what no kernel
before it covered (busy_us_per_step, their sum, against ms_per_step shows the gaps).

--prefill BxT,... profiles the captured prefill instead (one chunk of B x T tokens, as the
llm_prefill bench runs it) and, unless --no-peer, the torch.compile'd gpt-fast prefill of
the same shape in the same process: per shape the wall time (the bench's best_of), the GPU time by
kernel name and by kind (GEMM, attention, norm, elementwise, copy), the span from the first
kernel's start to the last one's end (its excess over the kernel time is launch gaps), the
host time before the first kernel and after the last, and one layer's kernels in order with
their grids, whole and own times (own: what no kernel ahead covered, as for decode), each
with its role (layer_roles), the bytes it must move and its GB/s against the device's copy
bandwidth (a 256 MiB device copy, measured in the run), each GEMM against torch's cuBLAS on
the same M, N, K (gemm_reference), and the layer's GEMM and non-GEMM own time; and each
cuBLASLt plan the prefills asked for with the workspace its algorithm needs (cuBLASLt
zeroes part of it before the kernel: a memset in the breakdown), timed against the same
GEMM planned without a workspace (lt_workspace). With --quantize each format's prefill
(weights quantized as for decode) is profiled in turn; the peer runs beside the bf16 rows.

--serve B,...[:BUDGET,...] profiles the serving engine's captured step (pygpukit/serve):
a decode step of B running sequences at --context keys each, and, per BUDGET, a mixed
step of the largest B's decode rows and prompt pieces filling the budget (one launch, as
the engine runs it); per step the same breakdown, and the bytes it must read (weights,
and each row's keys and values) against its kernel time (GB/s):

    python scripts/graph_profile.py --serve 1,64:256,512 --json serve-profile.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def dispatch_us(n_calls: int = 3000) -> dict[str, float]:
    import pygpukit as gpk

    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    w = gpk.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    for static in (False, True):
        f = gpk.compile(lambda x, s: gpk.nn.gelu(x @ w + s) * 0.5, static_outputs=static)
        x = gpk.from_numpy(rng.standard_normal((8, 64)).astype(np.float32))
        s = gpk.scalar(0.25)
        for _ in range(20):
            y = f(x, s)
        y.to_numpy()
        t0 = time.perf_counter()
        for _ in range(n_calls):
            y = f(x, s)
        t1 = time.perf_counter()
        y.to_numpy()
        t2 = time.perf_counter()
        key = "static_outputs" if static else "fresh_outputs"
        out[f"dispatch_us_{key}"] = 1e6 * (t1 - t0) / n_calls
        out[f"wall_us_{key}"] = 1e6 * (t2 - t0) / n_calls
        out[f"replay_{key}"] = f.stats()["entries"][0]["replay"]  # type: ignore[assignment]
    return out


def decode(
    batches: list[int],
    steps: int,
    profile: bool,
    trace: str | None = None,
    models: tuple[str, ...] = ("tinyllama",),
    formats: tuple[str, ...] = ("bf16",),
) -> list[dict[str, Any]]:
    """Per model (bench.llm.MODELS names), weight format (bf16 or a quant_llm format) and
    batch: the decode step's ms per token and, with profile, its GPU time by kernel."""
    from pygpukit.bench.llm import MODELS, model_name, random_model, weight_bytes
    from pygpukit.bench.quant_llm import _quantized_model
    from pygpukit.llm.sampling import SamplingParams

    rows = []
    for name in models:
        cfg = MODELS[name]()
        base = random_model(cfg)
        for fmt in formats:
            model = base if fmt == "bf16" else _quantized_model(base, fmt)
            for b in batches:
                prompt = [list(range(3, 19))] * b
                max_seq = 1 << math.ceil(math.log2(16 + steps + 1))
                model.generate_ids(prompt, 3, SamplingParams(), max_seq_len=max_seq,
                                   stop_at_eos=False)  # fmt: skip
                res = model.generate_ids(prompt, steps + 1, SamplingParams(),
                                         max_seq_len=max_seq, stop_at_eos=False)  # fmt: skip
                ms = 1e3 * res.decode_s / max(res.decode_steps, 1)
                row: dict[str, Any] = {
                    "model": model_name(cfg), "weights": fmt, "batch": b, "ms_per_step": ms,
                    "tok_s": 1e3 / ms, "weights_gb_s": weight_bytes(cfg) / ms / 1e6,
                }  # fmt: skip
                gen = _generator(model)
                if gen is not None:
                    row["decode_replay"] = gen._decode.stats()["entries"][-1]["replay"]
                    row["decode_kernels"] = gen._decode.stats()["entries"][-1]["kernels"]
                print(json.dumps(row), flush=True)
                if profile:
                    tr = trace and trace.replace(".json", f"-{name}-{fmt}-b{b}.json")
                    try:
                        row.update(_profile(model, prompt, max_seq, ms, tr))
                    except Exception as e:  # the timings above stand without it
                        print(f"  profile failed: {type(e).__name__}: {e}", flush=True)
                rows.append(row)
            if model is not base:
                del model
                _empty_cache()
        del base
        _empty_cache()
    return rows


def _empty_cache() -> None:
    """Give the freed weights' memory back (the quantized copies are torch tensors)."""
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # no torch: nothing held by its allocator
        pass


def _generator(model: Any) -> Any:
    for v in vars(model).values():
        if hasattr(v, "_decode"):
            return v
    for v in vars(model).values():
        if isinstance(v, dict):
            for g in v.values():
                if hasattr(g, "_decode"):
                    return g
    return None


def _profile(
    model: Any, prompt: list[list[int]], max_seq: int, ms_per_step: float,
    trace: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """GPU time of the decode steps: by kernel name (the n-step generate, prefill included,
    as before) and per launch shape (name, grid, block) per decode step, the difference of
    the n-step generate and a 1-token one (the prefill's kernels cancel)."""
    n = 8
    whole, launches = _profiled_generate(model, prompt, max_seq, n + 1, trace)
    _, first = _profiled_generate(model, prompt, max_seq, 1, None)
    rows: list[dict[str, Any]] = [
        {"name": k[:90], "count": c, "total_us": us} for k, (c, us) in whole.items()
    ]
    rows.sort(key=lambda r: -r["total_us"])
    total = sum(r["total_us"] for r in rows)
    print(f"  GPU time in {n} decode steps + 1 prefill: {total / 1e3:.2f} ms; top kernels:")
    for r in rows[:14]:
        print(f"  {r['total_us'] / 1e3:8.3f} ms {r['count']:6d}x  {r['name']}")
    per_step: list[dict[str, Any]] = []
    for key, (c, us, ex) in launches.items():
        c0, us0, ex0 = first.get(key, (0, 0.0, 0.0))
        if c - c0 > 0:
            per_step.append({"name": key[0][:70], "grid": key[1], "block": key[2],
                             "per_step": (c - c0) / n, "us_per_step": (us - us0) / n,
                             "mean_us": (us - us0) / (c - c0),
                             "own_us_per_step": (ex - ex0) / n,
                             "own_mean_us": (ex - ex0) / (c - c0)})  # fmt: skip
    per_step.sort(key=lambda r: -r["own_us_per_step"])
    step_us = sum(r["us_per_step"] for r in per_step)
    own_us = sum(r["own_us_per_step"] for r in per_step)
    print(f"  per decode step: kernels {step_us / 1e3:.3f} ms (busy {own_us / 1e3:.3f} ms: "
          f"overlaps counted once) of {ms_per_step:.3f} ms "
          f"({sum(r['per_step'] for r in per_step):.0f} launches); by launch shape, own "
          f"us per step, launches, own and whole mean us:")  # fmt: skip
    for r in per_step[:24]:
        print(f"   {r['own_us_per_step']:9.1f} us {r['per_step']:6.1f}x {r['own_mean_us']:8.2f} "
              f"{r['mean_us']:8.2f}  grid {r['grid']} block {r['block']}  {r['name']}")  # fmt: skip
    return {"kernels": rows[:40], "kernel_us_per_step": step_us, "busy_us_per_step": own_us,
            "per_step": per_step[:60]}  # fmt: skip


def _profiled_generate(
    model: Any, prompt: list[list[int]], max_seq: int, tokens: int, trace: str | None
) -> tuple[dict[str, tuple[int, float]], dict[tuple[str, str, str], tuple[int, float, float]]]:
    """(count and GPU us by kernel name; count, GPU us and own us by launch shape) of one
    generate_ids of `tokens` tokens, from torch's profiler (CUPTI sees graph replays'
    kernels too). A kernel's own time excludes what overlaps the kernels before it."""
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    from pygpukit.llm.sampling import SamplingParams

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        model.generate_ids(prompt, tokens, SamplingParams(), max_seq_len=max_seq,
                           stop_at_eos=False)  # fmt: skip
        torch.cuda.synchronize()
    path = trace or os.path.join(tempfile.mkdtemp(), "decode-trace.json")
    prof.export_chrome_trace(path)
    gpu, _ = _kernel_events(path)
    by_name: dict[str, tuple[int, float]] = {}
    by_launch: dict[tuple[str, str, str], tuple[int, float, float]] = {}
    busy_until = 0.0
    for e in gpu:
        args = e.get("args", {})
        key = (e["name"], str(args.get("grid")), str(args.get("block")))
        # With programmatic dependent launch a kernel starts while the one ahead runs and
        # waits for it inside: its own time is from where the GPU was busy until to its end.
        end = e["ts"] + e["dur"]
        own = max(0.0, end - max(e["ts"], busy_until))
        busy_until = max(busy_until, end)
        c, us, ex = by_launch.get(key, (0, 0.0, 0.0))
        by_launch[key] = (c + 1, us + e["dur"], ex + own)
        c, us = by_name.get(e["name"], (0, 0.0))
        by_name[e["name"]] = (c + 1, us + e["dur"])
    return by_name, by_launch


# -- prefill ---------------------------------------------------------------------------------
_KINDS = (  # (kind, name fragments), first match wins
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "splitkreduce", "_mma_", "matmul")),
    ("kv_write", ("paged_write",)),
    ("attention", ("attn", "flash", "fmha", "attention", "sdpa", "paged")),
    ("norm", ("rms_norm", "rsqrt", "mean")),
    ("rope", ("rope",)),
    ("copy", ("memcpy", "memset", "copy", "setitem", "cat")),
    ("elementwise", ("pgk_ew", "swiglu", "silu", "triton_poi", "add", "mul")),
)


def kernel_kind(name: str) -> str:
    """The kind of a kernel by its name (what the breakdown groups by)."""
    low = name.lower()
    for kind, frags in _KINDS:
        if any(f in low for f in frags):
            return kind
    return "other"


def _kernel_events(trace_path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(GPU events sorted by start, user annotations) of an exported Chrome trace."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    gpu = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    marks = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    gpu.sort(key=lambda e: e["ts"])
    return gpu, marks


def _own_times(ev: list[dict[str, Any]]) -> list[float]:
    """Each event's own time: from where the GPU was last busy until (or its start) to its
    end. With programmatic dependent launch a kernel starts while the one ahead runs and
    waits for it inside, so its duration also covers the wait."""
    own, busy_until = [], 0.0
    for e in ev:
        end = e["ts"] + e["dur"]
        own.append(max(0.0, end - max(e["ts"], busy_until)))
        busy_until = max(busy_until, end)
    return own


def _layer_window(ev: list[dict[str, Any]], per_layer: int) -> list[int]:
    """Indices of one middle layer's kernels: from an RMSNorm followed by a GEMM (the
    attention norm and the QKV projection) to the next such pair."""
    starts = [i for i in range(len(ev) - 1) if "rms_norm" in ev[i]["name"]
              and kernel_kind(ev[i + 1]["name"]) == "gemm"]  # fmt: skip
    if len(starts) >= 3:
        k = len(starts) // 2
        return list(range(starts[k], starts[k + 1]))
    lo = max(len(ev) // 2 - per_layer // 2, 0)
    return list(range(lo, min(lo + per_layer + 2, len(ev))))


def layer_roles(names: list[str], cfg: Any, batch: int, tokens: int, kv_len: int
                ) -> list[dict[str, Any]]:  # fmt: skip
    """What each kernel of one prefill layer (names in launch order) does, the bytes it
    must move at least (bf16) and, for a GEMM, its (M, N, K): the i-th GEMM is the QKV,
    attention-out, gate/up and down projection; an elementwise or copy kernel before the
    attention stores keys or values (K and V in one kernel when it is the only one), one
    after it is the attention output's transposing copy."""
    c, m, e = cfg, batch * tokens, 2
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    gemms = [("qkv", qd + 2 * kd, c.hidden_size, False),
             ("attn_out", c.hidden_size, qd, True),
             ("gate_up", 2 * c.intermediate_size, c.hidden_size, False),
             ("down", c.hidden_size, c.intermediate_size, True)]  # fmt: skip
    attn_at = next((i for i, n in enumerate(names) if kernel_kind(n) == "attention"), len(names))
    stores = [
        i
        for i, n in enumerate(names[:attn_at])
        if kernel_kind(n) in ("elementwise", "copy") and "memset" not in n.lower()
    ]
    out: list[dict[str, Any]] = []
    g = 0
    for i, n in enumerate(names):
        kind, low = kernel_kind(n), n.lower()
        r: dict[str, Any] = {"kind": kind}
        if "memset" in low:
            r.update(role="memset", bytes=0)
        elif kind == "gemm" and g < len(gemms):
            role, nn, kk, res = gemms[g]
            g += 1
            r.update(role=role, mnk=(m, nn, kk),
                     bytes=e * (m * kk + nn * kk + m * nn * (2 if res else 1)))  # fmt: skip
        elif "rms_norm" in low:
            r.update(role="rms_norm", bytes=e * (2 * m * c.hidden_size + c.hidden_size))
        elif "rope" in low:
            # q and k rotated; a rope that also stores the keys and values reads v too
            both = len(stores) == 0
            r.update(role="rope+kv_store" if both else "rope",
                     bytes=e * 2 * m * (qd + kd + (kd if both else 0)))  # fmt: skip
        elif kind == "attention":
            r.update(role="attention",
                     bytes=e * (2 * m * qd + 2 * batch * kv_len * kd))  # fmt: skip
        elif "swiglu" in low:
            r.update(role="swiglu", bytes=e * 3 * m * c.intermediate_size)
        elif i in stores:
            one = len(stores) == 1
            r.update(role="kv_store" if one else ("k_store", "v_store")[stores.index(i) % 2],
                     bytes=e * 2 * m * kd * (2 if one else 1))  # fmt: skip
        elif i > attn_at and kind in ("elementwise", "copy"):
            r.update(role="attn_out_copy", bytes=e * 2 * m * qd)
        else:
            r.update(role="other", bytes=0)
        out.append(r)
    return out


def _summarise(gpu: list[dict[str, Any]], mark: dict[str, Any], layers: int) -> dict[str, Any]:
    """Kernel time by name and kind, span and gaps, host time around the kernels, and one
    middle layer's kernels in order, for the GPU events inside the annotation `mark`. Own
    times count what no kernel ahead of a launch covered (see _own_times)."""
    t0, t1 = mark["ts"], mark["ts"] + mark["dur"]
    ev = [e for e in gpu if t0 <= e["ts"] <= t1]
    if not ev:
        return {"wall_us": mark["dur"], "kernels": 0}
    own = _own_times(ev)
    by_name: dict[str, list[tuple[float, float]]] = {}
    by_kind: dict[str, float] = {}
    by_kind_own: dict[str, float] = {}
    for e, o in zip(ev, own, strict=True):
        by_name.setdefault(e["name"][:90], []).append((e["dur"], o))
        k = kernel_kind(e["name"])
        by_kind[k] = by_kind.get(k, 0.0) + e["dur"]
        by_kind_own[k] = by_kind_own.get(k, 0.0) + o
    busy = sum(e["dur"] for e in ev)
    first, last = ev[0]["ts"], max(e["ts"] + e["dur"] for e in ev)
    names = sorted(by_name.items(), key=lambda kv: -sum(o for _, o in kv[1]))
    per_layer = len(ev) // max(layers, 1)
    mid = _layer_window(ev, per_layer) if per_layer else []
    return {
        "wall_us": mark["dur"], "kernels": len(ev), "kernel_us": busy, "own_us": sum(own),
        "span_us": last - first, "gaps_us": (last - first) - sum(own),
        "host_before_us": first - t0, "host_after_us": t1 - last,
        "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "by_kind_own_us": dict(sorted(by_kind_own.items(), key=lambda kv: -kv[1])),
        "by_name": [{"name": n, "count": len(d), "total_us": sum(x for x, _ in d),
                     "own_us": sum(o for _, o in d), "mean_us": sum(x for x, _ in d) / len(d)}
                    for n, d in names[:40]],
        "one_layer": [{"name": ev[i]["name"][:70], "us": ev[i]["dur"], "own_us": own[i],
                       "grid": ev[i].get("args", {}).get("grid"),
                       "block": ev[i].get("args", {}).get("block")} for i in mid],
    }  # fmt: skip


def annotate_layer(s: dict[str, Any], cfg: Any, batch: int, tokens: int, kv_len: int,
                   copy_gb_s: float, gemm_ref: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Adds to a summary's one_layer each kernel's role, bytes, GB/s over its own time and
    that against copy bandwidth; each GEMM's time against the reference for its shape
    (gemm_reference: torch's cuBLAS on the same M, N, K, the residual ones as addmm); and
    the layer's GEMM and non-GEMM own time."""
    layer = s.get("one_layer", [])
    roles = layer_roles([r["name"] for r in layer], cfg, batch, tokens, kv_len)
    ref = {(g["m"], g["n"], g["k"]): g for g in gemm_ref}
    gemm_us = rest_us = 0.0
    for r, role in zip(layer, roles, strict=True):
        r.update(role)
        own = max(r["own_us"], 1e-3)
        if role["kind"] == "gemm":
            gemm_us += r["own_us"]
            g = ref.get(tuple(role.get("mnk", ())))
            if g is not None:
                res = role["role"] in ("attn_out", "down")
                best = g["linear_add_us"] if res else g["linear_us"]
                r["ref_us"], r["vs_ref"] = best, own / best
            r["tflops"] = 2 * math.prod(role.get("mnk", (0,))) / own / 1e6
        else:
            rest_us += r["own_us"]
        if role["bytes"]:
            r["gb_s"] = role["bytes"] / own / 1e3
            r["of_copy"] = r["gb_s"] / copy_gb_s if copy_gb_s else None
    s["layer_gemm_own_us"], s["layer_rest_own_us"] = gemm_us, rest_us
    return s


def _print_summary(label: str, s: dict[str, Any]) -> None:
    print(f"== {label}: wall {s['wall_us'] / 1e3:.3f} ms, {s['kernels']} kernels, kernel time "
          f"{s.get('kernel_us', 0) / 1e3:.3f} ms (own {s.get('own_us', 0) / 1e3:.3f}), span "
          f"{s.get('span_us', 0) / 1e3:.3f} ms, gaps {s.get('gaps_us', 0) / 1e3:.3f} ms, host "
          f"before {s.get('host_before_us', 0):.0f} us, after {s.get('host_after_us', 0):.0f} us",
          flush=True)  # fmt: skip
    print("   own time by kind (us): " + ", ".join(f"{k} {v:.0f}" for k, v in
                                               s.get("by_kind_own_us", {}).items()))  # fmt: skip
    print("   by name: own us, launches, mean us")
    for r in s.get("by_name", [])[:22]:
        print(f"   {r['own_us']:9.1f} us {r['count']:5d}x {r['mean_us']:8.2f}  {r['name']}")
    _print_layer(s)


def _print_layer(s: dict[str, Any]) -> None:
    print(
        "   one layer in order: own us, whole us, grid, block, role, GB/s (of copy BW), "
        "GEMM against the reference"
    )
    for r in s.get("one_layer", []):
        extra = ""
        if "gb_s" in r:
            extra += f" {r['gb_s']:7.0f} GB/s"
            if r.get("of_copy"):
                extra += f" ({100 * r['of_copy']:.0f}%)"
        if "ref_us" in r:
            extra += f"  {r['tflops']:.0f} TFLOP/s, ref {r['ref_us']:.2f} us ({r['vs_ref']:.2f}x)"
        print(f"     {r['own_us']:8.2f} {r['us']:8.2f} grid {r['grid']} block {r['block']}  "
              f"{r.get('role', '')} {r['name'][:40]}{extra}")  # fmt: skip
    if "layer_gemm_own_us" in s:
        print(f"   layer: GEMMs {s['layer_gemm_own_us']:.1f} us, the rest "
              f"{s['layer_rest_own_us']:.1f} us (own)")  # fmt: skip


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read and written over the time) of a
    256 MiB copy, best of 10: what a memory-bound kernel's GB/s is held against."""
    import torch

    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(12):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        b.copy_(a)
        t1.record()
        t1.synchronize()
        best = min(best, t0.elapsed_time(t1))
    return 2 * a.numel() / best / 1e6


def _profiled(run: Any, label: str, layers: int, trace: str | None) -> dict[str, Any]:
    """Profile one call of run() (warmed by the caller) inside an annotation."""
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        torch.cuda.synchronize()
        with record_function("prefill_call"):
            run()
        torch.cuda.synchronize()
    path = trace or os.path.join(tempfile.mkdtemp(), "prefill-trace.json")
    prof.export_chrome_trace(path)
    gpu, marks = _kernel_events(path)
    mark = next(m for m in marks if m["name"] == "prefill_call")
    s = _summarise(gpu, mark, layers)
    _print_summary(label, s)
    return s


def prefill(shapes: list[tuple[int, int]], peer: bool, trace: str | None = None,
            formats: Sequence[str] = ("bf16",)) -> list[dict[str, Any]]:  # fmt: skip
    """Per weight format and (batch, tokens): our captured prefill's wall time and kernel
    breakdown, and the torch.compile'd gpt-fast prefill's (peer, bf16 weights)."""
    import torch

    from pygpukit.bench.llm import _prompts, best_of, random_model, tinyllama_config
    from pygpukit.bench.quant_llm import _quantized_model
    from pygpukit.llm.sampling import SamplingParams

    cfg = tinyllama_config()
    base = random_model(cfg)
    models = {f: base if f == "bf16" else _quantized_model(base, f) for f in formats}
    rows: list[dict[str, Any]] = []
    for fmt, (b, t) in ((f, s) for f in formats for s in shapes):
        model = models[fmt]
        prompts = _prompts(cfg, b, t)
        max_seq = min(cfg.max_position_embeddings, t + 16)

        def ours(prompts: list[list[int]] = prompts, max_seq: int = max_seq,
                 model: Any = model) -> float:  # fmt: skip
            return float(model.generate_ids(prompts, 1, SamplingParams(), max_seq_len=max_seq,
                                            stop_at_eos=False).prefill_s)  # fmt: skip

        row: dict[str, Any] = {"weights": fmt, "batch": b, "tokens": t,
                               "ours_ms": 1e3 * best_of(ours)}  # fmt: skip
        gen = _generator(model)
        if gen is not None:
            entry = gen._prefill.stats()["entries"][-1]
            row["ours_replay"], row["ours_steps"] = entry["replay"], entry["kernels"]
        print(json.dumps({k: v for k, v in row.items()}, default=str), flush=True)
        tr = trace and trace.replace(".json", f"-ours-{fmt}-{b}x{t}.json")
        row["ours"] = _profiled(ours, f"ours {fmt} {b}x{t}", cfg.num_layers, tr)
        rows.append(row)
    # The peers after all of ours: a run cut short (torch.compile's first compile of a shape
    # takes a while) keeps every shape of ours.
    for row in [r for r in rows if r["weights"] == "bf16"] if peer else []:
        b, t = row["batch"], row["tokens"]
        try:
            row["peer_ms"], row["peer"] = _peer(cfg, b, t, trace)
            torch.cuda.empty_cache()  # the peer's model is gone with _peer's frame
            print(f"   peer {row['peer_ms']:.3f} ms, ours {row['ours_ms']:.3f} ms: "
                  f"{row['peer_ms'] / row['ours_ms']:.3f}x", flush=True)  # fmt: skip
        except Exception as e:  # our rows stand without it
            print(f"  peer failed: {type(e).__name__}: {e}", flush=True)
    return rows


def _peer(cfg: Any, b: int, t: int, trace: str | None) -> tuple[float, dict[str, Any]]:
    """The llm_prefill bench's torch.compile peer, timed as the bench times it (best_of
    after warm calls), then one call profiled."""
    from pygpukit.bench.llm import best_of, gptfast_prefill

    call, _ = gptfast_prefill(cfg, b, t, compiled=True)
    ms = 1e3 * best_of(call)
    tr = trace and trace.replace(".json", f"-peer-{b}x{t}.json")
    return ms, _profiled(call, f"torch.compile {b}x{t}", cfg.num_layers, tr)


def _copy_gb_s(nbytes: int = 256 << 20) -> float:
    """The device's copy bandwidth in GB/s (bytes read plus written by a device-to-device
    copy of nbytes, best of 12): the yardstick the step's reads are held against."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(12):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    return 2 * nbytes / best / 1e9


def serve(batches: list[int], budgets: list[int], context: int,
          trace: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The engine's step per decode batch (and mixed steps of the largest batch per
    budget): wall time of one step and its kernel breakdown (see the module docstring)."""
    import torch

    from pygpukit.bench import serve_load as sl
    from pygpukit.bench.llm import random_model, tinyllama_config, weight_bytes
    from pygpukit.llm.paged import PagedKVCache
    from pygpukit.serve import Engine
    from pygpukit.serve.engine import STEP_PROMPTS

    cfg = tinyllama_config()
    model = random_model(cfg, "bfloat16")
    most = max(batches)
    # Token slots for the largest batch and the fresh prompts of a mixed step beside it.
    engine = Engine(model, max_model_len=context + 128, max_batch=most + STEP_PROMPTS,
                    step_tokens=max([most + STEP_PROMPTS + 16, *budgets]))  # fmt: skip
    rng = np.random.default_rng(0)
    key_bytes = PagedKVCache.block_bytes(model.transformer, 1)  # one position, all layers
    rows: list[dict[str, Any]] = []
    copy_bw = _copy_gb_s()
    cases = [(b, 0) for b in batches] + [(most, t) for t in budgets]
    for b, budget in cases:
        if budget and not sl.fills(engine, budget, b):
            print(f"  budget {budget}: the free token slots cannot fill it", flush=True)
            continue
        reqs = sl.decode_rows(engine, b, context, 16, rng)

        def step(reqs: list[Any] = reqs, b: int = b, budget: int = budget) -> None:
            pieces, fresh = sl.fresh_prompts(engine, budget - b, rng) if budget else ([], [])
            _, transfer, _ = engine._launch(reqs, pieces)
            sl.drop_prompts(engine, fresh)
            transfer.result()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
        label = f"serve decode {b}" + (f" + prefill to {budget} tokens" if budget else "")
        s = _profiled(step, label, cfg.num_layers, trace and trace.replace(".json",
                      f"-serve-{b}-{budget}.json"))  # fmt: skip
        # Each decode row reads its context's keys and values; the weights once.
        kv = b * context * key_bytes
        need = weight_bytes(cfg) + kv
        gb_s = need / max(s.get("kernel_us", 0), 1e-9) / 1e3
        kinds = s.get("by_kind_us", {})
        row = {"batch": b, "context": context, "step_tokens": budget or None,
               "wall_ms": 1e3 * wall, "read_bytes": need, "read_gb_s": gb_s,
               "copy_gb_s": copy_bw,
               # The attention against the decode rows' keys and values, the GEMMs against
               # the weights (a step reads each once): GB/s over their kernel time.
               "attention_gb_s": kv / max(kinds.get("attention", 0), 1e-9) / 1e3,
               "gemm_gb_s": weight_bytes(cfg) / max(kinds.get("gemm", 0), 1e-9) / 1e3,
               "profile": s}  # fmt: skip
        print(f"   one step {1e3 * wall:.3f} ms; reads {need / 1e9:.2f} GB: "
              f"{row['read_gb_s']:.0f} GB/s over its kernel time; attention "
              f"{row['attention_gb_s']:.0f} GB/s of keys and values, GEMMs "
              f"{row['gemm_gb_s']:.0f} GB/s of weights ({100 * row['gemm_gb_s'] / copy_bw:.0f}%"
              f" of the {copy_bw:.0f} GB/s copy)", flush=True)  # fmt: skip
        sl.give_back(engine, reqs)
        rows.append(row)
    return rows


def gemm_reference(tokens: list[int]) -> list[dict[str, Any]]:
    """torch's F.linear (cuBLAS, its own heuristic) on the prefill's GEMM shapes: what the
    GEMM kernels in the breakdown could take (mean of 20 after warm-up, CUDA events)."""
    import torch
    import torch.nn.functional as F

    from pygpukit.bench.llm import tinyllama_config

    c = tinyllama_config()
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    nk = [
        (qkv, c.hidden_size),
        (c.hidden_size, c.num_heads * c.head_dim),
        (2 * c.intermediate_size, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
    ]
    out = []
    for m in tokens:
        for n, k in nk:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            row: dict[str, Any] = {"m": m, "n": n, "k": k}
            calls: dict[str, Any] = {
                "linear_us": lambda x=x, w=w: F.linear(x, w),
                "linear_add_us": lambda x=x, w=w, r=r: torch.addmm(r, x, w.t()),
            }
            for what, f in calls.items():
                for _ in range(3):
                    f()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(20):
                    f()
                b.record()
                b.synchronize()
                row[what] = 1e3 * a.elapsed_time(b) / 20
            row["tflops"] = 2 * m * n * k / row["linear_us"] / 1e6
            print("   gemm", json.dumps(row), flush=True)
            out.append(row)
    return out


class LtPlans:
    """The cuBLASLt plans a block of code asks for (the native call wrapped while it runs),
    to say afterwards which of a prefill's GEMMs run an algorithm that needs a workspace:
    cuBLASLt zeroes part of it before such a kernel (a memset launch of its own in the
    breakdown)."""

    def __init__(self) -> None:
        self.asked: dict[str, tuple[tuple[Any, ...], dict[str, Any], Any]] = {}

    def __enter__(self) -> LtPlans:
        from pygpukit import _native

        self._real = real = _native.cublaslt_plan

        def spy(*args: Any, **kw: Any) -> Any:
            p = real(*args, **kw)
            self.asked.setdefault(p.key, (args, kw, p))
            return p

        _native.cublaslt_plan = spy
        return self

    def __exit__(self, *exc: object) -> None:
        from pygpukit import _native

        _native.cublaslt_plan = self._real


def lt_workspace(plans: LtPlans, reps: int = 50) -> list[dict[str, Any]]:
    """Each bf16 plan asked for (LtPlans) of M >= 128 rows: the workspace its algorithm
    needs, its tuned candidate, and for those that need one, the same GEMM planned without
    a workspace (tuned the same way) and both timed back to back (mean of `reps` after
    warm-up, CUDA events): what dropping the workspace (and its memset) would cost."""
    import torch

    from pygpukit import _native

    def timed(p: Any, ptrs: tuple[int, int, int, int], ws: Any, ws_bytes: int) -> float:
        a, b, d, c = ptrs
        p.tune(a, b, d, 0, c, ws, ws_bytes, None, 3)
        for _ in range(3):
            p.run(a, b, d, 0, ws, ws_bytes, None, c)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            p.run(a, b, d, 0, ws, ws_bytes, None, c)
        e1.record()
        e1.synchronize()
        return 1e3 * e0.elapsed_time(e1) / reps

    def buf(rows: int, ld: int) -> Any:
        return torch.randn(rows * ld, device="cuda", dtype=torch.bfloat16)

    out = []
    for key, (args, kw, p) in plans.asked.items():
        m, n, k, dtype = args[:4]
        if dtype != "bfloat16" or m < 128 or kw.get("batch", 1) != 1:
            continue
        row: dict[str, Any] = {"key": key, "workspace_needed": p.workspace_needed,
                               "chosen": p.chosen, "candidates": p.candidates}  # fmt: skip
        if p.workspace_needed:
            a = buf(k if kw.get("trans_a") else m, kw["lda"])
            b = buf(n if kw.get("trans_b") else k, kw["ldb"])
            d = buf(m, kw["ldd"])
            c = buf(m, kw["ldc"]) if kw.get("ldc") else None
            ptrs = (a.data_ptr(), b.data_ptr(), d.data_ptr(), c.data_ptr() if c is not None else 0)
            ws = torch.empty(kw["workspace_bytes"], device="cuda", dtype=torch.uint8)
            row["us"] = timed(p, ptrs, ws.data_ptr(), kw["workspace_bytes"])
            bare = _native.cublaslt_plan(*args, **{**kw, "workspace_bytes": 0})
            row["no_workspace_us"] = timed(bare, ptrs, 0, 0)
            row["no_workspace_chosen"] = bare.chosen
        print("   lt plan", json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--trace", help="write the profiled steps as a Chrome trace (per batch)")
    ap.add_argument(
        "--model",
        default="tinyllama",
        help="decode: model shapes (pygpukit.bench.llm.MODELS), comma-separated",
    )
    ap.add_argument("--quantize", default="bf16",
                    help="decode and prefill: weight formats, comma-separated: bf16 "
                         "(unquantized), int8, fp8 (blocks of 128), int4 (groups of 128)",
                    )  # fmt: skip
    ap.add_argument("--prefill", help="BxT,...: profile the prefill of these shapes instead")
    ap.add_argument("--no-peer", action="store_true", help="prefill: without torch.compile")
    ap.add_argument("--serve", help="B,...[:BUDGET,...]: profile the serving engine's steps")
    ap.add_argument("--context", type=int, default=512, help="serve: keys per decode row")
    a = ap.parse_args()
    if a.serve:
        bs, _, ts = a.serve.partition(":")
        res_serve = serve([int(x) for x in bs.split(",")],
                          [int(x) for x in ts.split(",") if x], a.context, a.trace)  # fmt: skip
        # torch's cuBLAS on the same GEMM shapes at the decode batches: what the step's
        # GEMMs could take
        ref = gemm_reference(sorted({int(x) for x in bs.split(",")} - {1}))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"serve": res_serve, "gemm_reference": ref}, f, indent=1, default=str)
        return
    if a.prefill:
        shapes = [(int(b), int(t)) for b, t in (x.split("x") for x in a.prefill.split(","))]
        with LtPlans() as plans:
            out: dict[str, Any] = {"prefill": prefill(shapes, not a.no_peer, a.trace,
                                                      tuple(a.quantize.split(",")))}  # fmt: skip
        out["lt_workspace"] = lt_workspace(plans)
        out["gemm_reference"] = gemm_reference(sorted({b * t for b, t in shapes}))
        out["copy_gb_s"] = copy_bandwidth()
        from pygpukit.bench.llm import tinyllama_config

        for row in out["prefill"]:
            b, t = row["batch"], row["tokens"]
            # one chunk from position 0: its attention reads the t keys it stored
            annotate_layer(row["ours"], tinyllama_config(), b, t, t, out["copy_gb_s"],
                           out["gemm_reference"])  # fmt: skip
            print(f"== ours {row['weights']} {b}x{t} ({row['ours_ms']:.3f} ms; "
                  f"copy {out['copy_gb_s']:.0f} GB/s)")  # fmt: skip
            _print_layer(row["ours"])
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        return
    res: dict[str, Any] = {"dispatch": dispatch_us()}
    print(json.dumps(res["dispatch"]), flush=True)
    res["decode"] = decode(
        [int(b) for b in a.batches.split(",")],
        a.steps,
        not a.no_profile,
        a.trace,
        tuple(a.model.split(",")),
        tuple(a.quantize.split(",")),
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
