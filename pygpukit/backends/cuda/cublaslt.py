"""cuBLASLt GEMMs: plans cached per problem, one workspace per backend, the tf32 switch.

The library is loaded on first use (toolchain.load_cublaslt), or ahead of it on a thread
of its own when the CUDA backend starts (warm_in_background); where it is absent the linear
planner (kernels/linear_plan.py) falls back to the NVRTC GEMMs.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pygpukit import _native
from pygpukit.errors import CUDAError, OutOfMemoryError
from pygpukit.ir import dtypes

from . import lt_choices, toolchain
from .context import Context, capturing
from .kernels import loader
from .value import DeviceValue

# (a_ptr, b_ptr, d_ptr[, bias_ptr][, c=residual_ptr][, a_scale=, b_scale= (FP8 plans)])
GemmLaunch = Callable[..., None]

LT_DTYPES = ("float32", "float16", "bfloat16")
# GEMMs of at least this many rows (a prefill's, not a decode step's) in f16/bf16 are timed
# on their first run over the heuristic's few best algorithms (LtMatmul.tune), the fastest
# kept: the heuristic's first pick was not always the fastest for the prefill shapes.
TUNE_MIN_ROWS = 128
TUNE_REPS = 3
FLUSH_L2_TIMES = 2  # the tuning's L2 flush writes this many times the L2's bytes
# Tuned GEMMs are planned without a workspace where cuBLASLt has an algorithm for that:
# cuBLASLt zeroes the part of a workspace an algorithm needs before each call, a memset
# node in a captured graph that breaks the chain of programmatic launches around it. In
# the serving engine's 1024-token mixed step (H200, TinyLlama shape) the tuned gate/up
# GEMM's 4-byte workspace cost 0.7 us of memset and 4.8 us of gaps a layer, and the same
# GEMM planned without one ran as fast (1024 rows 61.7 against 62.5 us, docs/kernels.md).
TUNED_WITHOUT_WORKSPACE = True
# Where PDL is on, a kernel of ours right after a captured GEMM of at most this many rows
# starts once the GEMM's blocks have all begun rather than once they have exited
# (_native.graph_mark_capture_tail, Graph.start_after_foreign_launch): cuBLASLt's kernels
# never trigger their dependents early, so ours otherwise launch only as the GEMM ends.
EARLY_MAX_ROWS = 64
# One per backend, from its pool: what Hopper's kernels ask for, then less under a tight
# quota (cuBLASLt still has algorithms with a small or no workspace).
WORKSPACE_SIZES = (32 << 20, 4 << 20, 0)
_tf32 = [False]
_lt: dict[str, Any] = {}  # "reason": '' when loaded, else why not (tried once)
_workspaces: weakref.WeakKeyDictionary[Any, tuple[DeviceValue | None, int]] = (
    weakref.WeakKeyDictionary()
)
# What cuBLASLt cost the host so far in this process (a compiled function's first call
# reports its share: planned.CudaReplay): the time spent asking for plans (the heuristic
# runs on a problem's first ask; a plan cache hit costs microseconds), plans tuned and
# their tuning, plans that took a choice kept on disk instead (lt_choices).
_timing: dict[str, float] = {"lt_plan_ms": 0.0, "lt_tuned": 0, "lt_tune_ms": 0.0, "lt_kept": 0}


_warming: list[threading.Thread] = []


def warm_in_background() -> None:
    """Load cuBLASLt, make the device's handle and run a first heuristic query on a thread
    of its own (once a process; the native calls release the interpreter lock), so a
    model's first GEMM does not pay them: on an H200 a cold first prefill call spent about
    260 ms of its dry run in its first linear, loading the library and its first
    heuristics, against 47 ms for the next shape's four new plans. A failure here is
    silent: the first GEMM that needs the library reports it."""
    if _warming:
        return

    def warm() -> None:
        try:
            toolchain.load_cublaslt()
            _native.cublaslt_warm("bfloat16")
        except Exception:  # noqa: BLE001 - absent or unusable: the first GEMM says so
            pass

    thread = threading.Thread(target=warm, name="pygpukit-cublaslt-warm")
    _warming.append(thread)
    thread.start()


def lt_timing() -> dict[str, float]:
    """cuBLASLt's host cost so far in this process: lt_heuristics (plans made: the
    heuristic ran), lt_plan_ms (time asking for plans, the heuristic's mostly), lt_tuned
    (plans whose candidate algorithms were timed, LtMatmul.tune), lt_tune_ms (that timing,
    which waits for the GPU) and lt_kept (plans that took the choice an earlier process
    made, untimed: lt_choices)."""
    return {"lt_heuristics": int(_native.cublaslt_cache_stats()["misses"]), **_timing}


def lt_timing_since(before: dict[str, float]) -> dict[str, float]:
    """lt_timing() less `before` (an earlier lt_timing()), the times rounded to 0.01 ms."""
    now = lt_timing()
    return {k: round(v - before.get(k, 0), 2) if k.endswith("_ms") else v - before.get(k, 0)
            for k, v in now.items()}  # fmt: skip


def set_tf32(enabled: bool) -> None:
    """Let float32 GEMMs round their inputs to TF32 on the tensor cores (default off)."""
    _tf32[0] = bool(enabled)


def tf32_enabled() -> bool:
    return _tf32[0]


def cublaslt_unavailable_reason() -> str:
    """'' when cuBLASLt is loaded (loading it on first call), else why the NVRTC GEMM serves."""
    if "reason" not in _lt:
        try:
            toolchain.load_cublaslt()
            _lt["reason"] = ""
        except CUDAError as e:
            _lt["reason"] = str(e)
    return str(_lt["reason"])


def _workspace(ctx: Context) -> tuple[DeviceValue | None, int]:
    """(buffer, bytes): the largest of WORKSPACE_SIZES the pool grants, kept for the backend."""
    got = _workspaces.get(ctx.owner)
    if got is None:
        for nbytes in WORKSPACE_SIZES:
            if nbytes == 0:
                got = (None, 0)
                break
            try:
                ws = ctx.alloc((nbytes,), dtypes.uint8, "cuBLASLt workspace")
            except OutOfMemoryError:
                continue
            ws.storage.pin()  # captured launches keep its address: never evicted
            got = (ws, nbytes)
            break
        assert got is not None
        _workspaces[ctx.owner] = got
    return got


def _align(*ptrs: int) -> int:
    """The alignment (up to 16 bytes, what the fast kernels need) all pointers share."""
    a = 16
    while a > 1 and any(p % a for p in ptrs):
        a //= 2
    return a


def lt_operand(rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a strided [rows, cols] matrix for cuBLASLt, or
    None when neither dimension is unit-stride. Sizes of 1 take any stride."""
    if s_row < 0 or s_col < 0:
        return None
    if s_col == 1 or cols == 1:
        ld = s_row if rows > 1 else cols
        if ld >= max(cols, 1) and (cols == 1 or s_col == 1):
            return False, ld
    if s_row == 1 or rows == 1:
        ld = s_col if cols > 1 else rows
        if ld >= max(rows, 1):
            return True, ld
    return None


def _l2_bytes() -> int:
    """The current device's L2 cache size in bytes (0 where the driver does not say)."""
    return int(toolchain.device_info().get("l2_cache_bytes", 0))


def _tuned(ctx: Context, plan: Any, a: int, b: int, d: int, bias: int, c: int, ws_ptr: int,
           ws_bytes: int, a_scale: int = 0, b_scale: int = 0) -> bool:  # fmt: skip
    """Whether the plan's algorithm is settled: taken from the choices kept on disk, tuned
    now or before, or tuning failed (the heuristic's pick stays). False while the stream
    is captured (tried again next run). The candidates run with the L2 flushed before
    each (through a scratch of FLUSH_L2_TIMES the L2, from the pool for the tuning only;
    none when the pool has no room): timed back to back, a GEMM's weight stays in the L2
    and the hot winner was slower in the model's sequence, where each weight arrives cold."""
    # Launchers of one problem (every layer's) share the plan: the first to run tunes it.
    if plan.chosen >= 0:
        return True
    if lt_choices.take(plan):
        _timing["lt_kept"] += 1
        return True
    stream = ctx.stream
    is_capturing = getattr(stream, "is_capturing", None)
    if capturing(ctx) or (is_capturing is not None and is_capturing()):
        return False  # nothing may run while a graph is recorded: the next run tunes
    t0 = time.perf_counter()
    scratch = None
    flush_bytes = FLUSH_L2_TIMES * _l2_bytes()
    if flush_bytes:
        try:
            scratch = ctx.alloc((flush_bytes,), dtypes.uint8, "cuBLASLt tuning L2 flush")
        except OutOfMemoryError:
            flush_bytes = 0
    flush = scratch.ptr if scratch is not None else 0
    try:
        chosen = plan.tune(a, b, d, bias, c, ws_ptr, ws_bytes, stream, TUNE_REPS, flush,
                           flush_bytes, a_scale, b_scale)  # fmt: skip
    except (CUDAError, ValueError, TypeError):
        return True
    finally:
        if scratch is not None:
            scratch.storage.release()
    if chosen >= 0:
        _timing["lt_tuned"] += 1
        _timing["lt_tune_ms"] += (time.perf_counter() - t0) * 1e3
        lt_choices.keep(plan, chosen)
    return bool(chosen >= 0)


def lt_launcher(ctx: Context, dtype: str, m: int, n: int, k: int, a_op: tuple[bool, int],
                b_op: tuple[bool, int], batch: int = 1, stride_a: int = 0, stride_b: int = 0,
                epilogue: str = "none", ptrs: Sequence[int] = (), ldc: int = 0,
                tune: bool = False, scales: tuple[str, str] | None = None
                ) -> GemmLaunch | None:  # fmt: skip
    """launch(a, b, d[, bias][, c=...]) through a cached cuBLASLt plan, or None when cuBLASLt
    is absent or has no algorithm for the problem. D is contiguous [batch, m, n] of dtype.
    ldc > 0: the plan adds C [m, n] of that row stride (beta = 1; one matrix, epilogue none
    or bias), passed as c=. float32 follows set_tf32 at run time (one plan per mode). tune:
    a single f16/bf16 GEMM of TUNE_MIN_ROWS rows or more times the plan's candidate
    algorithms on its first run outside a capture (on that run's operands) and keeps the
    fastest. scales (A's mode, B's mode): A and B are FP8 e4m3 with float32 scales of those
    modes (the native plan's scale_a / scale_b), passed as a_scale= and b_scale=."""
    if dtype not in LT_DTYPES or cublaslt_unavailable_reason():
        return None
    (ta, lda), (tb, ldb) = a_op, b_op
    if batch > 1 and stride_b == 0 and not ta and stride_a == m * lda:
        m, batch, stride_a = m * batch, 1, 0  # broadcast B: the batch folds into M
    align = _align(*ptrs)
    ws, ws_bytes = _workspace(ctx)
    tuned = tune and dtype != "float32" and batch == 1 and m >= TUNE_MIN_ROWS
    kw = dict(lda=lda, ldb=ldb, ldd=n, trans_a=ta, trans_b=tb, batch=batch, stride_a=stride_a,
              stride_b=stride_b, stride_d=m * n, epilogue=epilogue, align=align,
              ldc=ldc)  # fmt: skip
    if scales is not None:
        kw.update(in_dtype="float8_e4m3", scale_a=scales[0], scale_b=scales[1])

    def plan(tf32: bool, nbytes: int) -> Any:
        return _native.cublaslt_plan(m, n, k, dtype, tf32=tf32, workspace_bytes=nbytes,
                                     **kw)  # type: ignore[arg-type]  # fmt: skip

    t0 = time.perf_counter()
    plans = None
    try:
        if tuned and ws_bytes and TUNED_WITHOUT_WORKSPACE:
            try:
                plans = {False: plan(False, 0)}
            except (CUDAError, ValueError):
                pass  # no algorithm without one: the workspace's plan
        if plans is None:
            plans = {False: plan(False, ws_bytes)}
            if dtype == "float32":
                plans[True] = plan(True, ws_bytes)
    except (CUDAError, ValueError):
        return None  # e.g. no algorithm for a broadcast (stride 0) batch: the NVRTC path
    finally:
        _timing["lt_plan_ms"] += (time.perf_counter() - t0) * 1e3
    ws_ptr = ws.ptr if ws is not None else 0
    untuned = [tuned]
    early = m * batch <= EARLY_MAX_ROWS and loader.pdl_enabled()

    def lt(pa: int, pb: int, pd: int, pbias: int = 0, c: int = 0, a_scale: int = 0,
           b_scale: int = 0) -> None:  # fmt: skip
        p = plans[_tf32[0] and dtype == "float32"]
        if untuned[0]:
            untuned[0] = not _tuned(ctx, p, pa, pb, pd, pbias, c, ws_ptr, ws_bytes, a_scale,
                                    b_scale)  # fmt: skip
        p.run(pa, pb, pd, pbias, ws_ptr, ws_bytes, ctx.stream, c, a_scale, b_scale)
        if early and capturing(ctx):
            _native.graph_mark_capture_tail(ctx.stream)

    return lt
