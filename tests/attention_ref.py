"""A float64 reference of gpk.nn.scaled_dot_product_attention: masked keys (past kv_len,
before kv_start, causal, outside the sliding window) are absent, so what they hold never
reaches the result; NaN or inf in a visible element propagates as plain float64 arithmetic
gives it; a query that sees no key gets zeros. The scale is rounded to float32, as the
kernels take it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def sdpa_ref(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
             kv_len: Any = None, kv_start: Any = None,
             window: int | None = None) -> np.ndarray:  # fmt: skip
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, -3), np.repeat(v, g, -3)
    sc = float(np.float32(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale))
    with np.errstate(all="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * sc
    sq, sk = s.shape[-2:]
    n = sk if kv_len is None else int(kv_len)
    key = np.arange(sk)
    mask = np.broadcast_to(key[None, :] >= n, (sq, sk))
    if causal:
        mask = mask | (key[None, :] > np.arange(sq)[:, None] + n - sq)
    if window is not None:  # query i at key position i + n - sq sees keys j > pos - window
        mask = mask | (key[None, :] <= np.arange(sq)[:, None] + n - sq - window)
    if kv_start is not None:
        st = np.asarray(kv_start).reshape((-1,) + (1,) * (s.ndim - 1))
        mask = mask | (key < st)
    mask = np.broadcast_to(mask, s.shape)
    visible = ~mask
    empty = ~visible.any(-1, keepdims=True)
    with np.errstate(all="ignore"):
        m = np.max(s, axis=-1, where=visible, initial=-np.inf, keepdims=True)
        p = np.where(visible, np.exp(s - m), 0.0)
        terms = np.where(visible[..., None], p[..., None] * v[..., None, :, :], 0.0)
        out = terms.sum(-2) / p.sum(-1, keepdims=True)
    return np.where(empty, 0.0, out)
