"""Weight-only quantized formats: what each stores and the float64 value it stands for.

A quantized weight of logical shape [N, K] (N outputs, K inputs, as a linear's weight) is
kept as a packed `data` array plus float32 `scale` (and for asymmetric int4 a `zero`):

    int8  data int8  [N, K]       scale [N]                    w = data * scale[n]
    fp8   data uint8 [N, K]       scale [] | [N] | [N/B, K/B]  w = e4m3(data) * scale
          (e4m3fn bit patterns; the block form, B = 128, is Hugging Face's fp8 layout
          with `weight_scale_inv`; partial edge blocks round the block count up)
    int4  data uint8 [N, K/2]     scale [N, K/G]               w = (q - zero) * scale
          (element k in byte k // 2, the low nibble for even k; groups of G along K;
          zero uint8 [N, K/G], or 8 for every group when symmetric)

This module owns the layouts and their shape rules; the loaders convert other packings
(AWQ, GPTQ, compressed-tensors) into these, and the kernels read exactly these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .shapes import ShapeRuleError

FORMATS = ("int8", "fp8", "int4")
FP8_BLOCK = 128
INT4_SYMMETRIC_ZERO = 8


@dataclass(frozen=True)
class QuantSpec:
    """A format and its grouping: `block` for fp8 block scales, `group` for int4."""

    format: str
    group: int = 0  # int4: K elements per scale
    block: int = 0  # fp8: 0 for per-tensor or per-channel scales, else the square block
    has_zero: bool = False  # int4 asymmetric

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ShapeRuleError(f"quantized weight: unknown format {self.format!r}")
        if self.format == "int4" and self.group <= 0:
            raise ShapeRuleError("quantized weight: int4 needs a positive group size")
        if self.has_zero and self.format != "int4":
            raise ShapeRuleError(f"quantized weight: {self.format} has no zero points")

    @property
    def attr(self) -> tuple[str, int, int, bool]:
        """The spec as a hashable node attr (a quantized linear's `quant`)."""
        return (self.format, self.group, self.block, self.has_zero)

    @classmethod
    def of_attr(cls, attr: Sequence[Any]) -> QuantSpec:
        """The spec a node attr made by `attr` stands for."""
        fmt, group, block, has_zero = attr
        return cls(str(fmt), int(group), int(block), bool(has_zero))

    @property
    def label(self) -> str:
        """A short name for printed graphs: int8, fp8, fp8 b128, int4 g128, int4 g128 asym."""
        if self.format == "int4":
            return f"int4 g{self.group}" + (" asym" if self.has_zero else "")
        return f"fp8 b{self.block}" if self.block else self.format

    @property
    def n_arrays(self) -> int:
        """The weight's arrays in a linear node: data, scale and (asymmetric int4) zero."""
        return 3 if self.has_zero else 2

    def data_shape(self, n: int, k: int) -> tuple[int, ...]:
        """The packed data's shape for a logical [n, k] weight."""
        return (n, k // 2) if self.format == "int4" else (n, k)

    def scale_shapes(self, n: int, k: int) -> tuple[tuple[int, ...], ...]:
        """The scale shapes this spec accepts for a logical [n, k] weight."""
        if self.format == "int8":
            return ((n,),)
        if self.format == "int4":
            return ((n, k // self.group),)
        if self.block:
            return ((-(-n // self.block), -(-k // self.block)),)
        return ((), (n,))

    def check(
        self, n: int, k: int, data: tuple[Sequence[int], str], scale: Sequence[int],
        zero: Sequence[int] | None,
    ) -> None:  # fmt: skip
        """ShapeRuleError unless data (shape, dtype name), scale and zero fit [n, k]."""
        want_dtype = "int8" if self.format == "int8" else "uint8"
        if self.format == "int4" and (k % 2 or k % self.group):
            raise ShapeRuleError(f"int4 weight: K={k} must be a multiple of the group {self.group}")
        if tuple(data[0]) != self.data_shape(n, k) or data[1] != want_dtype:
            raise ShapeRuleError(
                f"{self.format} weight [{n}, {k}]: data must be {want_dtype}"
                f"{list(self.data_shape(n, k))}, got {data[1]}{list(data[0])}"
            )
        if tuple(scale) not in self.scale_shapes(n, k):
            raise ShapeRuleError(
                f"{self.format} weight [{n}, {k}]: scale shape {list(scale)} is not one of "
                f"{[list(s) for s in self.scale_shapes(n, k)]}"
            )
        if self.has_zero != (zero is not None):
            raise ShapeRuleError(f"{self.format} weight: zero points given {zero is not None}, "
                                 f"spec says {self.has_zero}")  # fmt: skip
        if zero is not None and tuple(zero) != (n, k // self.group):
            want = [n, k // self.group]
            raise ShapeRuleError(f"int4 weight: zero shape {list(zero)} must be {want}")


def unpack_int4(data: np.ndarray) -> np.ndarray:
    """uint8 [N, K/2] -> the 4-bit values as uint8 [N, K] (low nibble first)."""
    out = np.empty((data.shape[0], data.shape[1] * 2), np.uint8)
    out[:, 0::2] = data & 0x0F
    out[:, 1::2] = data >> 4
    return out


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Values in [0, 15] as [N, K] (K even) -> uint8 [N, K/2] (low nibble first)."""
    q = np.asarray(q, np.uint8)
    packed: np.ndarray = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed


def dequantize(
    spec: QuantSpec, data: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, k: int
) -> np.ndarray:
    """The float64 [N, K] weight these arrays stand for (the reference every kernel meets)."""
    scale = np.asarray(scale, np.float64)
    n = data.shape[0]
    w: np.ndarray
    if spec.format == "int8":
        w = data.astype(np.float64) * scale[:, None]
        return w
    if spec.format == "fp8":
        w = data.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        if spec.block:
            b = spec.block
            full = np.repeat(np.repeat(scale, b, axis=0), b, axis=1)[:n, :k]
            w = w * full
            return w
        w = w * (scale[:, None] if scale.ndim == 1 else scale)
        return w
    q = unpack_int4(data).astype(np.float64)
    z = (np.asarray(zero, np.float64) if zero is not None
         else np.full(scale.shape, INT4_SYMMETRIC_ZERO, np.float64))  # fmt: skip
    g = spec.group
    w = (q - np.repeat(z, g, axis=1)) * np.repeat(scale, g, axis=1)
    return w
