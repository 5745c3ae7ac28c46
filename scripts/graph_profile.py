"""Where a compiled call's time goes on the CUDA backend, with CUDA Graph replay.

    python scripts/graph_profile.py [--batches 1,16] [--steps 32] [--json FILE] [--trace FILE]

Prints (1) the host time of one call of a small compiled function (the dispatch cost: the
GPU work is a few microseconds), (2) the TinyLlama-shape decode step (random bf16 weights)
per batch: ms per token, the captured graph's node count, and (3) with torch's profiler
(CUPTI sees every kernel in the process, graph replays included) the per-kernel GPU time of
the decode steps, grouped by kernel name. scripts/device_llm.sh runs it after the LLM bench;
bench/results/h200-graphs-profile.json is the last run kept:

    python scripts/graph_profile.py --batches 1 --json bench/results/h200-graphs-profile.json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--trace", help="write the profiled steps as a Chrome trace (per batch)")
    a = ap.parse_args()
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
