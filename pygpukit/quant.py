"""Quantized weights on the device and the host quantizers that make them.

`QuantizedWeight` is what `gpk.nn.linear` takes in place of a float weight [N, K]: the
packed arrays of one of the formats of `pygpukit.ir.quant` (the layouts and the float64
reference live there). `quantize` makes one from a float weight on the host, as
quantize-on-load does.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from pygpukit import errors
from pygpukit.ir.quant import FP8_BLOCK, INT4_SYMMETRIC_ZERO, QuantSpec, dequantize, pack_int4
from pygpukit.ir.shapes import ShapeRuleError

from .array import GPUArray
from .creation import from_numpy

FP8_MAX = 448.0  # the largest finite e4m3fn value


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight of logical shape (n, k) stored as `data`, `scale` and optional `zero`."""

    spec: QuantSpec
    shape: tuple[int, int]
    data: GPUArray
    scale: GPUArray
    zero: GPUArray | None = None

    def __post_init__(self) -> None:
        n, k = self.shape
        zero = None if self.zero is None else self.zero.shape
        try:
            self.spec.check(n, k, (self.data.shape, self.data.dtype.name), self.scale.shape,
                            zero)  # fmt: skip
        except ShapeRuleError as e:
            raise errors.user_error(errors.ShapeError, "QuantizedWeight", str(e)) from None

    @property
    def nbytes(self) -> int:
        """Bytes read to use the weight once: data, scales and zero points."""
        return sum(a.nbytes for a in (self.data, self.scale, self.zero) if a is not None)

    def dequantize(self) -> np.ndarray:
        """The float64 weight [n, k] it stands for (copies to the host)."""
        zero = None if self.zero is None else self.zero.to_numpy()
        return dequantize(self.spec, self.data.to_numpy(), self.scale.to_numpy(), zero,
                          self.shape[1])  # fmt: skip


def quantize_host(
    w: np.ndarray, format: str, group: int = 128, symmetric: bool = True, block: int = 0
) -> tuple[QuantSpec, np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantize a float weight [N, K] on the host: (spec, data, scale, zero), round to
    nearest. int8 and int4 symmetric scale by the absolute maximum (of a row, of a group);
    int4 asymmetric maps each group's [min, max] onto [0, 15]; fp8 scales so the largest
    magnitude (of the tensor, or of each block when block > 0) is 448."""
    w = np.asarray(w, np.float64)
    n, k = w.shape
    if format == "int8":
        scale = np.abs(w).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        data = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        return QuantSpec("int8"), data, scale.astype(np.float32), None
    if format == "fp8":
        spec = QuantSpec("fp8", block=block)
        if block:
            nb, kb = -(-n // block), -(-k // block)
            padded = np.zeros((nb * block, kb * block))
            padded[:n, :k] = np.abs(w)
            amax = padded.reshape(nb, block, kb, block).max(axis=(1, 3))
            scale = np.where(amax == 0, 1.0, amax / FP8_MAX)
            full = np.repeat(np.repeat(scale, block, 0), block, 1)[:n, :k]
        else:
            amax = np.abs(w).max()
            scale = np.asarray(amax / FP8_MAX if amax else 1.0)
            full = scale
        data = (w / full).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        return spec, data, scale.astype(np.float32), None
    if format == "int4":
        spec = QuantSpec("int4", group=group, has_zero=not symmetric)
        if k % group or k % 2:
            spec.check(n, k, ((n, k // 2), "uint8"), (n, k // group), None)  # raises
        g = w.reshape(n, k // group, group)
        if symmetric:
            scale = np.abs(g).max(axis=2) / 7.0
            scale[scale == 0] = 1.0
            q = np.clip(np.rint(g / scale[..., None]), -8, 7) + INT4_SYMMETRIC_ZERO
            zero = None
        else:
            lo, hi = g.min(axis=2), g.max(axis=2)
            scale = (hi - lo) / 15.0
            scale[scale == 0] = 1.0
            z = np.clip(np.rint(-lo / scale), 0, 15)
            q = np.clip(np.rint(g / scale[..., None]) + z[..., None], 0, 15)
            zero = z.astype(np.uint8)
        data = pack_int4(q.reshape(n, k).astype(np.uint8))
        return spec, data, scale.astype(np.float32), zero
    raise ValueError(f"quantize: unknown format {format!r} (int8, fp8, int4)")


def quantize(
    w: np.ndarray | GPUArray, format: str, group: int = 128, symmetric: bool = True,
    block: int = FP8_BLOCK,
) -> QuantizedWeight:  # fmt: skip
    """A QuantizedWeight of the float weight w [N, K] (quantized on the host). `block`
    applies to fp8 (0 for one per-tensor scale); `group` and `symmetric` to int4."""
    host = w.to_numpy() if isinstance(w, GPUArray) else np.asarray(w)
    if host.ndim != 2:
        shape = list(host.shape)
        raise errors.user_error(errors.ShapeError, "quantize", f"w must be 2-D [N, K], got {shape}")
    try:
        fp8_block = block if format == "fp8" else 0
        spec, data, scale, zero = quantize_host(host.astype(np.float64), format, group,
                                                symmetric, fp8_block)  # fmt: skip
    except ShapeRuleError as e:
        raise errors.user_error(errors.ShapeError, "quantize", str(e)) from None
    except ValueError as e:
        raise errors.user_error(errors.GPUKitValueError, "quantize", str(e)) from None
    return QuantizedWeight(
        spec, (host.shape[0], host.shape[1]), from_numpy(data), from_numpy(scale),
        None if zero is None else from_numpy(zero),
    )  # fmt: skip


__all__ = ["QuantizedWeight", "quantize", "quantize_host"]
