"""The continuous-batching engine: many requests share one running batch over a paged KV
cache.

One engine thread owns the model. Each engine step it
  1. takes new requests and cancellations from a thread-safe inbox; a new request is
     submitted to the project's scheduler core (pygpukit._rust.SchedulerCore) with its KV
     blocks' bytes as its memory reservation, so admission, queueing when the cache is
     full, and the order by QoS/priority are the scheduler's decisions;
  2. starts what the scheduler lets start (up to max_batch sequences), giving each its
     blocks;
  3. launches the step under its token budget (step_tokens) as ONE launch of N tokens
     (N a power of two, or the budget itself): a token for every running sequence first,
     then, with what the budget has left, the next pieces of the prompts waiting, oldest
     first (at most prefill_chunk tokens of one prompt a step; a prompt is split over as
     many steps as it needs), then padding up to N. Each token is a row of its own with
     its sequence's block table and position, so the weights are read once a step
     whatever the mix of decode and prefill tokens, and nothing is padded per prompt;
  4. reads back the step before it and streams its tokens, while this one runs;
  5. retires finished sequences: their blocks go back to the pool at once and the
     scheduler's complete() admits what waited for that memory.
Steps are gpk.compile'd functions, one captured graph per (bucket, sampling statics).
Each running sequence has a token slot: a row of device arrays holding its last token,
that token's position and its block table (_Step). A decode step reads its rows' state
there and writes the new tokens and positions back, so it needs nothing read back from
the one before and runs LOOKAHEAD steps ahead of the host (the host knows how many tokens each
sequence has, not which, until they are read back), and a decode step of an unchanged
batch uploads nothing; a prefill launch is one upload. The engine thread shares the
interpreter lock with the other threads of its process (the HTTP loop, when the server
runs it there: Server processes=1), which take it whenever the engine lets go (a wait, a
large copy): the step's launch lets go of it as little as it can. A running stream gets a
token every engine step, and a step's prefill share is bounded by the budget, so a prompt
arriving mid-stream delays the others by at most one budget's prefill per token instead
of its whole prefill.
Events reach the caller through its `sink`, called on the engine thread; hooks added
with add_step_hook run there once per step, after its events.
"""

from __future__ import annotations

import gc
import itertools
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pygpukit as gpk
from pygpukit import errors
from pygpukit.array import GPUArray
from pygpukit.llm.api import Model
from pygpukit.llm.paged import PagedKVCache, paged_forward
from pygpukit.llm.sampling import SamplingParams

from .blocks import BlockAllocator, blocks_for
from .prefix_cache import PrefixCache, block_names
from .sampling import k_rounds, sample_rows

log = logging.getLogger("pygpukit.serve")

QOS = ("guaranteed", "burstable", "best_effort")
# Prompt tokens a step's budget must leave beside a full decode batch, so prompts progress.
MIN_PREFILL_TOKENS = 16
# Most prompts one step prefills pieces of: each writes its block table in the step (a row
# of the upload's table section), and one it finishes samples a token (an output row).
STEP_PROMPTS = 16
# Engine steps launched before the oldest one's tokens are read back: two, so the GPU has
# a step queued behind the running one while the engine thread waits for the interpreter
# lock (the HTTP loop holds it for up to the switch interval whenever the engine thread
# lets go of it) or emits. Tokens that have landed are read back sooner (_landed).
LOOKAHEAD = 2
# The engine thread waits for the GPU without the interpreter lock and must get it back
# at once, or the GPU idles while another thread (the HTTP loop) runs Python: CPython
# makes a waiting thread wait up to the switch interval (5 ms by default).
SWITCH_INTERVAL_S = 0.0005
# Whether the engine thread sleeps while it waits for a step's tokens (on an event made with
# CU_EVENT_BLOCKING_SYNC, recorded after the step) rather than spinning in the transfer's
# wait: with one context the driver spins a CPU core through every wait, most of each
# step, and the front end, the bridge and (on one host) the clients need that core. The
# wake-up's latency costs no GPU time: LOOKAHEAD steps are queued behind the one waited
# on. Only the small copy after the step is then waited on by spinning.
SLEEP_WAIT = True
# Entries Engine.timeline keeps of each kind (finished requests, launched steps, idle
# periods): a few rounds of a 256-client burst.
TIMELINE = 4096


def run_hooks(hooks: Sequence[Callable[[], None]]) -> None:
    """Calls each step hook; a listener's bug is logged and must not stop the others (or
    the engine thread calling them)."""
    for hook in hooks:
        try:
            hook()
        except Exception:
            log.exception("a step hook failed")


class Overloaded(errors.GPUKitError, RuntimeError):
    """The engine's wait queue is full: try again later (HTTP 429)."""


@dataclass
class Event:
    """What a request's sink receives: a token, the end (finish_reason), or an error."""

    kind: str  # "token" | "done" | "error"
    token: int = -1
    # A request's first token: its prompt tokens served from the prefix cache.
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: BaseException | None = None


