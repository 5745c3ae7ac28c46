"""Where a compiled call's time goes on the CUDA backend, with CUDA Graph replay.

    python scripts/graph_profile.py [--batches 1,16] [--steps 32] [--json FILE] [--trace FILE]
    python scripts/graph_profile.py --prefill 1x1024,4x512 [--no-peer] [--json FILE]

Prints (1) the host time of one call of a small compiled function (the dispatch cost: the
GPU work is a few microseconds), (2) the TinyLlama-shape decode step (random bf16 weights)
per batch: ms per token, the captured graph's node count, and (3) with torch's profiler
(CUPTI sees every kernel in the process, graph replays included) the per-kernel GPU time of
the decode steps, grouped by kernel name. scripts/device_llm.sh runs it after the LLM bench;
bench/results/h200-graphs-profile.json is the last run kept:

    python scripts/graph_profile.py --batches 1 --json bench/results/h200-graphs-profile.json

--prefill BxT,... profiles the captured prefill instead (one chunk of B x T tokens, as the
llm_prefill bench runs it) and, unless --no-peer, the torch.compile'd gpt-fast prefill of
the same shape in the same process: per shape the wall time (the bench's best_of), the GPU time by
kernel name and by kind (GEMM, attention, norm, elementwise, copy), the span from the first
kernel's start to the last one's end (its excess over the kernel time is launch gaps), the
host time before the first kernel and after the last, and one layer's kernels in order with
their grids and times (the GEMM shapes show in the grids).
"""

from __future__ import annotations

import argparse
import json
import math
import time
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
    batches: list[int], steps: int, profile: bool, trace: str | None = None
) -> list[dict[str, Any]]:
    from pygpukit.bench.llm import random_model, tinyllama_config, weight_bytes
    from pygpukit.llm.sampling import SamplingParams

    cfg = tinyllama_config()
    model = random_model(cfg)
    rows = []
    for b in batches:
        prompt = [list(range(3, 19))] * b
        max_seq = 1 << math.ceil(math.log2(16 + steps + 1))
        model.generate_ids(prompt, 3, SamplingParams(), max_seq_len=max_seq, stop_at_eos=False)
        res = model.generate_ids(prompt, steps + 1, SamplingParams(), max_seq_len=max_seq,
                                 stop_at_eos=False)  # fmt: skip
        ms = 1e3 * res.decode_s / max(res.decode_steps, 1)
        row: dict[str, Any] = {"batch": b, "ms_per_step": ms, "tok_s": 1e3 / ms,
                               "weights_gb_s": weight_bytes(cfg) / ms / 1e6}  # fmt: skip
        gen = _generator(model)
        if gen is not None:
            row["decode_replay"] = gen._decode.stats()["entries"][-1]["replay"]
            row["decode_kernels"] = gen._decode.stats()["entries"][-1]["kernels"]
        print(json.dumps(row), flush=True)
        if profile:
            try:
                row["kernels"] = _profile(
                    model, prompt, max_seq, trace and trace.replace(".json", f"-b{b}.json")
                )
            except Exception as e:  # the timings above stand without it
                print(f"  profile failed: {type(e).__name__}: {e}", flush=True)
        rows.append(row)
    return rows


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
    model: Any, prompt: list[list[int]], max_seq: int, trace: str | None = None
) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pygpukit.llm.sampling import SamplingParams

    n = 8
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        model.generate_ids(prompt, n + 1, SamplingParams(), max_seq_len=max_seq,
                           stop_at_eos=False)  # fmt: skip
        torch.cuda.synchronize()
    if trace:  # every launch with its grid and start time: gaps and per-shape times
        prof.export_chrome_trace(trace)
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if dev <= 0:
            continue
        rows.append({"name": e.key[:90], "count": e.count, "total_us": dev})
    rows.sort(key=lambda r: -r["total_us"])
    total = sum(r["total_us"] for r in rows)
    print(f"  GPU time in {n} decode steps + 1 prefill: {total / 1e3:.2f} ms; top kernels:")
    for r in rows[:14]:
        print(f"  {r['total_us'] / 1e3:8.3f} ms {r['count']:6d}x  {r['name']}")
    return rows[:40]


# -- prefill ---------------------------------------------------------------------------------
_KINDS = (  # (kind, name fragments), first match wins
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "splitkreduce", "_mma_", "matmul")),
    ("attention", ("attn", "flash", "fmha", "attention", "sdpa")),
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


