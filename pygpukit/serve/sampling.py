"""Per-row sampling for a batch of independent requests, on the device.

Each row has its own temperature, top_k and top_p (0-d values would force one setting on
the whole batch); greedy rows (temperature 0) take the argmax. Top-k runs k_max rounds of
"knock out the argmax" for the batch and keeps, per row, the value its own k reached;
top-p and the Gumbel-max draw are llm.sampling's, with [B, 1] thresholds.
"""

from __future__ import annotations

import math

import pygpukit as gpk
from pygpukit.array import GPUArray
from pygpukit.llm.sampling import gumbel, top_p_filter


def sample_rows(
    logits: GPUArray,
    temperature: GPUArray,
    top_k: GPUArray,
    top_p: GPUArray,
    uniform: GPUArray,
    sampled: bool,
    k_max: int,
    use_top_p: bool,
) -> GPUArray:
    """Token ids [B] (int64) from logits [B, V] float32.

    temperature/top_p [B] float32, top_k [B] int (0: off; at most k_max), uniform [B, V]
    noise in (0, 1). The statics shape the graph: sampled False is argmax for all rows,
    k_max the top-k rounds, use_top_p whether any row filters by top_p."""
    best = logits.argmax(-1)
    if not sampled:
        return best
    b, v = logits.shape
    t = gpk.where(temperature > 0, temperature, 1.0).reshape(b, 1)
    x = logits / t
    if 0 < k_max < v:
        kk = top_k.reshape(b, 1)
        iota = gpk.arange(v)
        work = x
        kth = gpk.full((b, 1), -math.inf, gpk.float32)
        for r in range(1, k_max + 1):
            kth = gpk.where(kk == r, work.max(-1, keepdims=True), kth)
            if r < k_max:
                work = gpk.where(iota == work.argmax(-1, keepdims=True), -math.inf, work)
        x = gpk.where(x >= kth, x, -math.inf)
    if use_top_p:
        p = top_p.reshape(b, 1)
        x = gpk.where(p < 1.0, top_p_filter(x, p), x)
    drawn = (x + gumbel(uniform)).argmax(-1)
    return gpk.where(temperature > 0, drawn, best)


def k_rounds(top_k: int) -> int:
    """The static top-k rounds for a batch whose largest top_k is top_k: a power of two
    (so a few graphs serve every mix), 0 when no row filters."""
    if top_k <= 0:
        return 0
    r = 1
    while r < top_k:
        r *= 2
    return r