_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One generation: prompt ids in, up to max_tokens new ids out through `sink`."""

    prompt: list[int]
    max_tokens: int
    sink: Callable[[Event], None]
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset[int] = frozenset()
    qos: str = "burstable"
    priority: int = 0
    tenant: str = "default"
    id: int = field(default_factory=lambda: next(_ids))
    # Engine state (engine thread only).
    task: int = -1
    blocks: list[int] = field(default_factory=list)
    # Prefix caching: the names of its full blocks of known tokens (PrefixCache), how many
    # of its blocks are named, and whether its first block is prefilled alone so that
    # cached blocks may take the place of its next ones (Engine._share).
    names: list[bytes] = field(default_factory=list)
    named: int = 0
    probe: bool = False
    cached: int = 0  # prompt tokens in shared blocks (not prefilled)
    prefilled: int = 0
    scheduled: int = 0  # new tokens whose steps were launched (read back or not)
    tok_slot: int = -1  # the row of the last-token array it owns while it runs
    generated: list[int] = field(default_factory=list)
    rng: Any = None
    ended: bool = False
    # Its timeline (time.perf_counter seconds, the system-wide monotonic clock, so a load
    # generator's processes compare with it; 0.0: not yet): when it reached the server
    # (the HTTP handler began; else its submit), submit(), the launch of the first step
    # with a piece of its prompt and of the step finishing it, its first token streamed,
    # its end (Engine.timeline).
    arrived: float = 0.0
    submitted: float = 0.0
    started: float = 0.0
    prefilled_at: float = 0.0
    first_token: float = 0.0
    ended_at: float = 0.0

    def slot(self, pos: int, block_size: int) -> int:
        return self.blocks[pos // block_size] * block_size + pos % block_size


# A launch's output rows, their tokens' transfer and its Engine.timeline step record (the
# read-back stamps its hand-off there).
Launch = tuple[list["Request | None"], Any, list[Any]]


class _Step:
    """The traced step: forward over the paged cache, per-row sampling. Its own small
    object, so the compiled functions reach the model, the cache and the per-slot state
    arrays below, not the engine's changing bookkeeping (which gpk.compile would guard on).

    A running sequence's decode state lives on the device, one row per token slot, so a
    decode step of an unchanged batch uploads nothing: `last` [slots, 1, 1, 1] int64 its
    last token, `pos` (same shape) that token's position, `tables` [slots, 1, 1,
    max_blocks] int32 its block table (its blocks are allocated whole when it starts, so
    the row never changes while it runs). A step writes the tables of the prompts it
    prefills, reads every token's table and (decode tokens) last token and position
    there, and writes back each sampled token and the position after it. The writes are
    paged_write stores (row r at slot s; nothing where s is negative)."""

    def __init__(self, tr: Any, cache: PagedKVCache, slots: int, max_blocks: int,
                 max_outputs: int) -> None:  # fmt: skip
        self.tr, self.cache = tr, cache
        self.slots, self.max_blocks, self.max_outputs = slots, max_blocks, max_outputs
        self.last = gpk.zeros((slots, 1, 1, 1), gpk.int64).realize()
        self.pos = gpk.zeros((slots, 1, 1, 1), gpk.int64).realize()
        self.tables = gpk.zeros((slots, 1, 1, max_blocks), gpk.int32).realize()

    def layout(self, n: int) -> tuple[int, int]:
        """(output rows, table rows) of an n-token step: a token for each decode row and
        each prompt the step finishes; a table for each prompt it prefills."""
        return min(n, self.max_outputs), min(n, STEP_PROMPTS)

    def run(self, packed: GPUArray, tables_in: GPUArray, n: int, temperature: GPUArray,
            top_k: GPUArray, top_p: GPUArray, noise: GPUArray, sampled: bool, k_max: int,
            use_top_p: bool, pieces: bool = True) -> GPUArray:  # fmt: skip
        """One engine step of n tokens. packed [3 n + 2 ro] int64: per token its id and
        position (-1, -1: a decode token, fed by its slot's last token at the position
        after it) and its token slot (-1: padding, nothing stored); per output row the
        token it samples after and the token slot taking it (-1: none). tables_in [rt, 1 +
        max_blocks] int32: per row a token slot (-1: none) and the block table it gets
        (the prompts the step prefills). pieces False: a decode-only step (no prompt
        tokens), whose attention launches no prompt-piece kernel (paged_forward).
        Returns the output rows' tokens."""
        ro, rt = self.layout(n)
        m, bs = self.max_blocks, self.cache.block_size
        tok_in, pos_in, tslot = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n]
        out_at, out_slot = packed[3 * n : 3 * n + ro], packed[3 * n + ro :]
        gpk.nn.paged_write(self.tables, tables_in[:, 1:].reshape(rt, 1, m), tables_in[:, 0])
        live = tslot >= 0
        at = gpk.maximum(tslot, 0)
        dec = tok_in < 0
        tokens = gpk.where(dec, gpk.take(self.last.reshape(-1), at), tok_in)
        p = gpk.where(live, gpk.where(dec, gpk.take(self.pos.reshape(-1), at), pos_in), 0)
        table = gpk.take(self.tables.reshape(self.slots, m), at, axis=0)
        block = gpk.take(self.tables.reshape(-1), at * m + p // bs).astype(gpk.int64)
        slots = gpk.where(live, block * bs + p % bs, -1)
        positions = gpk.where(live, p, -1).reshape(n, 1)
        lens = gpk.where(live, p + 1, 0).astype(gpk.int32)
        # Rows other than prompt pieces' tokens: the decode rows and the prompts a step
        # finishes with one token (the attention's grid hint).
        logits = paged_forward(self.tr, self.cache, tokens.reshape(n, 1), positions, slots,
                               table, lens, out_at, pieces=pieces,
                               decode_rows=self.max_outputs if pieces else None)  # fmt: skip
        tok = sample_rows(logits, temperature, top_k, top_p, noise, sampled, k_max, use_top_p)
        gpk.nn.paged_write(self.last, tok.reshape(ro, 1, 1), out_slot)
        gpk.nn.paged_write(self.pos, (gpk.take(p, out_at) + 1).reshape(ro, 1, 1), out_slot)
        return tok


def check_request(prompt: Sequence[int], max_tokens: int, max_model_len: int, vocab: int) -> None:
    """Raise GPUKitValueError when a request can never run on an engine of max_model_len
    and vocab (Engine.check; the HTTP front end's process checks with the same limits)."""
    if len(prompt) == 0:
        raise errors.GPUKitValueError("the prompt has no tokens")
    if max_tokens < 1:
        raise errors.GPUKitValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if len(prompt) + max_tokens > max_model_len:
        raise errors.GPUKitValueError(
            f"this model's maximum context length is {max_model_len} tokens; the "
            f"prompt has {len(prompt)} and max_tokens is {max_tokens}"
        )
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise errors.GPUKitValueError(f"token id {bad[0]} is outside the vocabulary "
                                      f"[0, {vocab})")  # fmt: skip


def bucket(n: int, least: int = 1) -> int:
    """The next power of two >= n (and >= least)."""
    b = least
    while b < n:
        b *= 2
    return b


# What the first running engine changed in the process, and how many engines run: the
# last one to close puts it back. The switch interval: see SWITCH_INTERVAL_S. The garbage
# collector: a started engine's traced graphs, plans and weights (about a million objects
# for a 22-layer model; a full collection of a 2-layer one's takes 28 ms on a CI core) live
# as long as it does, and a full collection that walks them holds the interpreter lock,
# stalling the engine thread and the HTTP loop together (the H200 run saw every stream's
# first token of a round late by about 300 ms), so they are frozen (gc.freeze: never
# walked again) when an engine starts, and unfrozen when the last one closes (unless the
# process had frozen objects of its own before).
_switch = {"saved": 0.0, "engines": 0, "unfreeze": False}
_switch_lock = threading.Lock()


def _lower_switch_interval() -> None:
    with _switch_lock:
        if _switch["engines"] == 0:
            _switch["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch["saved"], SWITCH_INTERVAL_S))
            _switch["unfreeze"] = gc.get_freeze_count() == 0
        _switch["engines"] += 1
        gc.collect()
        gc.freeze()


def _restore_switch_interval() -> None:
    with _switch_lock:
        _switch["engines"] -= 1
        if _switch["engines"] == 0:
            sys.setswitchinterval(_switch["saved"])
            if _switch["unfreeze"]:
                gc.unfreeze()


class Engine:
    """Continuous batching over a paged KV cache for one loaded Model.

    max_model_len: longest sequence (prompt + new tokens; default the model's
    max_position_embeddings, capped at 8192 and at a sliding window). kv_blocks or
    kv_memory (bytes) size the cache (default: 1/4 of free device memory on a GPU, 256 MiB
    on the CPU, at least one full-length sequence). max_batch: most sequences decoding at
    once). prefill_chunk: the most tokens of one prompt one step prefills (a longer prompt
    is split over steps). step_tokens: the token budget of one engine step with decode
    rows: its decode rows plus its prompt tokens, the launch padded to the next power of
    two (or to the budget); default max(2 * prefill_chunk, the max_batch bucket +
    prefill_chunk), 1024 with the other defaults. It must leave MIN_PREFILL_TOKENS beside
    a full decode batch, so prompts always progress. A smaller budget bounds how long a
    step that prefills keeps running streams waiting (their inter-token latency), a larger
    one prefills in fewer steps, each reading the weights once (throughput).
    prefill_step_tokens: the budget of a step with no decode row (only prompts waiting:
    nobody's next token waits on it); a step with d decode rows takes up to
    prefill_step_tokens / d (a power of two) when that is more than step_tokens, so a
    longer step delays only a few streams. At least step_tokens; default step_tokens
    (every step under one budget).
    max_queue: most requests waiting to start; more are refused with Overloaded.
    """

    def __init__(self, model: Model, *, max_model_len: int | None = None,
                 kv_blocks: int | None = None, kv_memory: int | None = None,
                 block_size: int = 16, max_batch: int = 256, prefill_chunk: int = 512,
                 max_queue: int = 1024, step_tokens: int | None = None,
                 prefill_step_tokens: int | None = None,
                 prefix_caching: bool = True) -> None:  # fmt: skip
        cfg = model.config
        self.model, self.tr = model, model.transformer
        limit = min(cfg.max_position_embeddings, 8192)
        if cfg.sliding_window is not None:
            limit = min(limit, cfg.sliding_window)  # paged attention sees the whole sequence
        self.max_model_len = min(max_model_len or limit, limit)
        for name, v in (("block_size", block_size), ("max_batch", max_batch),
                        ("prefill_chunk", prefill_chunk), ("max_queue", max_queue)):  # fmt: skip
            if not isinstance(v, int) or v < 1:
                raise errors.GPUKitValueError(f"Engine: {name} must be an integer >= 1, got {v!r}")
        least = max_batch + MIN_PREFILL_TOKENS
        if step_tokens is None:
            step_tokens = max(2 * prefill_chunk, bucket(max_batch) + prefill_chunk)
        if not isinstance(step_tokens, int) or step_tokens < least:
            raise errors.GPUKitValueError(
                f"Engine: step_tokens must be an integer >= {least} (a full decode batch of "
                f"max_batch {max_batch} and {MIN_PREFILL_TOKENS} prompt tokens), got "
                f"{step_tokens!r}"
            )
        if prefill_step_tokens is None:
            prefill_step_tokens = step_tokens
        if not isinstance(prefill_step_tokens, int) or prefill_step_tokens < step_tokens:
            raise errors.GPUKitValueError(
                f"Engine: prefill_step_tokens must be an integer >= step_tokens "
                f"({step_tokens}), got {prefill_step_tokens!r}"
            )
        self.block_size, self.max_batch = block_size, max_batch
        self.prefill_chunk, self.max_queue = prefill_chunk, max_queue
        self.step_tokens, self.prefill_step_tokens = step_tokens, prefill_step_tokens
        self.block_bytes = PagedKVCache.block_bytes(self.tr, block_size)
        self.max_blocks = blocks_for(self.max_model_len, block_size)
        if kv_blocks is None:
            kv_blocks = _default_memory(kv_memory) // self.block_bytes
        self.num_blocks = max(int(kv_blocks), self.max_blocks)
        self.cache = PagedKVCache(self.tr, self.num_blocks, block_size, self.max_model_len)
        self.blocks = PrefixCache(BlockAllocator(self.num_blocks))
        self.prefix_caching = bool(prefix_caching)
        # The second blocks' names of started requests' prompts not yet prefilled (counts):
        # a request whose second block is among them probes for it (_blocks_for).
        self._coming: dict[bytes, int] = {}
        from pygpukit import _rust

        self.core = _rust.SchedulerCore(self.num_blocks * self.block_bytes)
        self.vocab = cfg.vocab_size
        self.eos = frozenset(model.eos_token_ids)
        self._step_obj = _Step(self.tr, self.cache, max_batch, self.max_blocks,
                               max_batch + STEP_PROMPTS)  # fmt: skip
        self._tok_free = list(range(max_batch - 1, -1, -1))  # free rows of _step_obj.last
        # Engine steps whose tokens are not read back yet, oldest first: each step's
        # launches in order, as (the rows, None where a row takes no token, the transfer
        # of the launch's tokens).
        self._inflight: deque[list[Launch]] = deque()
        # One compiled function per (step tokens, sampling statics): each traces once, and
        # its captured graph is replayed for every step of that shape.
        self._compiled: dict[tuple[Any, ...], Any] = {}
        # Steps that prefill nothing: their table rows (all empty), uploaded once per size.
        self._idle_tables: dict[int, GPUArray] = {}
        # All-greedy batches' sampling inputs never change: uploaded once per batch size.
        self._greedy_inputs: dict[int, list[GPUArray]] = {}
        # The last decode-only step's (tokens, token slots), its upload and output rows: a
        # decode step of the same batch uploads nothing and builds no row list.
        self._decode_key: tuple[Any, ...] = ()
        self._decode_upload: GPUArray | None = None
        self._decode_outs: list[Request | None] = []
        # An all-greedy step's output rows and their sampling inputs (the next step of the
        # same rows takes them as they are).
        self._greedy_step: tuple[list[Request | None], Any] | None = None
        # The decode rows of the last step (_decode_rows) and their token slots, valid
        # while the running batch is the same (_batch_version counts its changes) and the
        # row with the fewest tokens left to schedule (limit) still has one.
        self._batch_version = 0
        self._rows_cache: tuple[int, list[Request], tuple[int, ...], Request | None] = (
            -1, [], (), None)  # fmt: skip
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # submitted, not yet started (the bounded queue)
        self._pending: dict[int, Request] = {}  # scheduler task id -> request not started
        self._by_id: dict[int, Request] = {}
        self._prefilling: deque[Request] = deque()
        self._running: list[Request] = []
        self._counts = {"submitted": 0, "finished": 0, "cancelled": 0, "rejected": 0,
                        "failed": 0, "steps": 0, "decode_steps": 0, "prefill_steps": 0,
                        "mixed_steps": 0, "prefill_tokens": 0, "max_step_tokens": 0,
                        "tokens": 0, "prefix_hit_tokens": 0}  # fmt: skip
        # Where the engine thread's time goes (ms): launching steps (their inputs and the
        # call), waiting for a step's tokens (the device's time
        # beyond the host's shows here), emitting them (the sinks) and idling (waiting
        # for a request with nothing in hand).
        self._times = {"launch": 0.0, "wait": 0.0, "emit": 0.0, "idle": 0.0}
        # Engine.timeline's records: finished requests' timelines, launched steps (start
        # and end of the launch, decode rows, prompt tokens, launch size, when its tokens
        # were handed to the sinks) and idle periods.
        self._timeline: deque[tuple[Any, ...]] = deque(maxlen=TIMELINE)
        self._step_log: deque[list[Any]] = deque(maxlen=TIMELINE)
        self._idle_log: deque[tuple[float, float]] = deque(maxlen=TIMELINE)
        self._step_hooks: list[Callable[[], None]] = []
        # On CUDA, each step's blocking-sync event (SLEEP_WAIT), recorded after its launch by
        # this (taken from the free ones in _wait_events, which it goes back to once read).
        self._record_wait: Callable[[list[Any]], Any] | None = _wait_event_recorder()
        self._wait_events: list[Any] = []
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the caller's side (any thread) -------------------------------------------------
    def start(self) -> Engine:
        """Start the engine thread (and lower the interpreter's switch interval to
        SWITCH_INTERVAL_S and freeze the objects alive now against the garbage
        collector, for the whole process until the last engine's close(): see there)."""
        if self._thread is None:
            _lower_switch_interval()
            self._thread = threading.Thread(target=self._loop, name="pygpukit-engine",
                                            daemon=True)  # fmt: skip
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the engine thread; unfinished requests end with an error event."""
        self._stop = True
        self._inbox.put(("stop", None))
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            _restore_switch_interval()

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call hook() on the engine thread at the end of every engine step, after the
        step's events went to their sinks: a sink that only queues events (the HTTP
        layer's) hands them on in one batch there instead of one wake-up per token."""
        self._step_hooks.append(hook)

    def check(self, prompt: Sequence[int], max_tokens: int) -> None:
        """Raise GPUKitValueError when a request can never run (the HTTP layer's 400)."""
        check_request(prompt, max_tokens, self.max_model_len, self.vocab)

    def submit(self, req: Request) -> Request:
        """Queue a request; raises GPUKitValueError (never fits) or Overloaded (queue full)."""
        self.check(req.prompt, req.max_tokens)
        if req.qos not in QOS:
            raise errors.GPUKitValueError(f"qos must be one of {list(QOS)}, got {req.qos!r}")
        with self._lock:
            if self._waiting >= self.max_queue:
                raise Overloaded(f"{self._waiting} requests are waiting (the most is "
                                 f"{self.max_queue}); try again later")  # fmt: skip
            self._waiting += 1
        req.submitted = time.perf_counter()
        req.arrived = req.arrived or req.submitted
        self._inbox.put(("add", req))
        return req

    def cancel(self, req: Request) -> None:
        """End a request early (a client went away, a stop string matched): its blocks go
        back at the next step boundary. No-op once it has ended."""
        self._inbox.put(("cancel", req))

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int,
                 params: SamplingParams | None = None, ignore_eos: bool = False,
                 timeout: float | None = None) -> list[list[int]]:  # fmt: skip
        """Submit all prompts at once and wait: the new ids of each (a test and bench helper)."""
        done = threading.Semaphore(0)
        outs: list[list[int]] = [[] for _ in prompts]
        errs: list[BaseException] = []

        def sink_for(i: int) -> Callable[[Event], None]:
            def sink(ev: Event) -> None:
                if ev.kind == "token":
                    outs[i].append(ev.token)
                else:
                    if ev.error is not None:
                        errs.append(ev.error)
                    done.release()

            return sink

        stop = frozenset() if ignore_eos else self.eos
        for i, p in enumerate(prompts):
            self.submit(Request(list(p), max_tokens, sink_for(i), params or SamplingParams(),
                                stop))  # fmt: skip
        for _ in prompts:
            if not done.acquire(timeout=timeout):
                raise errors.GPUKitError("Engine.generate: timed out")
        if errs:
            raise errs[0]
        return outs

    def stats(self) -> dict[str, Any]:
        """Blocks used and free, sequences running/prefilling/waiting, the step budget
        (step_tokens), counters (engine steps, decode and prefill launches, steps that
        launched both, prompt tokens prefilled, the most tokens one step computed), and
        the engine thread's time so far by phase (time_ms: launching steps, waiting for
        their tokens, emitting them, idling with nothing in hand)."""
        return {
            "num_blocks": self.num_blocks,
            "free_blocks": self.blocks.free,
            "used_blocks": self.blocks.used,
            "cached_blocks": self.blocks.cached,
            "prefix_caching": self.prefix_caching,
            "block_size": self.block_size,
            "running": len(self._running),
            "prefilling": len(self._prefilling),
            "waiting": self._waiting,
            "max_model_len": self.max_model_len,
            "step_tokens": self.step_tokens,
            "prefill_step_tokens": self.prefill_step_tokens,
            **self._counts,
            "time_ms": dict(self._times),
        }

    def timeline(self, since: float = 0.0) -> dict[str, list[dict[str, Any]]]:
        """Where the engine's time went from `since` on (time.perf_counter seconds: the
        system-wide monotonic clock, so other processes' stamps compare): "requests" that
        ended since then, each with its id, prompt and output token counts, how it ended
        and its timeline (arrived at the server, submitted, started: the launch of its
        first prompt piece's step, prefilled: of the step finishing its prompt,
        first_token: streamed, ended; 0.0 where it never got there); "steps" launched
        since then (start and end of the launch, decode rows, prompt tokens, launch size
        in tokens, emitted: when its tokens were handed to their sinks, 0.0 before);
        "idle": the periods that ended since then in which the engine thread
        waited for work with nothing in hand (start, end). The last TIMELINE of each;
        any thread may call it."""
        keys = ("id", "prompt", "tokens", "reason", "arrived", "submitted", "started",
                "prefilled", "first_token", "ended")  # fmt: skip
        skeys = ("start", "end", "rows", "prompt_tokens", "tokens", "emitted")
        reqs = [dict(zip(keys, r, strict=True)) for r in tuple(self._timeline) if r[-1] >= since]
        steps = [dict(zip(skeys, r, strict=True)) for r in tuple(self._step_log) if r[0] >= since]
        idle = [{"start": a, "end": b} for a, b in tuple(self._idle_log) if b >= since]
        return {"requests": reqs, "steps": steps, "idle": idle}

    def warmup(self, max_prompt: int | None = None) -> int:
        """Trace and capture every greedy step shape a serving run can meet (each step
        size: a power of two up to step_tokens, and step_tokens; the same up to
        prefill_step_tokens for steps of prompts alone) before serving, so no
        request waits for a compile. Runs all-padding inputs: nothing is stored. Call
        before start(); returns the compiled steps. (max_prompt is accepted for callers
        that size prompts: every step size holds any mix of decode and prompt tokens.)"""
        if self._thread is not None:
            raise errors.GPUKitError("Engine.warmup: call it before start()")
        sizes = sorted({self._step_size(b, cap) for cap in (self.step_tokens,
                                                             self.prefill_step_tokens)
                        for b in _buckets(1, cap)})  # fmt: skip
        # Decode-only steps (no prompt tokens) have a graph of their own, without the
        # prompt-piece kernel: their sizes are at most the max_batch bucket.
        shapes = [(n, True) for n in sizes]
        shapes += [(n, False) for n in sizes if n <= bucket(self.max_batch)]
        for n, pieces in shapes:
            ro, _ = self._step_obj.layout(n)
            sampling, statics = self._sampling_inputs([None] * ro, ro)
            packed, _, _ = self._packed([], [], n)
            self._compiled_step(n, statics, pieces)(gpk.from_numpy(packed), self._no_tables(n),
                                                    n, *sampling, *statics,
                                                    pieces).to_numpy()  # fmt: skip
        # A cold kernel cache serves the first steps from quick builds (two tiers): serve
        # with the optimised ones.
        gpk.wait_for_compiles()
        return len(shapes)

    # -- the engine thread --------------------------------------------------------------
    def _loop(self) -> None:
        # idle: the last pass launched nothing and had nothing in flight to read back, so
        # nothing changes until a command comes (a running row with no token left to
        # make waits for its read-back, which is in flight; without this the loop spun).
        idle = False
        while not self._stop:
            busy = not idle and bool(self._running or self._prefilling or self._pending
                                     or self._inflight)  # fmt: skip
            cmd = None
            if not busy:
                t0 = time.perf_counter()
                cmd = self._inbox.get()
                t1 = time.perf_counter()
                self._times["idle"] += (t1 - t0) * 1e3
                self._idle_log.append((t0, t1))
            if cmd is not None:
                self._handle(cmd)
            self._drain()
            if self._stop:
                break
            self._start_admitted()
            launched = self._step()
            idle = not launched and not self._inflight
            # One engine step stays in flight while the next is launched; with nothing
            # launched, everything is read back (the loop then waits for requests). The
            # hooks run after each step read back, so a step's tokens are handed on before
            # the engine waits for the next one.
            while len(self._inflight) > (LOOKAHEAD if launched else 0):
                self._retire()
                self._run_step_hooks()
            while len(self._inflight) > 1 and self._landed():
                self._retire()
                self._run_step_hooks()
            self._run_step_hooks()  # events of commands (cancels, rejections)
        while self._inflight:
            self._retire()
        for req in list(self._by_id.values()):
            self._end(req, error=errors.GPUKitError("the engine stopped"))
        self._run_step_hooks()

    def _run_step_hooks(self) -> None:
        run_hooks(self._step_hooks)

    def _drain(self) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(cmd)

    def _now(self) -> float:
        return time.monotonic() * 1e3

    def _handle(self, cmd: tuple[str, Any]) -> None:
        kind, req = cmd
        if kind == "stop":
            self._stop = True
        elif kind == "add":
            self._counts["submitted"] += 1
            need = blocks_for(len(req.prompt) + req.max_tokens, self.block_size)
            tid, status, reason, others = self.core.submit(
                req.tenant, need * self.block_bytes, now=self._now(), qos=req.qos,
                priority=req.priority)  # fmt: skip
            if status == "rejected":
                with self._lock:
                    self._waiting -= 1
                self._counts["rejected"] += 1
                req.ended = True
                req.sink(Event("error", error=errors.AdmissionRejected(
                    f"request rejected by the scheduler: {reason}", reason or "")))  # fmt: skip
                return
            req.task = tid
            self._pending[tid] = req
            self._by_id[req.id] = req
        elif kind == "cancel" and not req.ended and req.id in self._by_id:
            self._counts["cancelled"] += 1
            self._end(req, "cancelled")

    def _start_admitted(self) -> None:
        """Start what the scheduler lets start, while the batch has room."""
        while self._pending and self._tok_free:
            picked = self.core.pick_and_start(self._now())
            if picked is None:
                return
            req = self._pending.pop(picked[0])
            with self._lock:
                self._waiting -= 1
            total = len(req.prompt) + req.max_tokens
            req.blocks = self._blocks_for(req, blocks_for(total, self.block_size))
            req.rng = np.random.default_rng(req.params.seed)
            req.tok_slot = self._tok_free.pop()
            self._prefilling.append(req)

    def _blocks_for(self, req: Request, need: int) -> list[int]:
        """A starting request's blocks, all its own. With prefix caching it names its
        prompt's full blocks (req.names) and, where its second block is cached or will be
        computed by a request that started before it, first prefills its first block
        alone (req.probe): _share then swaps its next blocks for cached ones."""
        out = self.blocks.allocate(need)
        if self.prefix_caching:
            bs = self.block_size
            req.names = block_names(req.prompt, bs)
            second = req.names[1] if (len(req.prompt) - 1) // bs > 1 else None
            req.probe = second is not None and (second in self._coming
                                                or self.blocks.is_named(second))  # fmt: skip
            if len(req.names) > 1:
                self._coming[req.names[1]] = self._coming.get(req.names[1], 0) + 1
        return out

    def _share(self, req: Request) -> None:
        """Its first block prefilled: swap the request's next blocks for the cached blocks
        of its prompt's longest named prefix, up to the block before the one holding the
        prompt's last token (that token is computed, for the first new token's logits),
        and jump its prefill past them. Blocks named by this step's earlier pieces count:
        the request reads them from its next step on. The first block stays its own: the attention
        kernels tell a prompt's rows from other sequences' by their first block, so no two
        sequences may share one."""
        req.probe = False
        bs = self.block_size
        found = self.blocks.match(req.names[: (len(req.prompt) - 1) // bs])
        self.blocks.release(found[:1])
        shared = found[1:]
        if not shared:
            return
        k = len(shared)
        self.blocks.release(req.blocks[1 : 1 + k])  # never written: the first piece ended
        req.blocks[1 : 1 + k] = shared
        req.prefilled += k * bs
        req.named = 1 + k
        req.cached = k * bs
        self._counts["prefix_hit_tokens"] += k * bs

    def _forget_coming(self, req: Request) -> None:
        """Its prompt's blocks are computed (or never will be): no longer coming."""
        if len(req.names) > 1:
            name = req.names[1]
            left = self._coming[name] - 1
            if left:
                self._coming[name] = left
            else:
                del self._coming[name]

    def _name_blocks(self, req: Request, written: int) -> None:
        """Name the request's blocks whose positions below `written` are all stored (or
        their stores launched) and whose tokens are named (req.names)."""
        if not self.prefix_caching:
            return
        full = min(written // self.block_size, len(req.names))
        for j in range(req.named, full):
            self.blocks.name(req.blocks[j], req.names[j])
        req.named = max(req.named, full)

    def _name_generated(self, req: Request) -> None:
        """At a request's end, name its blocks of generated tokens too (a chat's next turn
        resends the reply): the positions fed to launched steps, whose tokens are known."""
        if not self.prefix_caching or not req.blocks or req.prefilled < len(req.prompt):
            return
        fed = min(len(req.generated), max(0, req.scheduled - 1))
        if fed:
            bs, have = self.block_size, len(req.names)
            tokens = [*req.prompt[have * bs :], *req.generated[:fed]]
            req.names += block_names(tokens, bs, req.names[-1] if have else b"")
        self._name_blocks(req, len(req.prompt) + fed)

    def _end(self, req: Request, reason: str | None = None,
             error: BaseException | None = None) -> None:  # fmt: skip
        """Retire a request: blocks back to the pool, the reservation back to the scheduler."""
        if req.ended:
            return
        req.ended = True
        req.ended_at = time.perf_counter()
        self._timeline.append((req.id, len(req.prompt), len(req.generated),
                               "error" if error is not None else reason, req.arrived,
                               req.submitted, req.started, req.prefilled_at,
                               req.first_token, req.ended_at))  # fmt: skip
        self._by_id.pop(req.id, None)
        if req.task in self._pending:  # never started: withdraw it
            self._pending.pop(req.task)
            self.core.cancel(req.task)
            with self._lock:
                self._waiting -= 1
        else:
            if req in self._running:
                self._running.remove(req)
                self._batch_version += 1
            if req in self._prefilling:
                self._prefilling.remove(req)
            # Steps still in flight may store into these blocks and this token slot: they
            # run before anything launched later on the stream, so a new owner's writes win
            # (and a named block's positions were all written by steps launched earlier).
            self._name_generated(req)
            if req.prefilled < len(req.prompt):
                self._forget_coming(req)
            self.blocks.release(req.blocks)
            req.blocks = []
            if req.tok_slot >= 0:
                self._tok_free.append(req.tok_slot)
                req.tok_slot = -1
            if req.task >= 0:
                (self.core.fail if error else self.core.complete)(req.task, 0.0, self._now())
        if error is not None:
            self._counts["failed"] += 1
            req.sink(Event("error", error=error))
        else:
            self._counts["finished"] += 1
            req.sink(Event("done", finish_reason=reason))

    def _emit(self, req: Request, tok: int) -> None:
        req.generated.append(tok)
        first = len(req.generated) == 1
        if first:
            req.first_token = time.perf_counter()
        self._counts["tokens"] += 1
        req.sink(Event("token", token=tok, cached_tokens=req.cached if first else 0))
        if tok in req.stop_ids:
            self._end(req, "stop")
        elif len(req.generated) >= req.max_tokens:
            self._end(req, "length")

    def _step(self) -> bool:
        """Launch the next engine step: a token for each running sequence and, with what
        the token budget has left, pieces of the prompts waiting; whether anything was
        launched."""
        rows = self._decode_rows()
        pieces = self._prefill_pieces(self._budget(rows) - len(rows))
        if not rows and not pieces:
            return False
        t0 = time.perf_counter()
        try:
            launch = self._launch(rows, pieces)
        except Exception as e:  # a failing request must not take the server down
            log.exception("engine step failed")
            for r in [*rows, *(r for r, _ in pieces)]:
                self._end(r, error=e)
            return True
        finally:
            self._times["launch"] += (time.perf_counter() - t0) * 1e3
        self._inflight.append([launch])
        return True

    def _landed(self) -> bool:
        """Whether the oldest step in flight has its tokens on the host (reading them
        back waits for nothing)."""
        return all(transfer.done() for _, transfer, _ in self._inflight[0])

    def _decode_rows(self) -> list[Request]:
        """The running sequences with a token left to schedule, up to max_batch: the last
        step's list while the batch is unchanged and its row with the fewest tokens left
        has one (every row gains one scheduled token a step), so a decode step of an
        unchanged batch walks no rows."""
        version, rows, _, limit = self._rows_cache
        if version == self._batch_version and limit is not None and (
                limit.scheduled < limit.max_tokens):  # fmt: skip
            return rows
        rows = [r for r in self._running if r.scheduled < r.max_tokens][: self.max_batch]
        limit = min(rows, key=lambda r: r.max_tokens - r.scheduled) if rows else None
        self._rows_cache = (self._batch_version, rows, tuple(r.tok_slot for r in rows), limit)
        return rows

    def _slots_key(self, rows: Sequence[Request]) -> tuple[int, ...]:
        """The rows' token slots (the _decode_rows list's, computed once)."""
        cached = self._rows_cache
        return cached[2] if rows is cached[1] else tuple(r.tok_slot for r in rows)

    def _retire(self) -> None:
        """Read back the oldest engine step in flight and stream its tokens."""
        for rows, transfer, record in self._inflight.popleft():
            t0 = time.perf_counter()
            try:
                toks = transfer.result()
            except Exception as e:
                log.exception("a step failed")
                for r in rows:
                    if r is not None:
                        self._end(r, error=e)
                continue
            t1 = time.perf_counter()
            for r, tok in zip(rows, toks.tolist(), strict=False):
                if r is not None and not r.ended:
                    self._emit(r, tok)
            record[5] = t2 = time.perf_counter()
            self._times["wait"] += (t1 - t0) * 1e3
            self._times["emit"] += (t2 - t1) * 1e3

    def _sampling_inputs(self, rows: Sequence[Request | None], b: int
                         ) -> tuple[list[GPUArray], tuple[bool, int, bool]]:  # fmt: skip
        ps = [r.params if r is not None else SamplingParams() for r in rows]
        sampled = any(not p.greedy for p in ps)
        if not sampled:
            cached = self._greedy_inputs.get(b)
            if cached is None:
                cached = self._greedy_inputs[b] = [
                    gpk.from_numpy(a) for a in (np.zeros(b, np.float32), np.zeros(b, np.int64),
                                                np.ones(b, np.float32),
                                                np.full((b, 1), 0.5, np.float32))]  # fmt: skip
            return cached, (False, 0, False)
        k = max((p.top_k for p in ps if not p.greedy and p.top_k < self.vocab), default=0)
        use_top_p = any(not p.greedy and p.top_p < 1 for p in ps)
        temp = np.zeros(b, np.float32)
        top_k = np.zeros(b, np.int64)
        top_p = np.ones(b, np.float32)
        width = self.vocab if sampled else 1
        noise = np.full((b, width), 0.5, np.float32)
        for i, (r, p) in enumerate(zip(rows, ps, strict=False)):
            if r is None or p.greedy:
                continue
            temp[i], top_p[i] = p.temperature, p.top_p
            top_k[i] = p.top_k if p.top_k < self.vocab else 0
            noise[i] = r.rng.random(self.vocab, dtype=np.float32)
        arrays = [gpk.from_numpy(a) for a in (temp, top_k, top_p, noise)]
        return arrays, (sampled, k_rounds(k), use_top_p)

    def _compiled_step(self, n: int, statics: tuple[Any, ...], pieces: bool = True) -> Any:
        """The compiled step of n tokens, these sampling statics, and with or without
        prompt pieces (a decode-only step's graph launches no piece kernel)."""
        key = (n, pieces, *statics)
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = gpk.compile(self._step_obj.run)
        return fn

    def _no_tables(self, n: int) -> GPUArray:
        """An n-token step's table rows that write nothing (uploaded once per size)."""
        got = self._idle_tables.get(n)
        if got is None:
            rt = self._step_obj.layout(n)[1]
            empty = np.zeros((rt, 1 + self.max_blocks), np.int32)
            empty[:, 0] = -1
            got = self._idle_tables[n] = gpk.from_numpy(empty)
        return got

    def _budget(self, rows: Sequence[Request]) -> int:
        """The token budget of a step with these decode rows: prefill_step_tokens for a
        step of prompts alone, else its share per decode row (rounded down to a power of
        two, so the launch sizes stay the ones warmup traces) or step_tokens, the more."""
        if not rows:
            return self.prefill_step_tokens
        share = self.prefill_step_tokens // len(rows)
        return max(self.step_tokens, 1 << (share.bit_length() - 1) if share else 0)

    def _step_size(self, tokens: int, budget: int) -> int:
        """The launch size of a step of `tokens` tokens under `budget`: the next power of
        two, or the budget itself when that is smaller."""
        return min(bucket(tokens), budget)

    def _prefill_pieces(self, budget: int) -> list[tuple[Request, int]]:
        """The next prompt pieces, oldest prompt first, within budget tokens: at most
        prefill_chunk tokens of one prompt and STEP_PROMPTS prompts. A prompt's piece
        continues from its prefilled tokens."""
        pieces: list[tuple[Request, int]] = []
        for req in self._prefilling:
            if budget <= 0 or len(pieces) == STEP_PROMPTS:
                break
            n = min(len(req.prompt) - req.prefilled, self.prefill_chunk, budget)
            if req.probe:  # its first block alone: cached blocks may follow (_share)
                n = min(n, self.block_size - req.prefilled)
            pieces.append((req, n))
            budget -= n
        return pieces

    def _packed(self, rows: Sequence[Request], pieces: Sequence[tuple[Request, int]], n: int
                ) -> tuple[np.ndarray, np.ndarray, list[Request | None]]:  # fmt: skip
        """A step's uploads (see _Step.run: packed, tables) and its output rows' requests
        (None: a row whose token nobody takes): the rows' decode tokens first, then the
        pieces' prompt tokens, each piece writing its prompt's block table; a piece that
        ends its prompt samples the prompt's first token after its last one."""
        ro, rt = self._step_obj.layout(n)
        packed = np.zeros(3 * n + 2 * ro, np.int64)
        tables = np.zeros((rt, 1 + self.max_blocks), np.int32)
        tok, pos, tslot = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n]
        out_at, out_slot = packed[3 * n : 3 * n + ro], packed[3 * n + ro :]
        d = len(rows)
        tslot[:] = out_slot[:] = tables[:, 0] = -1
        tok[:d] = pos[:d] = -1
        tslot[:d] = out_slot[:d] = [r.tok_slot for r in rows]
        out_at[:d] = np.arange(d)
        outs: list[Request | None] = [*rows, *([None] * (ro - d))]
        at, k = d, d
        for j, (req, cnt) in enumerate(pieces):
            start = req.prefilled
            tok[at : at + cnt] = req.prompt[start : start + cnt]
            pos[at : at + cnt] = np.arange(start, start + cnt)
            tslot[at : at + cnt] = req.tok_slot
            tables[j, 0] = req.tok_slot
            tables[j, 1 : 1 + len(req.blocks)] = req.blocks
            at += cnt
            if start + cnt == len(req.prompt):
                out_at[k], out_slot[k], outs[k] = at - 1, req.tok_slot, req
                k += 1
        return packed, tables, outs

    def _launch(self, rows: Sequence[Request], pieces: Sequence[tuple[Request, int]]) -> Launch:
        """Launch one step: a token for each of rows (each has a token left to make) and
        the prompt pieces; a prompt that is done moves to the running batch (its first
        token is stored on the device, and streamed once read back). A decode-only step
        of the batch before uploads nothing. Returns the output rows and their tokens'
        transfer."""
        now = time.perf_counter()
        used = len(rows) + sum(cnt for _, cnt in pieces)
        n = self._step_size(used, self._budget(rows))
        key = (n, self._slots_key(rows))
        if pieces or key != self._decode_key or self._decode_upload is None:
            packed, tables, outs = self._packed(rows, pieces, n)
            upload = gpk.from_numpy(packed)
            self._decode_key, self._decode_upload = (key, upload) if not pieces else ((), None)
            self._decode_outs = outs
        else:
            upload, outs = self._decode_upload, self._decode_outs
        # A step that prefills nothing writes no table: its table rows never change.
        table_rows = gpk.from_numpy(tables) if pieces else self._no_tables(n)
        greedy = self._greedy_step
        if greedy is not None and greedy[0] is outs:
            sampling, statics = greedy[1]
        else:
            sampling, statics = self._sampling_inputs(outs, len(outs))
            self._greedy_step = (outs, (sampling, statics)) if not statics[0] else None
        has_pieces = bool(pieces)
        tok = self._compiled_step(n, statics, has_pieces)(upload, table_rows, n, *sampling,
                                                          *statics, has_pieces)  # fmt: skip
        for r in rows:
            r.scheduled += 1
        for req, cnt in pieces:
            if req.prefilled == 0:
                req.started = now
            req.prefilled += cnt
            if req.probe and req.prefilled == self.block_size:
                self._share(req)
            self._name_blocks(req, req.prefilled)
            if req.prefilled == len(req.prompt):
                self._forget_coming(req)
                req.prefilled_at = now
                req.scheduled = 1
                self._prefilling.remove(req)
                self._running.append(req)
                self._batch_version += 1
        c = self._counts
        c["steps"] += 1
        c["decode_steps"] += bool(rows)
        c["prefill_steps"] += bool(pieces)
        c["mixed_steps"] += bool(rows and pieces)
        c["prefill_tokens"] += used - len(rows)
        c["max_step_tokens"] = max(c["max_step_tokens"], n)
        transfer = tok.to_numpy_async()
        if self._record_wait is not None:
            pool = self._wait_events
            transfer = _SleepingTransfer(transfer, self._record_wait(pool), pool)
        record = [now, time.perf_counter(), len(rows), used - len(rows), n, 0.0]
        self._step_log.append(record)
        return outs, transfer, record


class _SleepingTransfer:
    """A step's token read-back whose wait first sleeps on the step's blocking-sync event
    (SLEEP_WAIT), so only the copy's few microseconds after it are spun through; the
    event goes back to the engine's pool once waited for."""

    __slots__ = ("_transfer", "_event", "_pool")

    def __init__(self, transfer: Any, event: Any, pool: list[Any]) -> None:
        self._transfer, self._event, self._pool = transfer, event, pool

    def done(self) -> bool:
        return bool(self._transfer.done())

    def result(self) -> np.ndarray:
        ev = self._event
        if ev is not None:
            self._event = None
            if SLEEP_WAIT and not self._transfer.done():
                ev.synchronize()  # lets go of the interpreter lock, as the transfer's wait
            self._pool.append(ev)
        return self._transfer.result()


def _wait_event_recorder() -> Callable[[list[Any]], Any] | None:
    """On the CUDA backend, what records a step's blocking-sync event on the backend's
    stream after the step's launch (a free one of `pool`, or a new one); None elsewhere
    (the CPU backend's read-backs are done when made)."""
    if gpk.backend_name() != "cuda":
        return None
    from pygpukit import _native
    from pygpukit.backends import get_backend
    from pygpukit.backends.cuda.transfers import stream_id

    backend: Any = get_backend()  # the CUDA backend: its stream is the launches'

    def record(pool: list[Any]) -> Any:
        ev = pool.pop() if pool else _native.Event(False, True)  # no timing, blocking sync
        ev.record(stream_id(backend.stream))
        return ev

    return record


def _buckets(least: int, most: int) -> list[int]:
    """least, 2 * least, ... up to bucket(most, least)."""
    out = [least]
    while out[-1] < most:
        out.append(out[-1] * 2)
    return out


def _default_memory(kv_memory: int | None) -> int:
    if kv_memory is not None:
        if not isinstance(kv_memory, int) or kv_memory < 1:
            raise errors.GPUKitValueError(f"kv_memory must be a positive byte count, got "
                                          f"{kv_memory!r}")  # fmt: skip
        return kv_memory
    if gpk.backend_name() == "cuda":
        from pygpukit import _native

        return int(_native.mem_get_info()[0]) // 4
    return 256 << 20


__all__ = ["Engine", "Event", "Overloaded", "Request", "bucket", "check_request", "run_hooks"]
