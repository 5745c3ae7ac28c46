"""The quant benches' weights, quantized on the GPU with torch: quantize_host's formulas
(pygpukit.quant: int8 and symmetric int4 scaled by the absolute maximum of a row or group,
asymmetric int4 mapping each group's [min, max] onto [0, 15], fp8 scaled so the largest
magnitude of the tensor or of each block is 448) in float32 on the device, so the
Llama-2-7B shapes quantize in milliseconds instead of the host's seconds; and the float64
weight such arrays stand for (ir/quant.py's dequantize), on the device, for the benches'
checks. The layouts are ir/quant.py's."""

from __future__ import annotations

from typing import Any

from pygpukit.ir.quant import FP8_BLOCK, INT4_SYMMETRIC_ZERO, QuantSpec

FP8_MAX = 448.0


def quantize(torch: Any, w: Any, fmt: str, group: int = 128, symmetric: bool = True,
             block: int = FP8_BLOCK) -> tuple[QuantSpec, list[Any]]:  # fmt: skip
    """(spec, [data, scale(, zero)]) of the float CUDA tensor w [N, K] as contiguous CUDA
    tensors; `block` applies to fp8 (0: one scale for the tensor), group and symmetric to
    int4."""
    wf = w.float()
    n, k = wf.shape
    if fmt == "int8":
        scale = wf.abs().amax(dim=1) / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        data = torch.round(wf / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return QuantSpec("int8"), [data.contiguous(), scale.contiguous()]
    if fmt == "fp8":
        if block:
            nb, kb = -(-n // block), -(-k // block)
            padded = torch.zeros(nb * block, kb * block, device=wf.device)
            padded[:n, :k] = wf.abs()
            amax = padded.reshape(nb, block, kb, block).amax(dim=(1, 3))
            scale = torch.where(amax == 0, torch.ones_like(amax), amax / FP8_MAX)
            full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
        else:
            amax = wf.abs().amax()
            scale = torch.where(amax == 0, torch.ones_like(amax), amax / FP8_MAX)
            full = scale
        data = (wf / full).to(torch.float8_e4m3fn).view(torch.uint8)
        return QuantSpec("fp8", block=block), [data.contiguous(), scale.contiguous()]
    if fmt != "int4":
        raise ValueError(f"quantize: unknown format {fmt!r} (int8, fp8, int4)")
    g = wf.reshape(n, k // group, group)
    zero = None
    if symmetric:
        scale = g.abs().amax(dim=2) / 7.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.round(g / scale[..., None]).clamp(-8, 7) + INT4_SYMMETRIC_ZERO
    else:
        lo, hi = g.amin(dim=2), g.amax(dim=2)
        scale = (hi - lo) / 15.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        z = torch.round(-lo / scale).clamp(0, 15)
        q = (torch.round(g / scale[..., None]) + z[..., None]).clamp(0, 15)
        zero = z.to(torch.uint8).contiguous()
    q = q.reshape(n, k).to(torch.uint8)
    data = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    spec = QuantSpec("int4", group=group, has_zero=not symmetric)
    return spec, [data, scale.contiguous()] + ([zero] if zero is not None else [])


def dequantize(torch: Any, spec: QuantSpec, arrays: list[Any], k: int) -> Any:
    """The float64 CUDA tensor [N, K] that quantize's arrays stand for."""
    data, scale = arrays[0], arrays[1].double()
    n = data.shape[0]
    if spec.format == "int8":
        return data.double() * scale[:, None]
    if spec.format == "fp8":
        w = data.view(torch.float8_e4m3fn).float().double()
        if spec.block:
            b = spec.block
            return w * scale.repeat_interleave(b, 0).repeat_interleave(b, 1)[:n, :k]
        return w * (scale[:, None] if scale.ndim == 1 else scale)
    q = torch.stack((data & 15, data >> 4), dim=-1).reshape(n, k).double()
    zero = arrays[2].double() if len(arrays) > 2 else torch.full_like(scale, INT4_SYMMETRIC_ZERO)
    g = spec.group
    return (q - zero.repeat_interleave(g, 1)) * scale.repeat_interleave(g, 1)
