"""Quantize-on-load: a float model's linear weights as QuantizedWeights (int8, fp8, int4).

`gpk.llm.load(path, quantize=...)` quantizes each linear weight (q/k/v, o, gate/up, down,
the LM head; never the embedding or the norms) on the host as it streams in from the
memory-mapped checkpoint, so the device only ever holds the quantized model.
`quantize_model` does the same to a Transformer already on the device, one weight at a
time, freeing each float weight once its quantized form is there: the device never holds
two copies of the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit import errors
from pygpukit.array import GPUArray
from pygpukit.ir.quant import FORMATS
from pygpukit.quant import QuantizedWeight, quantize

from .loader import LINEAR_KEYS, Checkpoint, check_float, is_linear_name
from .model import Transformer

DEFAULT_GROUP = 128


def check_quantize(format: object, group: object = DEFAULT_GROUP) -> str:
    """The quantize= argument checked: one of FORMATS (and a positive even int4 group);
    GPUKitValueError naming the bad value otherwise."""
    if not isinstance(format, str) or format not in FORMATS:
        raise errors.GPUKitValueError(
            f"quantize: {format!r} is not a weight format (one of {', '.join(FORMATS)})"
        )
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0 or group % 2:
        raise errors.GPUKitValueError(
            f"quantize: the int4 group must be a positive even integer, got {group!r}"
        )
    return format


def _check_group(format: str, group: int, k: int, what: str) -> None:
    if format == "int4" and k % group:
        raise errors.GPUKitValueError(
            f"quantize='int4': the group {group} does not divide K={k} of {what} "
            f"(pass a group that divides every linear's input size)"
        )


def _readonly(q: QuantizedWeight) -> QuantizedWeight:
    for a in (q.data, q.scale, q.zero):
        if a is not None:
            a.readonly = True
    return q


class QuantizeOnLoad:
    """A loader.LinearSource: every linear weight of a float checkpoint, quantized on the
    host as it is read (the float copy never reaches the device)."""

    tied_head = True  # a tied LM head becomes a quantized copy; the embedding stays float

    def __init__(self, format: str, group: int = DEFAULT_GROUP, symmetric: bool = True) -> None:
        self.format, self.group, self.symmetric = check_quantize(format, group), group, symmetric

    def owns(self, ckpt: Checkpoint, name: str) -> bool:
        return is_linear_name(name)

    def check(self, ckpt: Checkpoint, name: str, shape: tuple[int, int], source: str) -> None:
        check_float(ckpt, name, shape, source)
        _check_group(self.format, self.group, shape[1], f"tensor {name!r}")

    def nbytes(self, ckpt: Checkpoint, name: str) -> int:
        return ckpt.info(name).nbytes

    def load(
        self, ckpt: Checkpoint, names: Sequence[str], shapes: Sequence[tuple[int, int]]
    ) -> QuantizedWeight:
        # A tied head reads the embedding, which is checked as a float tensor, not here.
        _check_group(self.format, self.group, shapes[0][1], f"tensor {names[0]!r}")
        parts = [ckpt.numpy(n, s) for n, s in zip(names, shapes, strict=True)]
        w = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return _readonly(quantize(w, self.format, self.group, self.symmetric))


def _linear_keys(t: Transformer) -> list[str]:
    return [k for k in t.weights if k.split(".")[-1] in LINEAR_KEYS]


def quantize_model(
    transformer: Transformer, format: str, group: int = DEFAULT_GROUP, symmetric: bool = True
) -> Transformer:
    """Replace every linear weight of `transformer` (wqkv, wo, w_gate_up, w_down, lm_head;
    not the embedding or the norms) with `pygpukit.quant.quantize(w, format, group,
    symmetric)`, freeing each float weight (a tied LM head keeps the embedding). Do it
    before generating: a Generator made earlier captured the float weights."""
    check_quantize(format, group)
    w: dict[str, Any] = transformer.weights
    keys = _linear_keys(transformer)
    for key in keys:  # every check before the first change
        if isinstance(w[key], QuantizedWeight):
            raise errors.GPUKitValueError(f"quantize_model: {key} is already quantized")
        _check_group(format, group, w[key].shape[1], f"weight {key}")
    for key in keys:
        old: GPUArray = w[key]
        w[key] = _readonly(quantize(old, format, group, symmetric))
        if not any(v is old for v in w.values()):
            old.free()
    transformer.lm_head = w["lm_head"]
    for i, layer in enumerate(transformer.layers):
        layer.attn.wqkv, layer.attn.wo = w[f"{i}.wqkv"], w[f"{i}.wo"]
        layer.mlp.w_gate_up, layer.mlp.w_down = w[f"{i}.w_gate_up"], w[f"{i}.w_down"]
    return transformer


__all__ = ["DEFAULT_GROUP", "QuantizeOnLoad", "check_quantize", "quantize_model"]