def _summarise(gpu: list[dict[str, Any]], mark: dict[str, Any], layers: int) -> dict[str, Any]:
    """Kernel time by name and kind, span and gaps, host time around the kernels, and one
    middle layer's kernels in order, for the GPU events inside the annotation `mark`."""
    t0, t1 = mark["ts"], mark["ts"] + mark["dur"]
    ev = [e for e in gpu if t0 <= e["ts"] <= t1]
    if not ev:
        return {"wall_us": mark["dur"], "kernels": 0}
    by_name: dict[str, list[float]] = {}
    by_kind: dict[str, float] = {}
    for e in ev:
        by_name.setdefault(e["name"][:90], []).append(e["dur"])
        k = kernel_kind(e["name"])
        by_kind[k] = by_kind.get(k, 0.0) + e["dur"]
    busy = sum(e["dur"] for e in ev)
    first, last = ev[0]["ts"], max(e["ts"] + e["dur"] for e in ev)
    names = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    per_layer = len(ev) // max(layers, 1)
    mid = ev[len(ev) // 2 - per_layer // 2 :][: per_layer + 2] if per_layer else []
    return {
        "wall_us": mark["dur"], "kernels": len(ev), "kernel_us": busy, "span_us": last - first,
        "gaps_us": (last - first) - busy, "host_before_us": first - t0, "host_after_us": t1 - last,
        "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "by_name": [{"name": n, "count": len(d), "total_us": sum(d), "mean_us": sum(d) / len(d)}
                    for n, d in names[:40]],
        "one_layer": [{"name": e["name"][:70], "us": e["dur"],
                       "grid": e.get("args", {}).get("grid"),
                       "block": e.get("args", {}).get("block")} for e in mid],
    }  # fmt: skip


def _print_summary(label: str, s: dict[str, Any]) -> None:
    print(f"== {label}: wall {s['wall_us'] / 1e3:.3f} ms, {s['kernels']} kernels, kernel time "
          f"{s.get('kernel_us', 0) / 1e3:.3f} ms, span {s.get('span_us', 0) / 1e3:.3f} ms, gaps "
          f"{s.get('gaps_us', 0) / 1e3:.3f} ms, host before {s.get('host_before_us', 0):.0f} us"
          f", after {s.get('host_after_us', 0):.0f} us", flush=True)  # fmt: skip
    print("   by kind (us): " + ", ".join(f"{k} {v:.0f}" for k, v in
                                          s.get("by_kind_us", {}).items()))  # fmt: skip
    for r in s.get("by_name", [])[:22]:
        print(f"   {r['total_us']:9.1f} us {r['count']:5d}x {r['mean_us']:8.2f}  {r['name']}")
    print("   one layer in order:")
    for r in s.get("one_layer", []):
        print(f"     {r['us']:8.2f} us grid {r['grid']} block {r['block']}  {r['name']}")


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


def prefill(shapes: list[tuple[int, int]], peer: bool, trace: str | None = None
            ) -> list[dict[str, Any]]:  # fmt: skip
    """Per (batch, tokens): our captured prefill's wall time and kernel breakdown, and the
    torch.compile'd gpt-fast prefill's (peer)."""
    import torch

    from pygpukit.bench.llm import _prompts, best_of, random_model, tinyllama_config
    from pygpukit.llm.sampling import SamplingParams

    cfg = tinyllama_config()
    model = random_model(cfg)
    rows: list[dict[str, Any]] = []
    for b, t in shapes:
        prompts = _prompts(cfg, b, t)
        max_seq = min(cfg.max_position_embeddings, t + 16)

        def ours(prompts: list[list[int]] = prompts, max_seq: int = max_seq) -> float:
            return float(model.generate_ids(prompts, 1, SamplingParams(), max_seq_len=max_seq,
                                            stop_at_eos=False).prefill_s)  # fmt: skip

        row: dict[str, Any] = {"batch": b, "tokens": t, "ours_ms": 1e3 * best_of(ours)}
        gen = _generator(model)
        if gen is not None:
            entry = gen._prefill.stats()["entries"][-1]
            row["ours_replay"], row["ours_steps"] = entry["replay"], entry["kernels"]
        print(json.dumps({k: v for k, v in row.items()}, default=str), flush=True)
        tr = trace and trace.replace(".json", f"-ours-{b}x{t}.json")
        row["ours"] = _profiled(ours, f"ours {b}x{t}", cfg.num_layers, tr)
        rows.append(row)
    # The peers after all of ours: a run cut short (torch.compile's first compile of a shape
    # takes a while) keeps every shape of ours.
    for row in rows if peer else []:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--trace", help="write the profiled steps as a Chrome trace (per batch)")
    ap.add_argument("--prefill", help="BxT,...: profile the prefill of these shapes instead")
    ap.add_argument("--no-peer", action="store_true", help="prefill: without torch.compile")
    a = ap.parse_args()
    if a.prefill:
        shapes = [(int(b), int(t)) for b, t in (x.split("x") for x in a.prefill.split(","))]
        out: dict[str, Any] = {"prefill": prefill(shapes, not a.no_peer, a.trace)}
        out["gemm_reference"] = gemm_reference(sorted({b * t for b, t in shapes}))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        return
    res: dict[str, Any] = {"dispatch": dispatch_us()}
    print(json.dumps(res["dispatch"]), flush=True)
    res["decode"] = decode(
        [int(b) for b in a.batches.split(",")], a.steps, not a.no_profile, a.trace
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
