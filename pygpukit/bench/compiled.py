"""@gpk.compile benchmarks against peers in the same run.

- chain64: a 64-op elementwise chain, compiled (one fused kernel, one graph replay) against
  torch's CUDA-graph replay of the same 64 eager kernels. Wall time per call, calls issued
  back to back, so host dispatch counts when it is the longer side. Target: >= 5x. Then the
  same chain over f32[1024], where a call's host cost is the whole cost (issue #18: <= 5 us
  a call), with torch's CUDA-graph replay of the chain beside it.
- linear_gelu: gelu_tanh(x @ w.T + b) at 4096^3 bf16, compiled (one GEMM with the bias+GELU
  epilogue), against the bare GEMM through torch (cuBLAS) and torch.compile of the same
  expression. Target: within 1.05x of the bare GEMM.
- compile_time: first call of the 22-layer TinyLlama-shape decode step (trace, passes, plan,
  kernel compiles, capture), in fresh processes with a cold then a warm kernel cache, and
  where that time went. Targets (issue #18): <= 1 s cold, <= 0.2 s warm.
- dispatch: host time of one call of a small compiled function, gelu(x @ w + s) * 0.5 with
  x f32[8,64] and s a device scalar (one graph replay; fresh and static outputs), calls
  issued back to back with no synchronisation, against one cupy.fuse call of the same
  elementwise tail and torch eager of the whole expression, interleaved in one run.
  Target: <= 10 us, the cost of one cupy.fuse call.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .timing import time_graph, time_loop

CHAIN_N = 1 << 20


def _chain(x: Any, ops: Any) -> Any:
    """The same 64 ops for both sides: `ops` is gpk or torch (sin/tanh/exp/+/*)."""
    for i in range(16):
        x = x * 0.999 + 0.001 * (i + 1)
        x = ops.sin(x)
        x = ops.tanh(x) * 1.5
    return x


def bench_chain64(rows: list[dict[str, Any]]) -> None:
    import numpy as np
    import torch

    import pygpukit as gpk

    gen = torch.Generator(device="cuda").manual_seed(64)
    xs = [torch.randn(CHAIN_N, device="cuda", generator=gen) for _ in range(4)]
    ref = _chain(xs[0].double(), torch)
    fn = gpk.compile(lambda x: _chain(x, gpk))
    gx = [gpk.from_dlpack(x) for x in xs]
    out = fn(gx[0]).to_numpy()
    err = float(np.abs(out - ref.cpu().numpy()).max())
    # 64 float32 ops over 1M inputs: the largest error is held to float32 torch's on the
    # same inputs (a fixed 1e-4 failed at 1.16e-4 on an unseeded draw), not to a constant.
    peer = float((_chain(xs[0], torch).double() - ref).abs().max())
    if err > max(1e-4, 2 * peer):
        raise AssertionError(f"chain64: compiled result differs from float64 torch by {err} "
                             f"(float32 torch: {peer})")  # fmt: skip
    ours = time_loop(lambda i: fn(gx[i % 4]), 4, calls=50, reps=15)
    outs = [torch.empty_like(xs[0])]

    def torch_one(i: int) -> None:
        outs[0] = _chain(xs[i % 4], torch)

    torch_graph = time_graph(torch_one, 4, calls=1, reps=30)
    kernels = fn.stats()["entries"][0]["kernels"]
    row = {"bench": "compiled", "workload": "chain64 f32[1M] (64 ops)", "ours_us": round(ours, 2),
           "torch_graph_us": round(torch_graph, 2), "ours_kernels": kernels,
           "speedup_vs_torch_graph": round(torch_graph / ours, 2), "target": ">= 5x",
           "max_abs_err": err, "torch_f32_max_abs_err": peer}  # fmt: skip
    rows.append(row)
    print(json.dumps(row), flush=True)
    bench_chain64_host(rows)


def bench_chain64_host(rows: list[dict[str, Any]], calls: int = 2000, reps: int = 9) -> None:
    """The same chain compiled over f32[1024]: the GPU work is a few microseconds, so the
    call's host cost (guard, replay, fresh output) is what a call costs. Issue #18's
    target: <= 5 us a call. Calls back to back, each result held until the next returns;
    torch's CUDA-graph replay of the 64 kernels beside it."""
    import numpy as np
    import torch

    import pygpukit as gpk

    h = np.random.default_rng(64).standard_normal(1024).astype(np.float32)
    ref = _chain(h.astype(np.float64), np)
    fn = gpk.compile(lambda x: _chain(x, gpk))
    x = gpk.from_numpy(h)
    err = float(np.abs(fn(x).to_numpy() - ref).max())
    peer = float(np.abs(_chain(h, np).astype(np.float64) - ref).max())
    if err > max(1e-4, 2 * peer):
        raise AssertionError(f"chain64 f32[1024]: compiled result differs from float64 by {err} "
                             f"(float32 NumPy: {peer})")  # fmt: skip
    tx = torch.from_numpy(h).cuda()
    _chain(tx, torch)  # torch's kernels loaded before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _chain(tx, torch)
    fns: dict[str, Callable[[], Any]] = {"ours_us": lambda: fn(x), "torch_graph_us": graph.replay}
    for f in fns.values():
        for _ in range(50):
            f()
    times = _host_us(fns, calls, reps)
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    st = fn.stats()
    if st["misses"] != 1:
        raise AssertionError(f"chain64 f32[1024]: compiled calls missed: {st['reasons']}")
    row = {"bench": "compiled", "workload": "chain64 f32[1024] (64 ops), host time per call",
           **med, "ours_best_us": round(min(times["ours_us"]), 2),
           "ours_kernels": st["entries"][0]["kernels"], "max_abs_err": err,
           "target": "<= 5 us a call", "met": med["ours_us"] <= 5.0}  # fmt: skip
    rows.append(row)
    print(json.dumps(row), flush=True)


def bench_linear_gelu(rows: list[dict[str, Any]], use_compile: bool) -> None:
    import torch

    import pygpukit as gpk

    n = 4096
    sets = 3
    xs = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    ws = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(sets)]
    bs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]

    def expr(x: Any, w: Any, b: Any, ops: Any) -> Any:
        return ops.gelu(x @ w.T + b, approximate="tanh")

    fn = gpk.compile(lambda x, w, b: expr(x, w, b, gpk.nn))
    g = [(gpk.from_dlpack(x), gpk.from_dlpack(w), gpk.from_dlpack(b))
         for x, w, b in zip(xs, ws, bs, strict=True)]  # fmt: skip
    ref = torch.nn.functional.gelu(xs[0].float() @ ws[0].float().T + bs[0].float(),
                                   approximate="tanh")  # fmt: skip
    got = torch.from_dlpack(fn(*g[0]))
    rel = float((got.float() - ref).norm() / ref.norm())
    if rel > 2e-2:
        raise AssertionError(f"linear_gelu: relative error {rel:.3g} vs float32 torch")
    ours = time_loop(lambda i: fn(*g[i % sets]), sets, calls=10, reps=15)
    bare = time_graph(lambda i: torch.matmul(xs[i % sets], ws[i % sets].T), sets, calls=10)
    comp = None
    if use_compile:
        tc = torch.compile(lambda x, w, b: expr(x, w, b, torch.nn.functional))
        comp = time_graph(lambda i: tc(xs[i % sets], ws[i % sets], bs[i % sets]), sets, calls=10)
    row = {
        "bench": "compiled",
        "workload": "linear+bias+gelu bf16 4096^3",
        "ours_us": round(ours, 1),
        "bare_gemm_us": round(bare, 1),
        "torch_compile_us": None if comp is None else round(comp, 1),
        "ratio_vs_bare_gemm": round(ours / bare, 3),
        "torch_compile_vs_bare_gemm": None if comp is None else round(comp / bare, 3),
        "rel_err": rel,
        "target": "<= 1.05x bare GEMM",
    }
    rows.append(row)
    print(json.dumps(row), flush=True)


_FIRST_CALL = r"""
import json, sys, time
from pygpukit.bench import llm
from pygpukit.llm.sampling import SamplingParams
cfg = llm.tinyllama_config()
model = llm.random_model(cfg)
prompt = [list(range(3, 3 + llm.PROMPT_LEN))]
res = model.generate_ids(prompt, 2, SamplingParams(), max_seq_len=64, stop_at_eos=False)
gen = model.generator(1, 64)
stats = gen._decode.stats()
entries = stats.get("entries", [])
print("RESULT " + json.dumps({"first_decode_s": res.decode_s, "prefill_s": res.prefill_s,
      "trace_ms": [e["trace_ms"] for e in entries],
      "phases_ms": [e.get("phases_ms") for e in entries],
      "first_call": [e["replay"].get("first_call") for e in entries]}))
"""


def first_call_breakdown(r: dict[str, Any]) -> dict[str, Any]:
    """Where a compiled function's first call went (ms), from its entries' phases_ms and
    replay first_call (lists in `r`, one item per entry): trace, passes, plan, the dry run
    that collects the kernels, the parallel NVRTC compile (wall, summed over kernels, each
    kernel's), module loads, the first (eager) run and the capture, and cuBLASLt's
    heuristic and tuning. Counts keep their names; where several entries give a key, the
    last one's value stands."""
    out: dict[str, Any] = {}
    for phases, first in zip(r.get("phases_ms") or [], r.get("first_call") or [], strict=False):
        for k, v in {**(phases or {}), **(first or {})}.items():
            name = k if k.endswith("_ms") or not isinstance(v, float) else f"{k}_ms"
            out[name] = round(v, 2) if isinstance(v, float) else v
    return out


def cold_cache_env(root: str) -> dict[str, str]:
    """The environment of a process whose kernel caches are new empty directories under
    `root` (an empty directory): PYGPUKIT_CACHE_DIR, and NVRTC's own cache too: NVRTC 13.0
    keeps one across processes in the CUDA compute cache (~/.nv/ComputeCache; on the H200
    the 1x1024 prefill's flash attention compiled in 4.3 s, then in 0.47 s in the next
    process with only a new PYGPUKIT_CACHE_DIR), so the compute cache and the home are new
    as well (Python's user site stays where it was)."""
    import site

    home = os.path.join(root, "home")
    os.makedirs(home, exist_ok=True)
    return dict(os.environ, PYGPUKIT_CACHE_DIR=os.path.join(root, "kernels"), HOME=home,
                XDG_CACHE_HOME=os.path.join(home, ".cache"),
                CUDA_CACHE_PATH=os.path.join(home, ".nv"),
                PYTHONUSERBASE=site.getuserbase())  # fmt: skip


def bench_compile_time(rows: list[dict[str, Any]]) -> None:
    # The cold figure: a fresh process whose kernel caches are new empty directories
    # (nothing on disk, nothing in memory: cold_cache_env); the warm one: the next fresh
    # process on them.
    with tempfile.TemporaryDirectory() as cache:
        env = cold_cache_env(cache)
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env,
                                 capture_output=True, text=True, timeout=600)  # fmt: skip
            line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"compile_time ({label}) failed:\n{out.stderr[-2000:]}")
            r = json.loads(line[len("RESULT ") :])
            target = 1.0 if label == "cold" else 0.2
            row = {"bench": "compiled", "workload": f"first decode call, 22 layers, {label} cache",
                   "seconds": round(r["first_decode_s"], 3), "trace_ms": r["trace_ms"],
                   "breakdown_ms": first_call_breakdown(r),
                   "cache": "PYGPUKIT_CACHE_DIR, HOME: new empty directories, fresh process"
                   if label == "cold" else "the same directories, next fresh process",
                   "target_s": target,
                   "met": r["first_decode_s"] <= target}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)


def _gelu_tail(y: Any, tanh: Any) -> Any:
    """gelu_tanh(y) * 0.5, in the ops any array library has (cupy.fuse traces it)."""
    return 0.5 * y * (1.0 + tanh(0.7978845608028654 * (y + 0.044715 * y * y * y))) * 0.5


def _host_us(fns: dict[str, Callable[[], Any]], calls: int, reps: int) -> dict[str, list[float]]:
    """Microseconds per call of each fn, `calls` back to back per timing, the fns
    interleaved rep by rep (so drift of the host's clock or load hits all alike). Each
    result is held until the next call returns (`y = f(x)` in a loop): a fresh output
    cannot take the block its predecessor still holds."""
    import torch

    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = None
            for _ in range(calls):
                y = fn()
            out[name].append((time.perf_counter() - t0) * 1e6 / calls)
            del y
    torch.cuda.synchronize()
    return out


def bench_dispatch(rows: list[dict[str, Any]], calls: int = 2000, reps: int = 9) -> None:
    import cupy
    import numpy as np
    import torch

    import pygpukit as gpk

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((8, 64)).astype(np.float32)
    w_np = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    s_val = 0.25
    h = x_np.astype(np.float64) @ w_np.astype(np.float64) + s_val
    ref = _gelu_tail(h, np.tanh)

    w = gpk.from_numpy(w_np)
    x, s = gpk.from_numpy(x_np), gpk.scalar(s_val)
    fns: dict[str, Callable[[], Any]] = {}
    compiled = {}
    for static in (False, True):
        f = gpk.compile(lambda x, s: gpk.nn.gelu(x @ w + s, approximate="tanh") * 0.5,
                        static_outputs=static)  # fmt: skip
        err = float(np.abs(f(x, s).to_numpy() - ref).max())
        if err > 1e-4:
            raise AssertionError(f"dispatch: compiled result differs from float64 by {err}")
        name = "ours_static_us" if static else "ours_fresh_us"
        compiled[name] = f
        fns[name] = functools.partial(f, x, s)

    def gelu_half(y: Any) -> Any:
        return _gelu_tail(y, cupy.tanh)

    def add_gelu_half(y: Any, s: Any) -> Any:
        return _gelu_tail(y + s, cupy.tanh)

    fused, add_fused = cupy.fuse(gelu_half), cupy.fuse(add_gelu_half)
    cx, cs = cupy.asarray(x_np @ w_np), cupy.asarray(np.float32(s_val))
    err = float(np.abs(cupy.asnumpy(add_fused(cx, cs)) - ref).max())
    if err > 1e-4:
        raise AssertionError(f"dispatch: cupy.fuse result differs from float64 by {err}")
    fns["cupy_fuse_us"] = lambda: add_fused(cx, cs)
    fns["cupy_fuse_1arg_us"] = lambda: fused(cx)
    tx, tw = torch.from_numpy(x_np).cuda(), torch.from_numpy(w_np).cuda()
    ts = torch.tensor(s_val, device="cuda")

    def torch_eager() -> Any:
        return torch.nn.functional.gelu(tx @ tw + ts, approximate="tanh") * 0.5

    fns["torch_eager_us"] = torch_eager
    for fn in fns.values():  # warm: plans, kernel loads, captures for both output blocks
        for _ in range(50):
            fn()
    times = _host_us(fns, calls, reps)
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    best = {k.replace("_us", "_best_us"): round(min(v), 2) for k, v in times.items()}
    row: dict[str, Any] = {"bench": "compiled",
                           "workload": "dispatch: gelu(x @ w + s) * 0.5, x f32[8,64], s scalar",
                           **med, **best}  # fmt: skip
    for k in ("ours_fresh_us", "ours_static_us"):
        row[k.replace("_us", "_vs_cupy_fuse")] = round(med[k] / med["cupy_fuse_us"], 3)
    for name, f in compiled.items():
        st = f.stats()
        row[name.replace("_us", "_replay")] = st["entries"][0]["replay"]
        if st["misses"] != 1 or st["fast_hits"] < calls * reps:
            raise AssertionError(f"dispatch: {name} missed the guard: {st['reasons']}")
    row["target"] = "<= 10 us (one cupy.fuse call)"
    row["met"] = math.isfinite(med["ours_fresh_us"]) and med["ours_fresh_us"] <= 10.0
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)
    bench_eager_dispatch(rows, reps=reps)
    bench_lazy_large(rows, reps=reps)


def _chain64_small(x: Any) -> Any:
    """64 elementwise ops, each a separate kernel when run eagerly (docs/design.md's chain)."""
    for _ in range(32):
        x = x + 0.5
        x = x * 1.0001
    return x


def bench_eager_dispatch(rows: list[dict[str, Any]], reps: int = 9) -> None:
    """Issue #18's host-cost rows: one eager op `x + 1` on f32[1024], the 64-op chain run
    eagerly and lazily (realized each call, same structure), against torch eager and CuPy,
    with the dispatch controller on (ours) and off (ours_general: run_schedule per step);
    and the cost of recording a node."""
    import cupy
    import numpy as np
    import torch

    import pygpukit as gpk
    from pygpukit import runtime
    from pygpukit.backends import get_backend

    backend: Any = get_backend()
    native = backend.native
    rng = np.random.default_rng(1)
    h = rng.standard_normal(1024).astype(np.float32)
    x, tx, cx = gpk.from_numpy(h), torch.from_numpy(h).cuda(), cupy.asarray(h)
    ref1, ref64 = h.astype(np.float64) + 1, _chain64_small(h.astype(np.float64))

    def eager_op() -> Any:
        with gpk.eager():
            return x + 1

    def eager_chain() -> Any:
        with gpk.eager():
            return _chain64_small(x)

    def lazy_chain() -> Any:
        return _chain64_small(x).realize()

    def general(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            backend.native = None
            try:
                return fn()
            finally:
                backend.native = native

        return run

    for name, fn, ref in (("eager op", eager_op, ref1), ("eager chain", eager_chain, ref64),
                          ("lazy chain", lazy_chain, ref64)):  # fmt: skip
        for _ in range(3):  # general, recorded, native
            err = float(np.abs(fn().to_numpy() - ref).max())
            if err > 1e-3:
                raise AssertionError(f"dispatch: {name} differs from float64 by {err}")
    realizes = runtime.stats["realize_calls"]
    eager_op()  # a key seen: one run of its cached schedule, no recording (eager_ops.py)
    if runtime.stats["realize_calls"] - realizes != 1 or not runtime.EAGER_CACHE:
        raise AssertionError("dispatch: the eager op missed the eager fast path")
    runs0 = native.stats["native_runs"] if native is not None else 0
    groups: dict[str, dict[str, Callable[[], Any]]] = {
        "dispatch: one eager op x + 1, x f32[1024]": {
            "ours_us": eager_op, "ours_general_us": general(eager_op),
            "torch_eager_us": lambda: tx + 1, "cupy_us": lambda: cx + 1,
        },
        "dispatch: 64-op chain over f32[1024], eager": {
            "ours_us": eager_chain, "ours_general_us": general(eager_chain),
            "torch_eager_us": lambda: _chain64_small(tx), "cupy_us": lambda: _chain64_small(cx),
        },
        "dispatch: 64-op chain over f32[1024], lazy, realized each call": {
            "ours_us": lazy_chain, "ours_general_us": general(lazy_chain),
        },
    }  # fmt: skip
    targets = {"dispatch: one eager op x + 1, x f32[1024]": ("<= torch eager", None),
               "dispatch: 64-op chain over f32[1024], lazy, realized each call":
               ("<= 100 us", 100.0)}  # fmt: skip
    for workload, fns in groups.items():
        for fn in fns.values():
            for _ in range(20):
                fn()
        calls = 200 if "chain" in workload else 2000
        times = _host_us(fns, calls, reps)
        med = {k: round(statistics.median(v), 2) for k, v in times.items()}
        row: dict[str, Any] = {"bench": "compiled", "workload": workload, **med}
        for peer in ("torch_eager_us", "cupy_us", "ours_general_us"):
            if peer in med:
                row["ours_vs_" + peer.removesuffix("_us")] = round(med["ours_us"] / med[peer], 3)
        if workload in targets:
            text, limit = targets[workload]
            row["target"] = text
            bound = med.get("torch_eager_us", math.inf) if limit is None else limit
            row["met"] = med["ours_us"] <= bound
        rows.append(row)
        print(json.dumps(row), flush=True)
    nodes = 128  # 64 ops and the 64 scalar `full` nodes of their Python scalars
    t_rec: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(100):
            _chain64_small(x)
        t_rec.append((time.perf_counter() - t0) * 1e6 / (100 * nodes))
    row = {"bench": "compiled", "workload": "dispatch: record, per node (64-op lazy chain)",
           "ours_us_per_node": round(statistics.median(t_rec), 3), "target": "<= 1 us/node",
           "native_runs": (native.stats["native_runs"] - runs0) if native is not None else 0,
           "controller": native.ctrl.stats() if native is not None else None}  # fmt: skip
    row["met"] = row["ours_us_per_node"] <= 1.0
    rows.append(row)
    print(json.dumps(row), flush=True)


def _chain16(x: Any) -> Any:
    """16 elementwise ops: one fused kernel lazily or compiled."""
    for _ in range(8):
        x = x * 1.0001
        x = x + 0.5
    return x


def bench_lazy_large(rows: list[dict[str, Any]], reps: int = 9, n: int = 1 << 24) -> None:
    """Issue #18: the 16-op chain on 16M floats, lazy (recorded and realized each call)
    against the same function under @gpk.compile, calls back to back: the lazy path's
    recording and realize should hide behind the fused kernel's GPU time."""
    import numpy as np

    import pygpukit as gpk

    h = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    x = gpk.from_numpy(h)
    compiled = gpk.compile(_chain16)
    ref = _chain16(h.astype(np.float64))
    fns = {"ours_lazy_us": lambda: _chain16(x).realize(), "ours_compiled_us": lambda: compiled(x)}
    for name, fn in fns.items():
        err = float(np.abs(fn().to_numpy() - ref).max())
        if err > 1e-3:
            raise AssertionError(f"lazy large chain: {name} differs from float64 by {err}")
        for _ in range(10):
            fn()
    gpk.wait_for_compiles()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):  # interleaved; the GPU's work included (synchronize at both ends)
        for name, fn in fns.items():
            gpk.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                y = fn()
            gpk.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e6 / 50)
            del y
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    ratio = round(med["ours_lazy_us"] / med["ours_compiled_us"], 3)
    row = {"bench": "compiled", "workload": "dispatch: 16-op chain over f32[16M], lazy vs compiled",
           **med, "lazy_vs_compiled": ratio, "target": "lazy <= 1.2x compiled",
           "met": ratio <= 1.2}  # fmt: skip
    rows.append(row)
    print(json.dumps(row), flush=True)


def format_rows(rows: list[dict[str, Any]]) -> str:
    return "\n".join(
        "  " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "bench")
        for r in rows
        if r.get("bench") == "compiled"
    )
