"""References of the paged KV-cache ops: paged_write (store rows at slots of a block pool)
and paged_sdpa (attention through per-row block tables), as ir/ops.py defines them."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType

from . import nn
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


def _rows(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """The rows paged_write stores: new, its first rope_heads heads rotated by the
    per-row tables (as the rope op rotates them) where attrs rope says so."""
    new = ins[1]
    rope = attrs.get("rope", "none")
    if rope == "none":
        return new
    r = attrs["rope_heads"]
    cos, sin = (t[:, None, :] for t in ins[3:5])  # [T, 1, D/2]: one row's table per token
    out = new.astype(dtype.np).copy()
    out[:, :r] = nn.rope([new[:, :r], cos, sin], {"layout": rope}, dtype)
    return out


def paged_write_into(ins: list[np.ndarray], attrs: dict[str, Any] | None = None,
                     dtype: DType | None = None) -> None:  # fmt: skip
    """pool[s // block, :, s % block] = new[t] (rotated as attrs say) in the pool's own
    memory."""
    pool, slots = ins[0], ins[2]
    keep, blk, off = _slots(pool, slots)
    new = _rows(ins, attrs or {}, dtype) if dtype is not None else ins[1]
    with np.errstate(all="ignore"):
        pool[blk, :, off] = new[keep].astype(pool.dtype)


def paged_write(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    out = ins[0].copy()
    paged_write_into([out, *ins[1:]], attrs, dtype)
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
    aligned so the last query sits at key seq_len - 1); with attrs rope, q rotated first
    by each row's tables [B, D/2] as the rope op rotates it."""
    q, k_pool, v_pool, table, lens = ins[:5]
    rope = attrs.get("rope", "none")
    if rope != "none":
        cos, sin = (t[:, None, None, :] for t in ins[5:7])  # [B, 1, 1, D/2]: row b's table
        q = nn.rope([q, cos, sin], {"layout": rope}, dtype)
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


def paged_sdpa_append(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """Store the new rows into the pool (its own memory) as paged_write with the keys
    rotated, then attend through the pool's key and value halves (ir/ops.py:
    paged_sdpa_append)."""
    q, pool, new, slots, table, lens, cos, sin = ins
    kv = pool.shape[1] // 2
    rope = attrs.get("rope", "none")
    paged_write_into([pool, new, slots, cos, sin], {"rope": rope, "rope_heads": kv}, dtype)
    return paged_sdpa([q, pool[:, :kv], pool[:, kv:], table, lens, cos, sin], attrs, dtype)
