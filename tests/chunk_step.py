"""A prefill chunk's attention half as the LLM model writes it (q, k and v cut from one QKV
projection, rope on q and k, the chunk's keys and values stored into the static caches at
a device position, attention over the cache), and its float64 reference: shared by the
CPU and GPU tests of the rope_kv_write fusion."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import passes_util
from attention_ref import sdpa_ref

import pygpukit as gpk


@dataclass
class ChunkCase:
    batch: int = 2
    heads: int = 4
    kv_heads: int = 2
    chunk: int = 8
    max_seq: int = 32
    head_dim: int = 16
    dtype: str = "float32"
    interleaved: bool = False
    tables: str | None = None  # the cos/sin dtype (None: dtype)

    def host(self, a: np.ndarray, dtype: str | None = None) -> np.ndarray:
        d = dtype or self.dtype
        return a.astype(ml_dtypes.bfloat16 if d == "bfloat16" else d)


class ChunkStep:
    """Captured caches [B, KV, S, D] and step(qkv, cos, sin, pos, start) -> attention
    [B, T, H * D], compiled unless told otherwise."""

    def __init__(self, case: ChunkCase, rng: np.random.Generator, compiled: bool = True) -> None:
        self.case, self.rng = case, rng
        c = case
        shape = (c.batch, c.kv_heads, c.max_seq, c.head_dim)
        self.cache_k = gpk.from_numpy(c.host(rng.standard_normal(shape)))
        self.cache_v = gpk.from_numpy(c.host(rng.standard_normal(shape)))
        # The reference starts from what the caches hold (rounded to the dtype).
        self.k_ref = self.cache_k.to_numpy().astype(np.float64)
        self.v_ref = self.cache_v.to_numpy().astype(np.float64)
        self.fn = gpk.compile(self.step) if compiled else self.step

    def step(self, qkv: Any, cos: Any, sin: Any, pos: Any, start: Any) -> Any:
        c = self.case
        b, t, _ = qkv.shape
        hq, hk, d = c.heads * c.head_dim, c.kv_heads * c.head_dim, c.head_dim
        q = qkv[:, :, :hq].reshape(b, t, c.heads, d)
        k = qkv[:, :, hq : hq + hk].reshape(b, t, c.kv_heads, d)
        v = qkv[:, :, hq + hk :].reshape(b, t, c.kv_heads, d)
        q = gpk.nn.rope(q.swapaxes(1, 2), cos, sin, interleaved=c.interleaved)
        k = gpk.nn.rope(k.swapaxes(1, 2), cos, sin, interleaved=c.interleaved)
        rows = gpk.dynamic_slice(pos, t)
        self.cache_k[:, :, rows] = k
        self.cache_v[:, :, rows] = v.swapaxes(1, 2)
        o = gpk.nn.scaled_dot_product_attention(q, self.cache_k, self.cache_v, is_causal=True,
                                                kv_len=pos + t, kv_start=start)  # fmt: skip
        return o.swapaxes(1, 2).reshape(b, t, hq)

    def inputs(self, pos: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Fresh random qkv, the chunk's table rows and left-padding starts."""
        c, rng = self.case, self.rng
        width = (c.heads + 2 * c.kv_heads) * c.head_dim
        qkv = c.host(rng.standard_normal((c.batch, c.chunk, width)))
        ang = rng.uniform(0, 2 * math.pi, (c.chunk, c.head_dim // 2))
        cos, sin = c.host(np.cos(ang), c.tables), c.host(np.sin(ang), c.tables)
        start = rng.integers(0, min(pos, 4) + 1, size=c.batch).astype(np.int64)
        return [qkv, cos, sin], start

    def __call__(self, arrays: list[np.ndarray], pos: int, start: np.ndarray) -> np.ndarray:
        dev = [gpk.from_numpy(a) for a in arrays]
        return self.fn(*dev, gpk.scalar(pos), gpk.from_numpy(start)).to_numpy()

    def reference(self, arrays: list[np.ndarray], pos: int, start: np.ndarray) -> np.ndarray:
        """float64: the rotated keys and the values stored at pos.., then causal attention
        over the cache up to pos + T (the caches' reference copies are updated)."""
        c = self.case
        qkv, cos, sin = (a.astype(np.float64) for a in arrays)
        b, t, _ = qkv.shape
        hq, hk, d = c.heads * c.head_dim, c.kv_heads * c.head_dim, c.head_dim

        def heads(x: np.ndarray, n: int) -> np.ndarray:
            return x.reshape(b, t, n, d).swapaxes(1, 2)

        q = passes_util.rope64(heads(qkv[..., :hq], c.heads), cos, sin, c.interleaved)
        k = passes_util.rope64(heads(qkv[..., hq : hq + hk], c.kv_heads), cos, sin,
                               c.interleaved)  # fmt: skip
        # The caches hold the stored rows in their dtype (bf16: rounded once).
        self.k_ref[:, :, pos : pos + t] = c.host(k).astype(np.float64)
        self.v_ref[:, :, pos : pos + t] = heads(qkv[..., hq + hk :], c.kv_heads)
        o = sdpa_ref(q, self.k_ref, self.v_ref, causal=True, kv_len=pos + t, kv_start=start)
        return o.swapaxes(1, 2).reshape(b, t, hq)

    def program_ops(self) -> list[str]:
        """The ops of the compiled step's fused program (its last trace)."""
        entry = list(self.fn._cache.values())[-1]  # type: ignore[attr-defined]
        return [n.op for n in entry.program.schedule.graph.nodes if n.op != "input"]
