"""Launcher for dequant.cuh: a quantized weight (ir/quant.py's layouts) dequantized into a
dense [N, K] of float32, f16 or bf16, each element rounded once; the prefill GEMM's
scratch weight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygpukit.ir.quant import FP8_BLOCK, QuantSpec

from .. import toolchain
from . import gemv_quant, loader
from ._common import cdiv, int32_range, positive

THREADS = 256
# Bytes of W a thread loads before it converts any (4 or 8 vectors). H200, 7B shapes: int8
# 3.4-3.7 TB/s, int4 g128 3.3-3.7, asymmetric 2.9-3.1 (51 registers: 5 blocks an SM); the
# previous kernel's one 8-element vector a thread ran int8 at 3.7-3.8 and asymmetric int4
# at 3.4-3.5, so fewer vectors a thread is the next thing to measure.
BYTES_IN_FLIGHT = 32
DTYPES = ("float32", "float16", "bfloat16")
# Bytes of W one vector load takes, widest first.
VECTOR_BYTES = (8, 4)
# Bytes of output one vector may make: a warp's stores then cover one contiguous run.
MAX_STORE = 16
# The launch forms of the vector kernels, (kernel, bytes of W a thread loads at once): a
# weight's first launch outside a capture times each (tune=True) and keeps the fastest for
# its format, shape and vector width; until then, and under a capture, DEFAULT_FORM. H200,
# Llama-2-7B prefill: the dequantization ran at 3.4-3.6 TB/s against 4.2 for a copy, and
# the N slices through an L2-sized scratch that would skip DRAM for the bf16 copy lost
# more to the narrower GEMMs than the dequantization took (docs/kernels.md).
FORMS = (
    ("pgk_dequant", 32), ("pgk_dequant", 16), ("pgk_dequant", 8),
    ("pgk_dequant_loop", 16), ("pgk_dequant_loop", 8),
)  # fmt: skip
DEFAULT_FORM = ("pgk_dequant", BYTES_IN_FLIGHT)
# pgk_dequant_loop's blocks an SM: its launch bounds keep that many resident (64 registers).
LOOP_BLOCKS_PER_SM = 4
TUNE_REPS = 3
_chosen: dict[tuple[Any, ...], tuple[str, int]] = {}


def vectors_per_thread(b: int, in_flight: int = BYTES_IN_FLIGHT) -> int:
    """Vectors of b bytes a thread loads at once (in_flight bytes, at least one vector)."""
    return max(1, in_flight // b)


def defines(spec: QuantSpec, dtype: str, scale_numel: int) -> dict[str, object]:
    """The format's macros of dequant.cuh."""
    return {
        **loader.type_defines(dtype),
        "PGK_QFMT": gemv_quant.FORMATS[spec.format],
        "PGK_QSK": int(spec.format == "int4" or bool(spec.block)),
        "PGK_QTENSOR": int(spec.format == "fp8" and not spec.block and scale_numel == 1),
        "PGK_QGROUP": spec.group if spec.format == "int4" else (spec.block or FP8_BLOCK),
        "PGK_QZERO": int(spec.has_zero),
    }


def widths(spec: QuantSpec, dtype: str) -> tuple[int, ...]:
    """The vector widths (bytes of W) the launcher may pick for this format and dtype:
    those whose output fits MAX_STORE, else the narrowest."""
    per = (2 if spec.format == "int4" else 1) * loader.itemsize(dtype)
    fit = tuple(b for b in VECTOR_BYTES if b * per <= MAX_STORE)
    return fit or VECTOR_BYTES[-1:]


def vector_bytes(spec: QuantSpec, k: int, dtype: str, w: int, out: int) -> int:
    """The widest vector of W (bytes) the vector kernel can take for this weight at these
    addresses, or 0 (then one element a thread): its output at most MAX_STORE bytes where
    a narrower one exists, its elements dividing K and the group or block, and W's rows
    and out's rows aligned to the loads and stores."""
    per_byte = 2 if spec.format == "int4" else 1
    grouped = spec.group if spec.format == "int4" else spec.block
    for b in widths(spec, dtype):
        e = b * per_byte
        store = min(16, e * loader.itemsize(dtype))
        if k % e or (grouped and grouped % e) or w % b or out % store:
            continue
        return b
    return 0


