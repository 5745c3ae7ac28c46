"""A float64 reference of gpk.nn.scaled_dot_product_attention: masked keys (past kv_len,
before kv_start, causal, outside the sliding window) are absent, so what they hold never
reaches the result; NaN or inf in a visible element propagates as plain float64 arithmetic
gives it; a query that sees no key gets zeros. The scale is rounded to float32, as the
kernels take it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from helpers import rand
from hypothesis import strategies as st


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


@st.composite
def sdpa_cases(draw: Any, *, batch: int, queries: tuple[int, int], keys: int,
               head_dims: tuple[int, ...]) -> dict[str, Any]:  # fmt: skip
    """A random prefill attention case: 1..batch rows, GQA groups of 1, 2 or 4 over 1, 2 or
    4 KV heads, queries in the `queries` range and up to `keys` keys (at least as many as
    queries), a head dim of `head_dims`, bf16 or f16, causal or not, and each of kv_len,
    kv_start and the window drawn or left out."""
    b = draw(st.integers(1, batch))
    kvh = draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from([1, 2, 4]))
    sq = draw(st.integers(*queries))
    sk = draw(st.integers(sq, keys))
    case = {"b": b, "h": kvh * g, "kvh": kvh, "sq": sq, "sk": sk,
            "d": draw(st.sampled_from(head_dims)),
            "dtype": draw(st.sampled_from(["bfloat16", "float16"])),
            "causal": draw(st.booleans()), "kv_len": None, "kv_start": None, "window": None,
            "seed": draw(st.integers(0, 2**31))}  # fmt: skip
    if draw(st.booleans()):
        case["kv_len"] = draw(st.integers(0, sk))
    if draw(st.booleans()):
        case["kv_start"] = [draw(st.integers(0, sk)) for _ in range(b)]
    if draw(st.booleans()):
        case["window"] = draw(st.integers(1, sk + 4))
    return case


def sdpa_case_inputs(c: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 dict[str, Any]]:  # fmt: skip
    """q, k, v of a sdpa_cases case (random, from its seed) and its mask arguments."""
    rng = np.random.default_rng(c["seed"])
    q = rand(rng, (c["b"], c["h"], c["sq"], c["d"]), c["dtype"])
    k = rand(rng, (c["b"], c["kvh"], c["sk"], c["d"]), c["dtype"])
    v = rand(rng, (c["b"], c["kvh"], c["sk"], c["d"]), c["dtype"])
    return q, k, v, {n: c[n] for n in ("causal", "kv_len", "kv_start", "window")}


def paged_sdpa_ref(q: Any, k_pool: Any, v_pool: Any, table: Any, lens: Any) -> np.ndarray:
    """float64 paged attention: row r's keys and values gathered position by position
    from the [blocks, kv_heads, block, dim] pools through its block table, lens[r] of
    them; query i of T sees positions up to lens[r] - T + i (causal, bottom-right);
    grouped-query heads share their KV head; a query that sees no key gets zeros."""
    b, h, t, d = q.shape
    kv, bs = k_pool.shape[1], k_pool.shape[2]
    out = np.zeros((b, h, t, d))
    for r in range(b):
        n = int(lens[r])
        keys = np.array([k_pool[table[r, p // bs], :, p % bs] for p in range(n)], np.float64)
        vals = np.array([v_pool[table[r, p // bs], :, p % bs] for p in range(n)], np.float64)
        for head in range(h):
            g = head // (h // kv)
            for i in range(t):
                last = n - t + i
                if last < 0:
                    continue
                s = keys[: last + 1, g] @ q[r, head, i].astype(np.float64) / math.sqrt(d)
                p = np.exp(s - s.max())
                out[r, head, i] = (p / p.sum()) @ vals[: last + 1, g]
    return out
