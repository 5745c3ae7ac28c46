"""A decode step as the LLM model writes it (rope on q and k, the new row stored into the
static caches at a device position, grouped-query attention over the masked cache), and
its float64 reference: shared by the CPU and GPU tests of the sdpa_append fusion."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import passes_util

import pygpukit as gpk
from pygpukit.llm.model import attention, decode_mask


@dataclass
class StepCase:
    batch: int = 2
    heads: int = 8
    kv_heads: int = 2
    max_seq: int = 32
    head_dim: int = 16
    dtype: str = "float32"
    layout: str = "half"  # "half", "interleaved" or "none" (no rope)

    def host(self, a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16 if self.dtype == "bfloat16" else self.dtype)


def rope64(x: np.ndarray, c: np.ndarray, s: np.ndarray, layout: str) -> np.ndarray:
    return x if layout == "none" else passes_util.rope64(x, c, s, layout == "interleaved")


class DecodeStep:
    """Captured caches [B, KV, S, D] and a compiled step(q, k, v, cos, sin, pos, start)."""

    def __init__(self, case: StepCase, rng: np.random.Generator, compiled: bool = True) -> None:
        self.case, self.rng = case, rng
        c = case
        shape = (c.batch, c.kv_heads, c.max_seq, c.head_dim)
        self.k_host = rng.standard_normal(shape)
        self.v_host = rng.standard_normal(shape)
        self.cache_k = gpk.from_numpy(c.host(self.k_host))
        self.cache_v = gpk.from_numpy(c.host(self.v_host))
        # The reference starts from what the caches hold (rounded to the dtype).
        self.k_ref = self.cache_k.to_numpy().astype(np.float64)
        self.v_ref = self.cache_v.to_numpy().astype(np.float64)
        self.fn = gpk.compile(self._step) if compiled else self._step

    def _step(self, q: Any, k: Any, v: Any, cos: Any, sin: Any, pos: Any, start: Any) -> Any:
        c = self.case
        if c.layout != "none":
            inter = c.layout == "interleaved"
            q = gpk.nn.rope(q, cos, sin, interleaved=inter)
            k = gpk.nn.rope(k, cos, sin, interleaved=inter)
        self.cache_k[:, :, pos] = k[:, :, 0]
        self.cache_v[:, :, pos] = v[:, :, 0]
        return attention(q, self.cache_k, self.cache_v, decode_mask(start, pos, c.max_seq))

    def inputs(self, pos: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Fresh random q, k, v, a table row, the position and left-padding starts."""
        c, rng = self.case, self.rng
        q = c.host(rng.standard_normal((c.batch, c.heads, 1, c.head_dim)))
        k = c.host(rng.standard_normal((c.batch, c.kv_heads, 1, c.head_dim)))
        v = c.host(rng.standard_normal((c.batch, c.kv_heads, 1, c.head_dim)))
        ang = rng.uniform(0, 2 * math.pi, (1, c.head_dim // 2))
        cos, sin = c.host(np.cos(ang)), c.host(np.sin(ang))
        start = rng.integers(0, min(pos, 4) + 1, size=c.batch).astype(np.int64)
        return [q, k, v, cos, sin], start

    def __call__(self, arrays: list[np.ndarray], pos: int, start: np.ndarray) -> np.ndarray:
        dev = [gpk.from_numpy(a) for a in arrays]
        out = self.fn(*dev, gpk.scalar(pos), gpk.from_numpy(start))
        return out.to_numpy()

    def reference(self, arrays: list[np.ndarray], pos: int, start: np.ndarray) -> np.ndarray:
        """float64: the rotated row stored at pos, then masked grouped-query attention."""
        c = self.case
        q, k, v, cos, sin = (a.astype(np.float64) for a in arrays)
        q, k = rope64(q, cos, sin, c.layout), rope64(k, cos, sin, c.layout)
        self.k_ref[:, :, pos] = k[:, :, 0]
        self.v_ref[:, :, pos] = v[:, :, 0]
        g = c.heads // c.kv_heads
        kk, vv = np.repeat(self.k_ref, g, 1), np.repeat(self.v_ref, g, 1)
        s = q @ np.swapaxes(kk, -1, -2) / math.sqrt(c.head_dim)
        j = np.arange(c.max_seq)
        hidden = (j[None, :] > pos) | (j[None, :] < start[:, None])
        s = np.where(hidden[:, None, None, :], -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ vv

    def program_ops(self) -> list[str]:
        """The ops of the compiled step's fused graph (its last cache entry)."""
        entry = list(self.fn._cache.values())[-1]  # type: ignore[union-attr]
        return [n.op for n in entry.program.schedule.graph.nodes if n.op != "input"]
