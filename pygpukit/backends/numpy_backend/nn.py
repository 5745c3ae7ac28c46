"""References of the fused neural-network kernels (softmax, norms, rope, attention)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.reference import sigmoid

from .compute import down, up


def softmax(x: np.ndarray, attrs: dict[str, Any], dtype: DType, log: bool) -> np.ndarray:
    xf = up(x)
    axis = attrs["axis"]
    m = np.max(xf, axis=axis, keepdims=True)
    z = xf - m
    with np.errstate(all="ignore"):
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        r = z - np.log(s) if log else np.exp(z) / s
    return down(r, dtype)


def rms_norm(x: np.ndarray, w: np.ndarray, attrs: dict[str, Any], dtype: DType,
             residual: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """x * rsqrt(mean(x*x) + eps) * w; with a residual, of x + residual rounded to x's dtype
    first (what the unfused add gives, and what pgk_rms_norm_add computes)."""
    if residual is not None:
        x = np.asarray(up(x) + up(residual)).astype(x.dtype)
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
    """Attention as the float64 reference defines it: masked keys (past kv_len, before
    kv_start, causal, outside the sliding window) are absent, so what they hold never
    reaches the result; NaN or inf in a visible q, k or v element, or a NaN scale,
    propagates; a query that sees no key gets zeros. Bad lengths raise (kv_len in [0, seq],
    kv_start in [0, seq])."""
    q, k, v = (up(i) for i in ins[:3])
    extra = list(ins[3:])
    sk = k.shape[-2]
    kv_len = int(extra.pop(0)) if attrs.get("kv_len") else sk
    kv_start = extra.pop(0).astype(np.int64) if attrs.get("kv_start") else None
    if not 0 <= kv_len <= sk:
        raise ValueError(f"kv_len {kv_len} is outside [0, {sk}] (the key length)")
    if (
        kv_start is not None
        and kv_start.size
        and not (0 <= kv_start.min() and kv_start.max() <= sk)
    ):
        raise ValueError(f"kv_start {kv_start.tolist()} is outside [0, {sk}] (the key length)")
    groups = q.shape[-3] // k.shape[-3]
    if groups > 1:
        k = np.repeat(k, groups, axis=-3)
        v = np.repeat(v, groups, axis=-3)
    scale = attrs.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    with np.errstate(all="ignore"):
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
    sq = s.shape[-2]
    key = np.arange(sk)[None, :]
    mask = np.broadcast_to(key >= kv_len, (sq, sk))
    if attrs.get("causal"):
        # Bottom-right aligned at kv_len, so a decode query (sq=1) sees the filled cache.
        mask = mask | (key > (np.arange(sq)[:, None] + (kv_len - sq)))
    window = attrs.get("window")
    if window is not None:
        # Sliding window at the causal alignment: key j is hidden once j <= pos - window.
        mask = mask | (key <= (np.arange(sq)[:, None] + (kv_len - sq - window)))
    if kv_start is not None:
        starts = kv_start.reshape((-1,) + (1,) * (s.ndim - 1))
        mask = mask | (np.arange(sk) < starts)
    mask = np.broadcast_to(mask, s.shape)
    empty = mask.all(axis=-1, keepdims=True)  # rows that see no key
    s = np.where(mask, -np.inf, s)
    m = np.max(s, axis=-1, keepdims=True)  # NaN in a visible score makes its row NaN
    with np.errstate(all="ignore"):
        p = np.exp(s - np.where(empty, 0.0, m))
        p = p / np.sum(p, axis=-1, keepdims=True)
        if np.isfinite(v).all():
            out = np.matmul(p, v)
        else:  # sum only the visible keys' p * v, so a masked key's NaN/inf stays out
            out = np.where(mask[..., None], 0.0, p[..., None] * v[..., None, :, :]).sum(-2)
    out = np.where(empty, 0.0, out)
    if attrs.get("seq_major"):  # [..., seq, heads, dim] (ir/ops.py: sdpa)
        out = np.ascontiguousarray(np.swapaxes(out, -3, -2))
    return down(out, dtype)


def sdpa_append(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """Store this step's rotated key and its value into the caches (their own memory) at
    pos, then attend with the rotated query (ir/ops.py: sdpa_append)."""
    from .movement import check_dynamic

    q, k_cache, v_cache, k_new, v_new, pos = ins[:6]
    layout = attrs.get("rope", "none")
    n_rope = 0 if layout == "none" else 2
    if n_rope:
        half = q.shape[-1] // 2
        cos, sin = (t.reshape(1, half) for t in ins[6:8])
        q = rope([q, cos, sin], {"layout": layout}, dtype)
        k_new = rope([k_new, cos, sin], {"layout": layout}, dtype)
    (p,) = check_dynamic((("dyn", 0),), (k_cache.shape[2],), [int(pos)])
    k_cache[:, :, p] = k_new[:, :, 0]
    v_cache[:, :, p] = v_new[:, :, 0]
    return sdpa([q, k_cache, v_cache, *ins[6 + n_rope :]], attrs, dtype)


def rope_kv_write(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """Rotate x's q and k heads, store the rotated keys and the values into the caches
    (their own memory) at pos..pos+T-1; the rotated query heads are the result
    (ir/ops.py: rope_kv_write)."""
    from .movement import check_dynamic

    x, cos, sin, k_cache, v_cache, v, pos = ins
    hq, t = attrs["q_heads"], x.shape[2]
    rot = rope([x, cos, sin], {"layout": attrs["layout"]}, dtype)
    (p,) = check_dynamic((("dslice", 0, t),), (k_cache.shape[2],), [int(pos)])
    k_cache[:, :, p : p + t] = rot[:, hq:]
    v_cache[:, :, p : p + t] = v
    return np.ascontiguousarray(rot[:, :hq])


def swiglu(gate: np.ndarray, up_: np.ndarray, dtype: DType) -> np.ndarray:
    g = up(gate)
    return down(g * sigmoid(g) * up(up_), dtype)
