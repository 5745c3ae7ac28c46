"""References of the paged KV-cache ops: paged_write (store rows at slots of a block pool)
and paged_sdpa (attention through per-row block tables), as ir/ops.py defines them."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType

from .nn import sdpa


def _slots(pool: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows kept, their blocks, their offsets); a slot past the pool raises IndexError."""
    n, _, bs, _ = pool.shape
    s = slots.astype(np.int64)
    keep = np.flatnonzero(s >= 0)
    bad = s[keep][s[keep] >= n * bs]
    if bad.size:
        raise IndexError(f"paged_write: slot {int(bad[0])} is outside the pool of {n} blocks "
                         f"of {bs}")  # fmt: skip
    return keep, s[keep] // bs, s[keep] % bs


def paged_write_into(ins: list[np.ndarray]) -> None:
    """pool[s // block, :, s % block] = new[t] in the pool's own memory."""
    pool, new, slots = ins
    keep, blk, off = _slots(pool, slots)
    with np.errstate(all="ignore"):
        pool[blk, :, off] = new[keep].astype(pool.dtype)


def paged_write(ins: list[np.ndarray]) -> np.ndarray:
    out = ins[0].copy()
    paged_write_into([out, ins[1], ins[2]])
    return out


def gather_keys(pool: np.ndarray, table: np.ndarray, length: int) -> np.ndarray:
    """Positions 0..length-1 of one row, through its block table: [KV, length, D]."""
    n, _, bs, _ = pool.shape
    if length > table.shape[0] * bs:
        raise ValueError(f"paged_sdpa: seq_len {length} is more than the block table's "
                         f"{table.shape[0]} blocks of {bs}")  # fmt: skip
    pos = np.arange(length)
    blocks = table[pos // bs].astype(np.int64)
    if blocks.size and (blocks.min() < 0 or blocks.max() >= n):
        bad = blocks[(blocks < 0) | (blocks >= n)][0]
        raise IndexError(f"paged_sdpa: block {int(bad)} is outside the pool of {n} blocks")
    return np.swapaxes(pool[blocks, :, pos % bs], 0, 1)


def paged_sdpa(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """Each row's keys gathered into a contiguous cache, then the sdpa reference (causal,
    aligned so the last query sits at key seq_len - 1)."""
    q, k_pool, v_pool, table, lens = ins
    out = np.zeros(q.shape, dtype=q.dtype)
    a = {"causal": True, "scale": attrs.get("scale"), "kv_len": False, "kv_start": False}
    for b in range(q.shape[0]):
        length = int(lens[b])
        if length < 0:
            raise ValueError(f"paged_sdpa: seq_len {length} of row {b} is negative")
        if length == 0:
            continue  # no key: zeros, as sdpa gives a query that sees none
        k = gather_keys(k_pool, table[b], length)[None]
        v = gather_keys(v_pool, table[b], length)[None]
        out[b] = sdpa([q[b : b + 1], k, v], a, dtype)[0]
    return out
