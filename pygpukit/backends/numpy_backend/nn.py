"""References of the fused neural-network kernels (softmax, norms, rope, attention)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.ir import DType

from .compute import down, up
from .elementwise import sigmoid


def softmax(x: np.ndarray, attrs: dict[str, Any], dtype: DType, log: bool) -> np.ndarray:
    xf = up(x)
    axis = attrs["axis"]
    m = np.max(xf, axis=axis, keepdims=True)
    z = xf - m
    with np.errstate(all="ignore"):
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        r = z - np.log(s) if log else np.exp(z) / s
    return down(r, dtype)


def rms_norm(x: np.ndarray, w: np.ndarray, attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    xf = up(x)
    r = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + np.float32(attrs["eps"]))
    return down(r * up(w), dtype)


def layer_norm(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    x, w, b = (up(i) for i in ins)
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return down((x - mu) / np.sqrt(var + np.float32(attrs["eps"])) * w + b, dtype)


def rope(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    x, cos, sin = (up(i) for i in ins)
    if attrs["layout"] == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
    else:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return down(out, dtype)


def sdpa(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    q, k, v = (up(i) for i in ins)
    groups = q.shape[-3] // k.shape[-3]
    if groups > 1:
        k = np.repeat(k, groups, axis=-3)
        v = np.repeat(v, groups, axis=-3)
    scale = attrs.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
    if attrs.get("causal"):
        sq, sk = s.shape[-2], s.shape[-1]
        # Bottom-right aligned, so a decode query (sq=1) sees the whole cache.
        mask = np.arange(sk)[None, :] > (np.arange(sq)[:, None] + (sk - sq))
        s = np.where(mask, -np.inf, s)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.exp(s - m)
    p = p / np.sum(p, axis=-1, keepdims=True)
    return down(np.matmul(p, v), dtype)


def swiglu(gate: np.ndarray, up_: np.ndarray, dtype: DType) -> np.ndarray:
    g = up(gate)
    return down(g * sigmoid(g) * up(up_), dtype)
