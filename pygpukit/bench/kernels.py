"""Kernel-template benchmarks: our launchers vs torch eager and torch.compile, same data.

Each workload checks our output against torch first (no timing of a wrong kernel), then
times N launches captured in one CUDA graph (so launch overhead is not what we measure),
cycling through enough input sets to defeat L2 when one set would fit in it. Reported:
median time per call, GB/s over the minimum bytes (each input read once, each output
written once), % of the measured device-to-device copy bandwidth, and torch/ours ratios.

    python -m pygpukit.bench.kernels [--no-compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
from collections.abc import Callable
from typing import Any

from pygpukit.backends.cuda.kernels import (
    attention,
    attention_sm90,
    gemv,
    rms_norm,
    rope,
    softmax,
    variants,
)

Fn = Callable[[int], None]  # one call on input set i


def _torch() -> Any:
    import torch

    return torch


def _sets_for(nbytes: int) -> int:
    """Input sets needed so the rotation spans ~3x L2 (1 when one set is already larger)."""
    torch = _torch()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, math.ceil(3 * l2 / max(nbytes, 1)))


def _captured(fn: Fn, n_sets: int, calls: int) -> Callable[[], None]:
    """`calls` calls of fn (rotating sets) as one CUDA graph's replay, after a warm-up
    (compiles, autotunes, loads modules); plain launches where fn is not capturable."""
    torch = _torch()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(max(3, n_sets)):
            fn(i % n_sets)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i % n_sets)
        run: Callable[[], None] = g.replay
    except Exception:  # not capturable: time plain launches instead
        torch.cuda.synchronize()

        def run() -> None:
            for i in range(calls):
                fn(i % n_sets)

    run()
    torch.cuda.synchronize()
    return run


def _us_per_call(run: Callable[[], None], calls: int) -> float:
    """One timed run (device events), in microseconds per call."""
    torch = _torch()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    run()
    b.record()
    b.synchronize()
    return float(a.elapsed_time(b) * 1000.0 / calls)


def time_graph(fn: Fn, n_sets: int, calls: int = 20, reps: int = 30) -> float:
    """Median microseconds per call: `calls` calls (rotating sets) in one CUDA graph."""
    run = _captured(fn, n_sets, calls)
    return statistics.median(_us_per_call(run, calls) for _ in range(reps))


def time_graphs_interleaved(fns: dict[str, Fn], n_sets: int, calls: int = 20,
                            reps: int = 30) -> dict[str, float]:  # fmt: skip
    """time_graph of each fn, their graphs replayed in turn `reps` times (drift hits every
    fn alike): median microseconds per call by name."""
    runs = {name: _captured(fn, n_sets, calls) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, run in runs.items():
            times[name].append(_us_per_call(run, calls))
    return {name: statistics.median(t) for name, t in times.items()}


def _ignore(*_: Any) -> None:
    """Lets a lambda call something for its effect and return None."""


def _rot(fn: Callable[..., Any], *sets: list[Any]) -> Fn:
    """A call of fn on input set i, taking the i-th item of each list."""

    def call(i: int) -> None:
        fn(*(s[i] for s in sets))

    return call


def _stream() -> int:
    return int(_torch().cuda.current_stream().cuda_stream)


def _close(ours: Any, ref: Any, what: str, tol: float = 2e-2) -> None:
    o, r = ours.double(), ref.double()
    err = float((o - r).norm() / r.norm().clamp_min(1e-30))
    if not math.isfinite(err) or err > tol:
        raise AssertionError(f"{what}: ours differs from torch (relative error {err:.3g})")


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    try:
        return _torch().compile(fn, dynamic=False)  # type: ignore[no-any-return]
    except Exception:
        return None


def _timed_row(rows: list[dict[str, Any]], name: str, ours: Fn, n_sets: int) -> None:
    """A row of our time alone (a variant swept beside the row that compares with peers)."""
    rows.append({"bench": "kernels", "workload": name, "us": round(time_graph(ours, n_sets), 2)})
    print(json.dumps(rows[-1]), flush=True)


def _row(
    rows: list[dict[str, Any]],
    name: str,
    nbytes: int,
    copy_gbs: float,
    ours: Fn,
    eager: Fn,
    comp: Fn | None,
    n_sets: int,
) -> None:
    t_ours = time_graph(ours, n_sets)
    t_eager = time_graph(eager, n_sets)
    t_comp = float("nan")
    if comp is not None:
        try:
            t_comp = time_graph(comp, n_sets)
        except Exception as exc:  # torch.compile may fail on odd setups; report, go on
            print(f"  torch.compile failed for {name}: {type(exc).__name__}: {exc}")
    gbs = nbytes / (t_ours * 1e-6) / 1e9
    row = {
        "bench": "kernels",
        "workload": name,
        "us": round(t_ours, 2),
        "GB/s": round(gbs, 1),
        "pct_copy_bw": round(100 * gbs / copy_gbs, 1) if copy_gbs else None,
        "torch_eager_us": round(t_eager, 2),
        "torch_compile_us": None if math.isnan(t_comp) else round(t_comp, 2),
        "speedup_vs_eager": round(t_eager / t_ours, 2),
        "speedup_vs_compile": None if math.isnan(t_comp) else round(t_comp / t_ours, 2),
        "bytes": nbytes,
    }
    rows.append(row)
    print(json.dumps(row), flush=True)


def bench_copy(rows: list[dict[str, Any]]) -> float:
    """Device-to-device copy bandwidth (bytes read + written), the ceiling for the rest:
    the best of torch copy_ over 1 GiB and 256 MiB float32 buffers."""
    torch = _torch()
    best = 0.0
    for nbytes in (1 << 30, 1 << 28):
        a = torch.randn(nbytes // 4, device="cuda")
        b = torch.empty_like(a)
        t = time_graph(_rot(b.copy_, [a]), 1, calls=10, reps=20)
        gbs = 2 * nbytes / (t * 1e-6) / 1e9
        rows.append(
            {
                "bench": "kernels",
                "workload": f"copy d2d {nbytes >> 20} MiB",
                "us": round(t, 2),
                "GB/s": round(gbs, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        best = max(best, gbs)
        del a, b
    return best


def bench_rms_norm(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    m, n, eps = 16384, 8192, 1e-6
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)

    def ref(x: Any, w: Any) -> Any:  # Hugging Face LlamaRMSNorm
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    def ours(i: int, threads: int | None = None) -> None:
        rms_norm.rms_norm(
            x.data_ptr(),
            w.data_ptr(),
            y.data_ptr(),
            m,
            n,
            eps,
            "bfloat16",
            block_threads=threads,
            stream=_stream(),
        )

    for threads in SWEEP_THREADS:
        y.fill_(float("nan"))
        ours(0, threads)
        torch.cuda.synchronize()
        _close(y, ref(x, w), f"rms_norm threads={threads}")
        _timed_row(
            rows,
            f"rms_norm 16384x8192 bf16 threads={threads}",
            functools.partial(ours, threads=threads),
            1,
        )
    comp = _compiled(ref) if use_compile else None
    _row(
        rows,
        "rms_norm 16384x8192 bf16",
        2 * m * n * 2 + n * 2,
        copy_gbs,
        ours,
        lambda i: _ignore(ref(x, w)),
        (lambda i: _ignore(comp(x, w))) if comp else None,
        1,
    )


def bench_softmax(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    m, n = 16384, 8192
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.empty_like(x)

    def ref(x: Any) -> Any:
        return torch.softmax(x, -1)

    def ours(i: int, threads: int | None = None) -> None:
        softmax.softmax(
            x.data_ptr(), y.data_ptr(), m, n, "bfloat16", block_threads=threads, stream=_stream()
        )

    for threads in SWEEP_THREADS:
        y.fill_(float("nan"))
        ours(0, threads)
        torch.cuda.synchronize()
        _close(y, torch.softmax(x.float(), -1), f"softmax threads={threads}")
        _timed_row(
            rows,
            f"softmax 16384x8192 bf16 threads={threads}",
            functools.partial(ours, threads=threads),
            1,
        )
    comp = _compiled(ref) if use_compile else None
    _row(
        rows,
        "softmax 16384x8192 bf16",
        2 * m * n * 2,
        copy_gbs,
        ours,
        lambda i: _ignore(ref(x)),
        (lambda i: _ignore(comp(x))) if comp else None,
        1,
    )


def bench_rope(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    b, h, s, d = 8, 32, 2048, 128
    x = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    ang = torch.outer(torch.arange(s, device="cuda").float(), inv)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)

    def ref(x: Any, c: Any, s_: Any) -> Any:  # Hugging Face apply_rotary_pos_emb
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * c + torch.cat([-x2, x1], -1) * s_

    def ours(i: int) -> None:
        rope.rope(
            x.data_ptr(),
            y.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            b,
            h,
            s,
            d,
            "bfloat16",
            stream=_stream(),
        )

    ours(0)
    torch.cuda.synchronize()
    _close(y, ref(x.float(), cos2.float(), sin2.float()), "rope")
    comp = _compiled(ref) if use_compile else None
    _row(
        rows,
        "rope 8x32x2048x128 bf16",
        2 * x.numel() * 2,
        copy_gbs,
        ours,
        lambda i: _ignore(ref(x, cos2, sin2)),
        (lambda i: _ignore(comp(x, cos2, sin2))) if comp else None,
        1,
    )


# (M, K, N): the historical square-ish rows, then the TinyLlama-1.1B decode step's
# projections (qkv 2048->2560, o 2048->2048, gate+up 2048->11264, down 5632->2048, lm head
# 2048->32000) at 1, 4 and 16 rows (batched decode).
GEMV_SHAPES = [(1, 4096, 4096), (1, 2048, 5632), (1, 5632, 2048)] + [
    (m, k, n)
    for m in (1, 4, 16)
    for k, n in ((2048, 2560), (2048, 2048), (2048, 11264), (5632, 2048), (2048, 32000))
]
# Tensor-core GEMV geometries swept on the first three shapes (gemv.MMA_CONFIG's fields).
GEMV_SWEEP = variants.gemv_sweep()


def bench_gemv(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    f = torch.nn.functional
    for si, (m, k, n) in enumerate(GEMV_SHAPES):
        wbytes = n * k * 2
        sets = _sets_for(wbytes)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        name = f"gemv bf16 {m}x{k} @ [{n}x{k}]^T"

        def ours(
            i: int,
            ws: Any = ws,
            xs: Any = xs,
            ys: Any = ys,
            m: int = m,
            n: int = n,
            k: int = k,
            cfg: tuple[int, int, int, int] | None = None,
            early: bool = True,
        ) -> None:
            # The weights are never written here: as the compiled path does for read-only
            # weights, the GEMV may load them before the call ahead of it ends (w_early).
            gemv.gemv(
                xs[i].data_ptr(),
                ws[i].data_ptr(),
                ys[i].data_ptr(),
                n,
                k,
                "bfloat16",
                m=m,
                config=cfg,
                w_early=early,
                stream=_stream(),
            )

        for cfg in GEMV_SWEEP if si < 3 or m == 1 else ():  # every batch-1 decode shape
            ys[0].fill_(float("nan"))
            ours(0, cfg=cfg)
            torch.cuda.synchronize()
            _close(ys[0], xs[0].float() @ ws[0].float().T, f"{name} config={cfg}")
            _timed_row(
                rows, f"{name} config={cfg}", functools.partial(ours, cfg=cfg, early=False), sets
            )
        for early in (False, True):
            ys[0].fill_(float("nan"))
            ours(0, early=early)
            torch.cuda.synchronize()
            _close(ys[0], xs[0].float() @ ws[0].float().T, f"{name} w_early={early}")
        _timed_row(
            rows,
            f"{name} writable weights (no early loads)",
            functools.partial(ours, early=False),
            sets,
        )
        comp = _compiled(f.linear) if use_compile else None
        _row(
            rows,
            name,
            wbytes + 2 * m * (k + n),
            copy_gbs,
            ours,
            _rot(f.linear, xs, ws),
            _rot(comp, xs, ws) if comp else None,
            sets,
        )
        del ws, xs, ys


def bench_decode(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    torch = _torch()
    f = torch.nn.functional
    h, kvh, d = 32, 4, 128
    for batch, ctx in ((1, 1024), (1, 8192), (8, 8192)):
        kv_bytes = 2 * batch * kvh * ctx * d * 2
        sets = _sets_for(kv_bytes)
        mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        qs = [mk(batch, h, 1, d) for _ in range(sets)]
        ks = [mk(batch, kvh, ctx, d) for _ in range(sets)]
        vs = [mk(batch, kvh, ctx, d) for _ in range(sets)]
        os_ = [
            torch.empty(batch, h, 1, d, device="cuda", dtype=torch.bfloat16) for _ in range(sets)
        ]
        ctx_t = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        max_splits = max(
            attention.decode_splits(batch, h, kvh, ctx, "bfloat16", blocks_per_sm=bps)
            for bps, _ in DECODE_SWEEP + ((None, 0),)
        )
        ws = torch.empty(
            attention.decode_workspace_bytes(batch, h, max_splits, d),
            dtype=torch.uint8,
            device="cuda",
        )
        # Shared by every call (last-block merge): each launch leaves them zeroed.
        n_ctr = attention.decode_counters(batch, h, kvh)
        ctr = torch.zeros(n_ctr, dtype=torch.int32, device="cuda")

        def ours(
            i: int,
            qs: Any = qs,
            ks: Any = ks,
            vs: Any = vs,
            os_: Any = os_,
            b: int = batch,
            c: int = ctx,
            ws: Any = ws,
            ctr: Any = ctr,
            ctx_t: Any = ctx_t,
            bps: int | None = None,
            st: int | None = None,
            early: bool = True,
        ) -> None:
            # The caches and the length are written before the graph runs, as in a captured
            # decode step: each block may fill its stages before the call ahead ends.
            sp = attention.decode_splits(b, h, kvh, c, "bfloat16", blocks_per_sm=bps)
            attention.decode(
                qs[i].data_ptr(),
                ks[i].data_ptr(),
                vs[i].data_ptr(),
                ctx_t.data_ptr(),
                os_[i].data_ptr(),
                ws.data_ptr(),
                b,
                h,
                kvh,
                c,
                d,
                "bfloat16",
                splits=sp,
                counters=ctr.data_ptr() if attention.decode_last_block_merge(sp) else 0,
                stages=st or attention.decode_stages("bfloat16", d, bps),
                kv_early=early,
                stream=_stream(),
            )

        def ref(q: Any, k: Any, v: Any) -> Any:
            return f.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        name = f"decode attn B{batch} H32/KV4 D128 ctx {ctx} bf16"
        r = ref(qs[0].float(), ks[0].float(), vs[0].float())
        for bps, st in DECODE_SWEEP:
            os_[0].fill_(float("nan"))
            ours(0, bps=bps, st=st)
            torch.cuda.synchronize()
            _close(os_[0], r, f"{name} blocks_per_sm={bps} stages={st}")
            _timed_row(
                rows,
                f"{name} blocks_per_sm={bps} stages={st}",
                functools.partial(ours, bps=bps, st=st),
                sets,
            )
        for early in (False, True):
            os_[0].fill_(float("nan"))
            ours(0, early=early)
            torch.cuda.synchronize()
            _close(os_[0], r, f"decode attention ctx {ctx} kv_early={early}")
        _timed_row(rows, f"{name} no early loads", functools.partial(ours, early=False), sets)
        comp = _compiled(ref) if use_compile else None
        _row(
            rows,
            name,
            kv_bytes + 2 * 2 * batch * h * d,
            copy_gbs,
            ours,
            _rot(ref, qs, ks, vs),
            _rot(comp, qs, ks, vs) if comp else None,
            sets,
        )
        del qs, ks, vs, os_
        _copy_at(rows, kv_bytes, copy_gbs)


# Prefill attention (issue #23's targets): (batch, heads, kv heads, tokens, head dim), causal.
PREFILL_SHAPES = ((1, 32, 4, 2048, 64), (4, 32, 4, 512, 64), (1, 32, 4, 2048, 128))


def bench_sdpa(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    """Causal bf16 prefill attention: attention.flash (the tensor-core kernel, each block
    geometry swept) and, on SM 9.0, attention_sm90.flash_sm90 (wgmma, tensor-map copies)
    against torch SDPA's flash backend and its default choice, same data. The summary row
    times the planner's choice."""
    torch = _torch()
    f = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, kvh, t, d in PREFILL_SHAPES:
        mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        nbytes = 2 * (2 * b * h * t * d + 2 * b * kvh * t * d)
        sets = _sets_for(nbytes)
        qs = [mk(b, h, t, d) for _ in range(sets)]
        ks = [mk(b, kvh, t, d) for _ in range(sets)]
        vs = [mk(b, kvh, t, d) for _ in range(sets)]
        os_ = [torch.empty(b, h, t, d, device="cuda", dtype=torch.bfloat16) for _ in qs]

        def ours(i: int, geometry: tuple[int, ...] | None = None, b: int = b, h: int = h,
                 kvh: int = kvh, t: int = t, d: int = d, qs: Any = qs, ks: Any = ks,
                 vs: Any = vs, os_: Any = os_) -> None:  # fmt: skip
            attention.flash(qs[i].data_ptr(), ks[i].data_ptr(), vs[i].data_ptr(),
                            os_[i].data_ptr(), b, h, kvh, t, t, d, "bfloat16", causal=True,
                            geometry=geometry, stream=_stream())  # fmt: skip

        def ref(q: Any, k: Any, v: Any) -> Any:
            return f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def flash_ref(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        peer, peer_sets = flash_ref, (qs, ks, vs)
        try:
            flash_ref(qs[0], ks[0], vs[0])
        except RuntimeError:  # no GQA in this torch's flash backend: repeat the kv heads
            grp = h // kvh
            peer_sets = (qs, [x.repeat_interleave(grp, dim=1) for x in ks],
                         [x.repeat_interleave(grp, dim=1) for x in vs])  # fmt: skip

            def peer(q: Any, k: Any, v: Any) -> Any:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return f.scaled_dot_product_attention(q, k, v, is_causal=True)

        name = f"prefill attn B{b} H{h}/KV{kvh} T{t} D{d} causal bf16"
        r = ref(qs[0].float(), ks[0].float(), vs[0].float())
        flops = 4 * b * h * t * t * d / 2  # causal: half the score matrix

        def hopper(i: int, b: int = b, h: int = h, kvh: int = kvh, t: int = t, d: int = d,
                   qs: Any = qs, ks: Any = ks, vs: Any = vs, os_: Any = os_) -> None:  # fmt: skip
            attention_sm90.flash_sm90(qs[i].data_ptr(), ks[i].data_ptr(), vs[i].data_ptr(),
                                      os_[i].data_ptr(), b, h, kvh, t, t, d, "bfloat16",
                                      causal=True, stream=_stream())  # fmt: skip

        if attention_sm90.available():
            os_[0].fill_(float("nan"))
            hopper(0)
            torch.cuda.synchronize()
            _close(os_[0], r, f"{name} sm90")
            _timed_row(rows, f"{name} sm90 wgmma", hopper, sets)
            rows[-1]["TFLOP/s"] = round(flops / (rows[-1]["us"] * 1e-6) / 1e12, 1)
            print(json.dumps(rows[-1]), flush=True)
        chosen = hopper if attention_sm90.available() and attention_sm90.chosen(d) else ours
        geoms = attention.FLASH_SWEEP
        for g in geoms:
            os_[0].fill_(float("nan"))
            ours(0, geometry=g)
            torch.cuda.synchronize()
            _close(os_[0], r, f"{name} geometry={tuple(g)}")
            _timed_row(
                rows, f"{name} geometry={tuple(g)}", functools.partial(ours, geometry=g), sets
            )
            rows[-1]["TFLOP/s"] = round(flops / (rows[-1]["us"] * 1e-6) / 1e12, 1)
        os_[0].fill_(float("nan"))
        chosen(0)
        torch.cuda.synchronize()
        _close(os_[0], r, name)
        _close(peer(*(x[0] for x in peer_sets)), r, f"{name} torch flash backend")
        _row(rows, name, nbytes, copy_gbs, chosen, _rot(peer, *peer_sets),
             _rot(ref, qs, ks, vs), sets)  # fmt: skip
        # torch_eager_us: the flash backend; torch_compile_us: SDPA's default choice (eager).
        rows[-1]["peers"] = "eager=torch SDPA flash backend, compile=torch SDPA default"
        rows[-1]["TFLOP/s"] = round(flops / (rows[-1]["us"] * 1e-6) / 1e12, 1)
        print(json.dumps(rows[-1]), flush=True)
        del qs, ks, vs, os_, peer_sets


def copy_us(nbytes: int) -> float:
    """Microseconds of torch's device copy moving `nbytes` (read + write), 20 calls in a
    CUDA graph rotating sets as a workload's timing does: the reference a few-MB workload is
    read against, where launch and ramp-up weigh on a few microseconds (docs/kernels.md,
    "How they are measured"; a kernel that only reads can beat it there)."""
    torch = _torch()
    sets = _sets_for(nbytes)
    src = [torch.randn(max(1, nbytes // 8), device="cuda") for _ in range(sets)]
    dst = [torch.empty_like(a) for a in src]
    return time_graph(lambda i: _ignore(dst[i].copy_(src[i])), sets)


def _copy_at(rows: list[dict[str, Any]], nbytes: int, copy_gbs: float) -> None:
    """A row of copy_us(nbytes) against the large-buffer copy."""
    t = copy_us(nbytes)
    gbs = nbytes / (t * 1e-6) / 1e9
    rows.append(
        {
            "bench": "kernels",
            "workload": f"copy d2d moving {nbytes} bytes",
            "us": round(t, 2),
            "GB/s": round(gbs, 1),
            "pct_copy_bw": round(100 * gbs / copy_gbs, 1),
        }
    )
    print(json.dumps(rows[-1]), flush=True)


SWEEP_THREADS = (512, 128)
# Tensor-core decode: (blocks per SM the split count aims at, cp.async stages per warp).
DECODE_SWEEP = ((1, 2), (1, 3), (2, 1), (3, 1))
WORKLOADS = [bench_rms_norm, bench_rope, bench_softmax, bench_gemv, bench_decode, bench_sdpa]


def run(json_rows: list[dict[str, Any]], use_compile: bool = True) -> None:
    """Appends one row per workload (plus the copy ceiling) to json_rows."""
    torch = _torch()
    json_rows.append({"bench": "kernels", "device": torch.cuda.get_device_name(0)})
    copy_gbs = bench_copy(json_rows)
    for w in WORKLOADS:
        w(json_rows, copy_gbs, use_compile)
        torch.cuda.empty_cache()


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        "workload",
        "us",
        "GB/s",
        "pct_copy_bw",
        "torch_eager_us",
        "torch_compile_us",
        "speedup_vs_eager",
        "speedup_vs_compile",
    ]
    print(" | ".join(cols))
    for r in rows:
        if "workload" in r:
            print(" | ".join(str(r.get(c, "")) for c in cols))
        else:
            print(r)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile timings")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    try:
        run(rows, use_compile=not args.no_compile)
    finally:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        print_table(rows)


if __name__ == "__main__":
    main()
