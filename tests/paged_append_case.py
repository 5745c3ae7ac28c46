"""A decode-only serving step's paged store and attention, compiled over a captured pool
(fuse_paged_append's form), and its float64 reference: shared by the host test
(test_passes_paged_append.py) and the GPU one (gpu/test_paged_attention_gpu.py)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from attention_ref import paged_sdpa_ref

import pygpukit as gpk

NP = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _rot(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split rotation in float64 of x [..., D] by tables [..., D/2]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


class AppendStep:
    """B rows of one query (decode rows; lens 0 with slot -1: padding) over a pool
    [nb, 2 KV, bs, D]; slots[b] where row b's new key / value go (by default the slot of
    its position lens[b] - 1)."""

    def __init__(self, rng: np.random.Generator, dtype: str, h: int, kv: int, d: int,
                 bs: int, m: int, nb: int, lens: list[int],
                 slots: list[int] | None = None) -> None:  # fmt: skip
        self.dtype, self.h, self.kv, self.d = dtype, h, kv, d
        b = len(lens)
        np_t = NP[dtype]
        self.pool_np = rng.standard_normal((nb, 2 * kv, bs, d)).astype(np_t)
        self.pool = gpk.from_numpy(self.pool_np.copy())
        self.table = rng.permutation(nb)[: b * m].reshape(b, m).astype(np.int32)
        self.lens = np.array(lens, np.int32)
        if slots is None:
            slots = [int(self.table[r, (n - 1) // bs]) * bs + (n - 1) % bs if n else -1
                     for r, n in enumerate(lens)]  # fmt: skip
        self.slots = np.array(slots, np.int32)
        self.q = rng.standard_normal((b, h, 1, d)).astype(np_t)
        self.new = rng.standard_normal((b, 2 * kv, d)).astype(np_t)
        ang = rng.uniform(0, 6.3, (b, d // 2))
        self.cos, self.sin = np.cos(ang).astype(np_t), np.sin(ang).astype(np_t)
        pool, kvh = self.pool, kv

        def step(q: Any, new: Any, slots: Any, table: Any, lens: Any, cos: Any,
                 sin: Any) -> Any:  # fmt: skip
            gpk.nn.paged_write(pool, new, slots, cos=cos, sin=sin, rope_heads=kvh)
            return gpk.nn.paged_attention(q, pool[:, :kvh], pool[:, kvh:], table, lens,
                                          pieces=False, cos=cos, sin=sin)  # fmt: skip

        self.fn = gpk.compile(step)

    def run(self) -> np.ndarray:
        args = [gpk.from_numpy(a) for a in (self.q, self.new, self.slots, self.table,
                                            self.lens, self.cos, self.sin)]  # fmt: skip
        return self.fn(*args).astype("float32").to_numpy().astype(np.float64)

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(attention, pool after the store) in float64: the keys rotated and rounded to the
        pool's dtype once, as paged_write stores them."""
        kv, bs = self.kv, self.pool_np.shape[2]
        pool = self.pool_np.astype(np.float64)
        cos, sin = self.cos.astype(np.float64), self.sin.astype(np.float64)
        new = self.new.astype(np.float64)
        keys = _rot(new[:, :kv], cos[:, None], sin[:, None])
        keys = keys.astype(NP[self.dtype]).astype(np.float64)
        for r, s in enumerate(self.slots):
            if s >= 0:
                pool[s // bs, :kv, s % bs] = keys[r]
                pool[s // bs, kv:, s % bs] = new[r, kv:]
        q = _rot(self.q.astype(np.float64), cos[:, None, None], sin[:, None, None])
        q = q.astype(NP[self.dtype]).astype(np.float64)
        out = paged_sdpa_ref(q, pool[:, :kv], pool[:, kv:], self.table, self.lens)
        return out, pool

    def program_ops(self) -> list[str]:
        """The ops of the compiled step's fused graph."""
        entry = list(self.fn._cache.values())[-1]
        return [n.op for n in entry.program.schedule.graph.nodes if n.op != "input"]
