"""Token sampling on the device: greedy, temperature, top-k, top-p, seeded.

No sort: top-k finds the k-th largest logit by k-1 rounds of "knock out the argmax", top-p
finds the probability threshold by bisection on the kept mass, and the draw is Gumbel-max
(argmax of logits + Gumbel noise), which samples exactly softmax(logits) from uniform noise
drawn ahead on the host. Every step is a plain array op, so a decode graph holds the
sampler and only the chosen token ids go back to the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import pygpukit as gpk
from pygpukit.array import GPUArray

TOP_P_ROUNDS = 32  # bisection rounds: the threshold is found to 2^-32 of the top probability


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise gpk.errors.GPUKitValueError(
                f"sampling: temperature must be >= 0, got {self.temperature}"
            )
        if self.top_k < 0:
            raise gpk.errors.GPUKitValueError(f"sampling: top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise gpk.errors.GPUKitValueError(
                f"sampling: top_p must be in (0, 1], got {self.top_p}"
            )
        # NumPy's generator takes non-negative integers only (a bool is not a seed).
        if self.seed is not None and (
            not isinstance(self.seed, int | np.integer) or isinstance(self.seed, bool)
            or self.seed < 0
        ):  # fmt: skip
            raise gpk.errors.GPUKitValueError(
                f"sampling: seed must be None or an integer >= 0, got {self.seed!r}"
            )

    @property
    def greedy(self) -> bool:
        """Whether sampling is greedy (temperature 0: the argmax of each row)."""
        return self.temperature == 0


def top_k_filter(logits: GPUArray, k: int) -> GPUArray:
    """Keep the logits >= the k-th largest of each row (ties with it kept, as HF); -inf else."""
    v = logits.shape[-1]
    if k <= 0 or k >= v:
        return logits
    iota = gpk.arange(v)
    work = logits
    for _ in range(k - 1):
        work = gpk.where(iota == work.argmax(-1, keepdims=True), -math.inf, work)
    kth = work.max(-1, keepdims=True)
    return gpk.where(logits >= kth, logits, -math.inf)


def top_p_filter(logits: GPUArray, top_p: GPUArray) -> GPUArray:
    """Keep the smallest set of most likely tokens whose probability reaches top_p.

    Bisection on a threshold t keeps lo with mass(p >= lo) >= top_p and hi with less; the
    kept set is p >= lo. top_p is a 0-d array, so changing it does not change the graph.
    """
    probs = gpk.nn.softmax(logits, axis=-1)
    lo = gpk.zeros(probs.shape[:-1] + (1,), gpk.float32)
    hi = probs.max(-1, keepdims=True) + 1.0
    for _ in range(TOP_P_ROUNDS):
        mid = (lo + hi) * 0.5
        enough = gpk.where(probs >= mid, probs, 0.0).sum(-1, keepdims=True) >= top_p
        lo = gpk.where(enough, mid, lo)
        hi = gpk.where(enough, hi, mid)
    return gpk.where(probs >= lo, logits, -math.inf)


def gumbel(uniform: GPUArray) -> GPUArray:
    """Gumbel(0, 1) noise from uniform (0, 1) noise."""
    u = gpk.clip(uniform, 1e-20, 1.0 - 1e-7)
    return -gpk.log(-gpk.log(u))


def sample(
    logits: GPUArray,
    params: SamplingParams,
    temperature: GPUArray | None = None,
    top_p: GPUArray | None = None,
    uniform: GPUArray | None = None,
) -> GPUArray:
    """Token ids [B] (int64) from logits [B, V] (float32).

    temperature/top_p: 0-d float32 arrays (dynamic values; params gives the defaults).
    uniform: [B, V] noise in (0, 1); needed unless greedy.
    """
    t = temperature if temperature is not None else gpk.full((), params.temperature, gpk.float32)
    p = top_p if top_p is not None else gpk.full((), params.top_p, gpk.float32)
    return sample_with(logits, params.greedy, params.top_k, params.top_p < 1, t, p, uniform)


def sample_with(
    logits: GPUArray,
    greedy: bool,
    top_k: int,
    use_top_p: bool,
    temperature: GPUArray,
    top_p: GPUArray,
    uniform: GPUArray | None,
) -> GPUArray:
    """sample() with the graph-shaping choices as plain bools/ints and the values as arrays,
    the signature a compiled step takes (statics in its cache key, arrays as inputs)."""
    if greedy:
        return logits.argmax(-1)
    if uniform is None:
        raise gpk.errors.GPUKitValueError("sample: sampling needs uniform noise [B, V]")
    x = top_k_filter(logits / temperature, top_k)
    if use_top_p:
        x = top_p_filter(x, top_p)
    return (x + gumbel(uniform)).argmax(-1)


class NoiseSource:
    """Seeded uniform noise for the sampler, drawn on the host a block of steps at a time.

    One upload serves `rounds` steps; a step picks its slice with a 0-d index array, so the
    step's graph is the same for every step.
    """

    def __init__(self, batch: int, vocab: int, seed: int | None, budget: int = 1 << 22) -> None:
        self.rng = np.random.default_rng(seed)
        self.batch, self.vocab = batch, vocab
        self.rounds = max(1, min(64, budget // max(batch * vocab, 1)))
        self.block: GPUArray | None = None
        self.used = self.rounds

    def next(self) -> tuple[GPUArray, GPUArray]:
        """(block [R, B, V], index 0-d): the noise of the next step is block[index]."""
        if self.used == self.rounds:
            u = self.rng.random((self.rounds, self.batch, self.vocab), dtype=np.float32)
            self.block = gpk.from_numpy(u)
            self.used = 0
        assert self.block is not None
        idx = gpk.from_numpy(np.array(self.used, dtype=np.int64))
        self.used += 1
        return self.block, idx
