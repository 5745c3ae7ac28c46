"""Generation with a static KV cache: chunked prefill, then one-token decode steps.

Each step is a pure function of arrays -- the tokens, the position as a 0-d array, the
padding offsets, the sampling values and noise -- with the weights and caches captured, so
gpk.compile traces it once per shape and replays it (on the CUDA and the NumPy backend
alike): one decode trace for every token, one prefill trace per chunk length.

A prompt runs as chunks of `chunk` tokens (prefill_plan), each writing its keys and values
into the cache at its position and attending to everything cached before it; the last,
partial chunk is padded to a power of two (>= 16), so padding costs less than one chunk.
By default a chunk holds PREFILL_TOKENS tokens over the batch (prefill_chunk_for): GEMMs of
M = batch * chunk rows fill the GPU once M reaches about 2048, while a chunk's activations
stay a few of its [M, intermediate] tensors, whatever the prompt's length.
Prompts of a batch are left-padded to the same length; the padding is masked out of
attention, and because rotary attention depends only on relative positions, a padded row
computes what it would alone. All rows then share one cache position per step.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pygpukit as gpk
from pygpukit.array import GPUArray

from .model import Transformer, chunk_mask, decode_mask, left_pad
from .sampling import NoiseSource, SamplingParams, sample_with

MIN_BUCKET = 16
PREFILL_TOKENS = 2048  # prompt tokens (over the batch) per prefill step by default
LOOKAHEAD = 1  # decode steps queued beyond the one whose tokens are being read
CONSTS_KEPT = 256  # device copies of recurring call values a Generator keeps (_const)
# gpk.compile share keys of the two steps (see Generator.__init__).
SHARE_PREFILL = ("pygpukit.llm.Generator", "prefill")
SHARE_DECODE = ("pygpukit.llm.Generator", "decode")


def bucket(n: int, cap: int) -> int:
    """The prefill length for an n-token prompt: the next power of two (>= 16), capped."""
    b = MIN_BUCKET
    while b < n:
        b *= 2
    return min(b, cap)


def prefill_plan(n: int, chunk: int, room: int) -> list[int]:
    """The chunk lengths an n-token prompt is prefilled in: full chunks, then the rest
    padded to its bucket (at most a chunk), the padded total capped at `room` (the cache
    positions the prompt may take) when that still holds the prompt."""
    full = (n - 1) // chunk
    last = min(bucket(n - full * chunk, chunk), max(room - full * chunk, n - full * chunk))
    return [chunk] * full + [last]


def prefill_chunk_for(batch: int, tokens: int = PREFILL_TOKENS) -> int:
    """The default prefill chunk of a batch: the largest power of two whose chunk of every
    row together holds at most `tokens` tokens, and at least MIN_BUCKET."""
    chunk = MIN_BUCKET
    while chunk * 2 * batch <= tokens:
        chunk *= 2
    return chunk


def check_chunk(chunk: object) -> int:
    """A prefill chunk length: a power of two >= MIN_BUCKET, else GPUKitValueError."""
    if not isinstance(chunk, int | np.integer) or isinstance(chunk, bool) or chunk < MIN_BUCKET \
            or chunk & (chunk - 1):  # fmt: skip
        raise gpk.errors.GPUKitValueError(
            f"generate: the prefill chunk must be a power of two >= {MIN_BUCKET}, got {chunk!r}"
        )
    return int(chunk)


def check_count(name: str, value: object, least: int) -> None:
    """A count argument: an int (not a bool) >= least, else GPUKitValueError."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < least:
        raise gpk.errors.GPUKitValueError(
            f"generate: {name} must be an integer >= {least}, got {value!r}"
        )


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per row, without the prompt (cut after EOS)
    prompt_lens: list[int]
    prefill_s: float
    decode_s: float
    decode_steps: int  # decode steps run (each makes one token per row)
    batch: int
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second per sequence (one decode step = one token of each row)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class CallConstants:
    """A Generator's device copies of recurring call values, by key. Slotted (no __dict__),
    so gpk.compile's walk of the bound steps' `self` does not enter it: the arrays reach
    the steps as arguments, and capturing them too would make each new one a retrace."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: dict[tuple[Any, ...], GPUArray] = {}


class Generator:
    """Runs prefill and decode for a static batch size and cache length; prompts are
    prefilled in chunks of `chunk` tokens (a power of two; None: prefill_chunk_for(batch))."""

    def __init__(
        self, model: Transformer, batch: int, max_seq_len: int, chunk: int | None = None
    ) -> None:
        self.model = model
        self.batch, self.max_seq_len = batch, max_seq_len
        self.chunk = prefill_chunk_for(batch) if chunk is None else check_chunk(chunk)
        model.setup_cache(batch, max_seq_len)
        # Device copies of the call values that recur (see _const): a prefill of one chunk
        # uploads its token ids alone.
        self._consts = CallConstants()
        # Shared: a Generator over another model of the same structure (the same model
        # loaded again) reuses these steps' traces and passes, binding its own weights.
        self._prefill = gpk.compile(self._prefill_fn, share=SHARE_PREFILL)
        self._decode = gpk.compile(self._decode_fn, share=SHARE_DECODE)

    # -- the traced functions ------------------------------------------------------------
    # Graph-shaping choices (greedy, top_k, use_top_p) are plain Python values, part of a
    # compiled step's cache key; everything that changes per call is an array.
    def _prefill_fn(
        self,
        tokens: GPUArray,
        pos: GPUArray,
        start: GPUArray,
        temperature: GPUArray,
        top_p: GPUArray,
        noise: GPUArray,
        noise_idx: GPUArray,
        greedy: bool,
        top_k: int,
        use_top_p: bool,
    ) -> GPUArray:
        window = self.model.config.sliding_window
        mask = chunk_mask(start, pos, tokens.shape[1], self.max_seq_len, window)
        logits = self.model(tokens, mask, pos)
        u = noise[noise_idx]
        return sample_with(logits, greedy, top_k, use_top_p, temperature, top_p, u)

    def _decode_fn(
        self,
        tokens: GPUArray,
        pos: GPUArray,
        start: GPUArray,
        temperature: GPUArray,
        top_p: GPUArray,
        noise: GPUArray,
        noise_idx: GPUArray,
        greedy: bool,
        top_k: int,
        use_top_p: bool,
    ) -> GPUArray:
        mask = decode_mask(start, pos, self.max_seq_len, self.model.config.sliding_window)
        logits = self.model(tokens.reshape(-1, 1), mask, pos)
        u = noise[noise_idx]
        return sample_with(logits, greedy, top_k, use_top_p, temperature, top_p, u)

    # -- driving -------------------------------------------------------------------------
    def _const(self, key: tuple[Any, ...], value: Callable[[], np.ndarray]) -> GPUArray:
        """The read-only device copy of a per-call value that recurs across calls (a
        chunk's position, the sampling values, the padding offsets, greedy's unused
        noise), uploaded on its first use only: each upload is a copy ordered before the
        step on the device and host work before its launch. At most CONSTS_KEPT kept."""
        arrays = self._consts.arrays
        arr = arrays.get(key)
        if arr is None:
            if len(arrays) >= CONSTS_KEPT:
                arrays.clear()
            arr = arrays[key] = gpk.from_numpy(value())
            arr.readonly = True
        return arr

    def _greedy_noise(self) -> tuple[GPUArray, GPUArray]:
        """The noise block and index a greedy step takes: unread (greedy is an argmax),
        so one constant [1, B, 1] block and index 0 serve every step, nothing uploaded."""
        block = self._const(("noise",), lambda: np.zeros((1, self.batch, 1), np.float32))
        return block, self._const(("noise_idx",), lambda: np.array(0, np.int64))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        params: SamplingParams | None = None,
        eos_ids: Sequence[int] = (),
        on_tokens: Callable[[int, np.ndarray], None] | None = None,
        pad_id: int = 0,
    ) -> GenerationResult:
        """New tokens for each prompt (a list of token ids per row, len == batch).

        on_tokens(step, ids[B]) is called with each new token of every row as it arrives.
        Generation stops after max_new_tokens or once every row has emitted an EOS id.
        """
        params = params or SamplingParams()
        check_count("max_new_tokens", max_new_tokens, 0)
        if len(prompts) != self.batch:
            raise gpk.errors.ShapeError(
                f"generate: {len(prompts)} prompts for a generator of batch {self.batch}"
            )
        if any(len(p) == 0 for p in prompts):
            raise gpk.errors.GPUKitValueError("generate: a prompt has no tokens")
        if max_new_tokens == 0:
            # As Hugging Face's generate: no new tokens, nothing run; bucket None says so.
            return GenerationResult(
                [[] for _ in prompts], [len(p) for p in prompts], 0.0, 0.0, 0, self.batch,
                {"bucket": None},
            )  # fmt: skip
        longest = max(len(p) for p in prompts)
        plan = prefill_plan(longest, self.chunk, self.max_seq_len - max_new_tokens + 1)
        length = sum(plan)
        if length + max_new_tokens - 1 > self.max_seq_len:
            raise gpk.errors.GPUKitValueError(
                f"generate: a prompt of {longest} tokens (padded to {length}) plus "
                f"{max_new_tokens} new tokens does not fit max_seq_len {self.max_seq_len}"
            )
        ids, start_np = left_pad([list(p) for p in prompts], length, pad_id)
        vocab = self.model.config.vocab_size
        # Greedy steps still take a (1-wide) noise input, so both modes share one signature.
        next_noise: Callable[[], tuple[GPUArray, GPUArray]]
        if params.greedy:
            next_noise = itertools.repeat(self._greedy_noise()).__next__
        else:
            next_noise = NoiseSource(self.batch, vocab, params.seed).next
        t, p = float(params.temperature or 1.0), float(params.top_p)
        temperature = self._const(("temperature", t), lambda: np.array(t, np.float32))
        top_p = self._const(("top_p", p), lambda: np.array(p, np.float32))
        start = self._const(("start", start_np.tobytes()), lambda: start_np)
        statics = (params.greedy, params.top_k, params.top_p < 1)
        eos = np.array(sorted(set(eos_ids)), dtype=np.int64)
        done = np.zeros(self.batch, dtype=bool)
        out: list[list[int]] = [[] for _ in prompts]

        def emit(step: int, toks: np.ndarray) -> None:
            for b in np.flatnonzero(~done):
                out[b].append(int(toks[b]))
            if on_tokens is not None:
                on_tokens(step, toks)
            if eos.size:
                done[:] |= np.isin(toks, eos)

        t0 = time.perf_counter()
        # Every chunk samples (one graph per chunk length); only the last one's token is
        # kept, so all take the first token's noise.
        first_noise = next_noise()
        at = 0
        for n in plan:
            chunk = gpk.from_numpy(ids[:, at : at + n])
            pos = self._const(("pos", at), functools.partial(np.array, at, np.int64))
            tok = self._prefill(chunk, pos, start, temperature, top_p, *first_noise, *statics)
            at += n
        emit(0, tok.to_numpy())
        t1 = time.perf_counter()
        steps = 0
        # One step runs ahead: step i+1 is queued before step i's tokens are read back
        # (asynchronously, into pinned memory), so the GPU never waits for the host's
        # emit and dispatch. It feeds on step i's tokens on the device, not on the host.
        in_flight: deque[tuple[int, Any]] = deque()
        for i in range(1, max_new_tokens):
            # A device scalar: a graph input, so every position replays one trace.
            pos = gpk.scalar(length + i - 1)
            tok = self._decode(tok, pos, start, temperature, top_p, *next_noise(), *statics)
            in_flight.append((i, tok.to_numpy_async()))
            if len(in_flight) > LOOKAHEAD:
                j, ready = in_flight.popleft()
                emit(j, ready.result())  # the one host read per token
                steps += 1
                if done.all():
                    break
        while in_flight and not done.all():
            j, ready = in_flight.popleft()
            emit(j, ready.result())
            steps += 1
        t2 = time.perf_counter()
        return GenerationResult(
            out,
            [len(p) for p in prompts],
            t1 - t0,
            t2 - t1,
            steps,
            self.batch,
            {"bucket": length, "chunks": plan},
        )