def form_defines(
    spec: QuantSpec, dtype: str, scale_numel: int, b: int, form: tuple[str, int]
) -> dict[str, object]:
    """The macros of the vector kernel `form` (FORMS) with vectors of b bytes of W."""
    d = {**defines(spec, dtype, scale_numel), "PGK_DQB": b,
         "PGK_DQU": vectors_per_thread(b, form[1])}  # fmt: skip
    if form[0] == "pgk_dequant_loop":
        d["PGK_DQBPS"] = LOOP_BLOCKS_PER_SM
    return d


def dequantize(w: int, scale: int, out: int, spec: QuantSpec, n: int, k: int, dtype: str, *,
               scale_numel: int, zero: int = 0, w_early: bool = False, tune: bool = False,
               form: tuple[str, int] | None = None, stream: Any = None) -> None:  # fmt: skip
    """out [n, k] (dtype, dense) = the weight W's arrays stand for (data at w, float32
    scales at scale, scale_numel of them; int4 zero points at zero), rounded once.
    w_early: the weight's arrays are read-only, so its first loads may go out before the
    kernel ahead ends (programmatic dependent launch). tune: the stream is not being
    captured, so a weight whose form is not chosen yet times FORMS here (synchronizing the
    stream) and keeps the fastest. form: launch that one of FORMS (tests)."""
    loader.check_dtype(dtype, DTYPES, "dequantize")
    positive("dequantize", n=n, k=k)
    int32_range("dequantize", n=n, k=k)
    if n == 0 or k == 0:
        return
    row_bytes = k // 2 if spec.format == "int4" else k
    b = vector_bytes(spec, k, dtype, w, out)
    scale_ld = gemv_quant.scale_ld(spec, k)
    args = (w, scale, zero, out, n, k, row_bytes, scale_ld)
    if not b:
        fn = loader.get_kernel("dequant", "pgk_dequant_each", defines(spec, dtype, scale_numel))
        fn.launch((cdiv(n * k, THREADS),), (THREADS,), args, 0, stream)
        return
    per_vector = b * (2 if spec.format == "int4" else 1)
    vectors = n * (k // per_vector)
    int32_range("dequantize", vectors=vectors)

    def launcher(f: tuple[str, int]) -> Callable[[], None]:
        fn = loader.get_kernel("dequant", f[0], form_defines(spec, dtype, scale_numel, b, f))
        blocks = cdiv(vectors, THREADS * vectors_per_thread(b, f[1]))
        if f[0] == "pgk_dequant_loop":
            blocks = min(blocks, LOOP_BLOCKS_PER_SM * toolchain.sm_count())
        return lambda: fn.launch((blocks,), (THREADS,), args + (int(w_early),), 0, stream)

    key = (spec, dtype, n, k, b, scale_numel == 1)
    f = form or _chosen.get(key)
    if f is None and tune:
        if _captured(stream):
            # A compiled program's dry run (compile_ahead): ask for every form's kernel,
            # so the timing on the real first run finds them compiled.
            for other in FORMS:
                launcher(other)
        else:
            f = _chosen[key] = _fastest(launcher, stream)
    launcher(f or DEFAULT_FORM)()


def _captured(stream: Any) -> bool:
    """Whether `stream` (a native Stream; a handle or None is taken as not) is capturing."""
    return bool(getattr(stream, "is_capturing", lambda: False)())


def _fastest(launcher: Callable[[tuple[str, int]], Callable[[], None]], stream: Any
             ) -> tuple[str, int]:  # fmt: skip
    """The form of FORMS whose launches ran fastest (TUNE_REPS each after one to warm up,
    timed with events on `stream`)."""
    from pygpukit import _native

    best: tuple[float, tuple[str, int]] | None = None
    for f in FORMS:
        run = launcher(f)
        run()
        start, end = _native.Event(True), _native.Event(True)
        start.record(stream)
        for _ in range(TUNE_REPS):
            run()
        end.record(stream)
        end.synchronize()
        ms = start.elapsed_time(end)
        if best is None or ms < best[0]:
            best = (ms, f)
    assert best is not None
    return best[1]
