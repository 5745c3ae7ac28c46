"""Launcher for dequant.cuh: a quantized weight (ir/quant.py's layouts) dequantized into a
dense [N, K] of float32, f16 or bf16, each element rounded once; the prefill GEMM's
scratch weight."""

from __future__ import annotations

from typing import Any

from pygpukit.ir.quant import FP8_BLOCK, QuantSpec

from . import gemv_quant, loader
from ._common import cdiv, int32_range, positive

THREADS = 256
# Bytes of W a thread loads before it converts any (2 or 4 vectors), with registers for
# BLOCKS_PER_SM blocks of THREADS. H200, the 7B linears: 16 bytes at 8 blocks ran int8 at
# 3.6-4.0 TB/s, int4 g128 3.1-3.7 (asymmetric 3.0-3.5) against a 4.05 TB/s copy; 32 bytes
# (int4 asymmetric: 51 registers, 5 blocks) 3.2-3.6, 3.0-3.6, 2.7-3.1 (docs/kernels.md).
BYTES_IN_FLIGHT = 16
BLOCKS_PER_SM = 8
DTYPES = ("float32", "float16", "bfloat16")
# Bytes of W one vector load takes, widest first.
VECTOR_BYTES = (8, 4)
# Bytes of output one vector may make: a warp's stores then cover one contiguous run.
MAX_STORE = 16


def vectors_per_thread(b: int) -> int:
    """Vectors of b bytes a thread loads at once (BYTES_IN_FLIGHT)."""
    return BYTES_IN_FLIGHT // b


def vector_defines(b: int) -> dict[str, int]:
    """The vector kernel's macros for vectors of b bytes of W."""
    return {"PGK_DQB": b, "PGK_DQU": vectors_per_thread(b), "PGK_DQMINB": BLOCKS_PER_SM}


def row_divider(d: int) -> tuple[int, int]:
    """(magic, shift) with i // d == (i * magic) >> (31 + shift) for every 0 <= i < 2^31
    (d >= 1; magic < 2^32): the kernel's row of vector i, one wide multiply. shift is
    ceil(log2 d) and magic ceil(2^(31 + shift) / d), so magic * d exceeds 2^(31 + shift)
    by less than d <= 2^shift (Granlund and Montgomery's condition)."""
    if d < 1:
        raise ValueError(f"row_divider: divisor {d} < 1")
    shift = (d - 1).bit_length()
    return -(-(1 << (31 + shift)) // d), shift


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


def dequantize(w: int, scale: int, out: int, spec: QuantSpec, n: int, k: int, dtype: str, *,
               scale_numel: int, zero: int = 0, stream: Any = None) -> None:  # fmt: skip
    """out [n, k] (dtype, dense) = the weight W's arrays stand for (data at w, float32
    scales at scale, scale_numel of them; int4 zero points at zero), rounded once."""
    loader.check_dtype(dtype, DTYPES, "dequantize")
    positive("dequantize", n=n, k=k)
    int32_range("dequantize", n=n, k=k)
    if n == 0 or k == 0:
        return
    row_bytes = k // 2 if spec.format == "int4" else k
    b = vector_bytes(spec, k, dtype, w, out)
    scale_ld = gemv_quant.scale_ld(spec, k)
    d = defines(spec, dtype, scale_numel)
    if b:
        per_vector = b * (2 if spec.format == "int4" else 1)
        vectors = n * (k // per_vector)
        int32_range("dequantize", vectors=vectors)
        u = vectors_per_thread(b)
        fn = loader.get_kernel("dequant", "pgk_dequant", {**d, **vector_defines(b)})
        magic, shift = row_divider(k // per_vector)
        fn.launch((cdiv(vectors, THREADS * u),), (THREADS,),
                  (w, scale, zero, out, n, k, row_bytes, scale_ld, magic, shift), 0,
                  stream)  # fmt: skip
        return
    fn = loader.get_kernel("dequant", "pgk_dequant_each", d)
    fn.launch((cdiv(n * k, THREADS),), (THREADS,), (w, scale, zero, out, n, k, row_bytes,
              scale_ld), 0, stream)  # fmt: skip
