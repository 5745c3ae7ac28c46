"""NumPy reference of the FP8 GEMM's activation quantization (fp8_quant.cuh, written from its
rule, not its code): per group of 128 columns of a row, or per row, the scale is the
group's largest magnitude over 448 in float32 and each element is x * (448 / amax), rounded
in float32, then to e4m3 (nearest even); an all-zero group has scale 1. NaN stays NaN and
does not count toward the largest magnitude."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import pygpukit as gpk
from pygpukit.ir.quant import QuantSpec
from pygpukit.quant import QuantizedWeight

E4M3 = ml_dtypes.float8_e4m3fn


def fp8_activations(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(q as uint8 e4m3 bits [M, K], float32 scales [M, groups]) of x [M, K] (any float
    dtype); group 128 or 0 (one scale a row)."""
    xf = np.asarray(x).astype(np.float32)
    m, k = xf.shape
    width = group or k
    groups = -(-k // width)
    padded = np.zeros((m, groups * width), np.float32)
    padded[:, :k] = xf
    g = padded.reshape(m, groups, width)
    with np.errstate(invalid="ignore"):
        amax = np.nanmax(np.abs(g), axis=-1).astype(np.float32)
    amax = np.nan_to_num(amax, nan=0.0)
    zero = amax == 0
    inv = np.float32(448) / np.where(zero, np.float32(448), amax)
    inv = inv.astype(np.float32)
    scaled = (g * inv[..., None]).astype(np.float32).reshape(m, groups * width)[:, :k]
    q = scaled.astype(E4M3).view(np.uint8)
    scale = np.where(zero, np.float32(1), amax / np.float32(448)).astype(np.float32)
    return q, scale


def fp8_dequantized(x: np.ndarray, group: int) -> np.ndarray:
    """float64 [M, K]: x as the FP8 GEMM multiplies it (e4m3 values times their scales)."""
    q, scale = fp8_activations(x, group)
    m, k = q.shape
    width = group or k
    s = np.repeat(scale.astype(np.float64), width, axis=1)[:, :k]
    return q.view(E4M3).astype(np.float64) * s


def channel_fp8(w: np.ndarray) -> QuantizedWeight:
    """w [N, K] as FP8 with one scale a row (compressed-tensors' channel strategy; the
    quantizer makes per-tensor or block scales): each row's largest magnitude at 448."""
    scale = np.abs(w).max(axis=1) / 448.0
    data = (w / scale[:, None]).astype(E4M3).view(np.uint8)
    return QuantizedWeight(QuantSpec("fp8"), (w.shape[0], w.shape[1]), gpk.from_numpy(data),
                           gpk.from_numpy(scale.astype(np.float32)))  # fmt: skip
