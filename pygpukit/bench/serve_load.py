"""Load generator for `pygpukit serve`: N concurrent streaming clients.

    python -m pygpukit.bench.serve_load --clients 16 64 256          # TinyLlama shape, bf16
    python -m pygpukit.bench.serve_load --clients 64 --requests 8    # sustained: 512 requests
    python -m pygpukit.bench.serve_load --model tiny --clients 4 --max-tokens 8   # CPU smoke

Each client sends one completion request with a random 128-512 token prompt (token ids)
and asks for 128 tokens (EOS ignored), streaming, against a server on 127.0.0.1 with random
weights; with `--requests K` each client sends K such requests one after another (the next
as its last stream ends), so N streams stay in flight as in vLLM's benchmark_serving with
`--max-concurrency N`, and the round measures sustained load rather than one burst.
Reported: total output tok/s, p50/p99 time to first token, p50/p99 inter-token latency
(between stream chunks: a stream that falls behind sends its queued tokens in one chunk).
The clients run in --procs worker processes (default: up to 8), so parsing their streams
does not take the server's interpreter lock, as a real load generator on another host
would not; --procs 0 runs them in this process.
`--step-tokens` sets the engine's token budget per step (decode rows + prompt tokens).
`--shared-prefix N` starts every prompt with the same N random tokens (a system prompt;
new ones each round): the engine's prefix cache computes them once.
The server's HTTP front end runs in a process of its own (as `pygpukit serve` does);
`--single-process` serves it from a thread beside the engine instead (each row's
"front_end": "process" or "thread"); `--front-ends N` runs N such processes on the port
(the row's "front_ends").

Each client process reads its streams with httpx, splitting off each event's line and
parsing its JSON (the row's "client": "httpx"), as vLLM's benchmark_serving does;
`--client openai` reads them through the `openai` client instead, whose typed object per
chunk cost enough of a client process (eight streams a process) that its streams fell
behind and caught up in clumps: on the H200 at 64 clients 24.1-26.7k tok/s, inter-token
p99 5.8-11.6 ms (max 7-22) against 27.2-27.8k and 4.85-5.08 ms (max 5.2-10) with httpx in
the same runs, the server the same.

The clients are warm when a round starts (each row's "warm_clients"): each client process
first completes as many small requests at once (an 8-token prompt, one token) as it has
streams, so its connections are open and the openai client's one-time set-up (about 80 ms
of its first request) is done, as vLLM's benchmark_serving sends a warm-up request; the
round starts when every process is warm (a barrier), and nothing of the warm-up is in the
row (its steps, its requests' timelines). The clients send the prompt ids through the
openai client's `extra_body` with `--client openai` (the row's "prompt_ids_in"): the same
JSON body, without the client library's type transform of each id, which cost 3.5-4 ms
of a client process per 320-id prompt and so spread a process's starts over tens of ms.
`--step-times` first times the engine's decode step alone (inputs, the captured graph,
the tokens read back) at batch 1, 16 and 64 with 512-token contexts. `--peer` also times
transformers' continuous batching (`generate_batch`) on the same prompts, where
transformers and torch are installed.

Each round's row also says where its wall went (`round_timeline`, from the engine's
Engine.timeline on the clients' clock, all in ms after the round's start): when the
requests reached the front end and the engine, when their prompts started and finished,
the engine's last token against the clients' last chunk, the round's steps by kind and
the engine thread's idle time; on a GPU, the steps' own GPU time (CUDA events around each
launch, `GpuMarks`) and the GPU's idle time between them. `--timeline PATH` saves each
round's whole timeline (every request, step, client stream) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Step token budgets whose mixed steps (the largest batch's decode rows and prompt pieces
# filling the rest, one launch) --step-times measures.
MIXED_BUDGETS = (128, 256, 512, 1024, 2048)


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else float("nan")


def _prompts(n: int, vocab: int, lo: int, hi: int, seed: int | list[int],
             prefix: Sequence[int] = ()) -> list[list[int]]:  # fmt: skip
    """n random prompts of lo-hi tokens, each after `prefix` (a shared system prompt)."""
    rng = np.random.default_rng(seed)
    return [[*prefix, *(int(t) for t in rng.integers(3, vocab, size=int(rng.integers(lo, hi + 1))))]
            for _ in range(n)]  # fmt: skip


async def _client(client: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    n = 0
    # The ids go in extra_body (it replaces prompt="" in the JSON): the same request body,
    # without the client's type transform of each id (3.5-4 ms of the client process per
    # 320-id prompt, which spread a process's 8 starts over 30-60 ms of the round).
    stream = await client.completions.create(model="bench", prompt="", max_tokens=max_tokens,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"prompt": prompt,
                                                         "ignore_eos": True})  # fmt: skip
    async for chunk in stream:
        if chunk.choices:
            stamps.append(time.perf_counter())
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    return {"start": t0, "stamps": stamps, "tokens": n}


async def _client_httpx(client: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """_client's stream read with httpx alone: each server-sent event's line split off and
    its JSON parsed (json.loads), as vLLM's benchmark_serving reads its streams, without
    the openai client's typed objects per chunk."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    n = 0
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"serve_load: HTTP {resp.status_code}: {(await resp.aread())!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    return {"start": t0, "stamps": stamps, "tokens": n}


CLIENTS = ("openai", "httpx")  # --client: how a client process reads its streams


def _client_module(kind: str) -> Any:
    """The module a client of this kind (CLIENTS) is made from."""
    if kind == "openai":
        import openai

        return openai
    try:
        import httpx
    except ImportError:  # openai 3 depends on the renamed fork
        import httpx2 as httpx  # type: ignore[no-redef]
    return httpx


WARMUP_PROMPT = 8  # tokens of each warm-up request's prompt (it asks for one token)


async def _clients(url: str, seqs: list[list[list[int]]], max_tokens: int,
                   go: Callable[[], None], kind: str = "httpx"
                   ) -> list[dict[str, Any]]:  # fmt: skip
    """The streams of `seqs` through one client library (`kind`, CLIENTS): each sequence is one
    client's prompts, sent one after another (the next when the last stream ended). Warmed
    first: a small request per client at once (an 8-token prompt, one token), so the
    connections are open and the one-time set-up done (about 80 ms of the first request on
    the H200's host) before the timed round, as vLLM's benchmark_serving sends a warm-up
    request. Then go() (returns when the round starts) and the timed streams, one result per
    request."""
    lib = _client_module(kind)
    if kind == "httpx":
        client: Any = lib.AsyncClient(base_url=url, timeout=3600,
                                      limits=lib.Limits(max_connections=None))  # fmt: skip
        one, close = _client_httpx, client.aclose
    else:
        client = lib.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                 timeout=3600)  # fmt: skip
        one, close = _client, client.close
    await asyncio.gather(*(one(client, seq[0][:WARMUP_PROMPT], 1) for seq in seqs))
    go()

    async def serial(seq: list[list[int]]) -> list[dict[str, Any]]:
        return [await one(client, p, max_tokens) for p in seq]

    res = await asyncio.gather(*(serial(seq) for seq in seqs))
    await close()
    return [r for part in res for r in part]


_start: Any = None  # the round's start barrier, in a client process (_init_worker)


def _init_worker(start: Any) -> None:
    global _start
    _start = start


def _worker(url: str, seqs: list[list[list[int]]], max_tokens: int, kind: str
            ) -> list[dict[str, Any]]:  # fmt: skip
    """One client process's share of the clients (perf_counter is the system-wide monotonic
    clock); its timed streams start when every process has warmed its client (the barrier)."""
    return asyncio.run(_clients(url, seqs, max_tokens, lambda: _start.wait(120), kind))


def _warm_worker(kind: str) -> int:
    _client_module(kind)  # imported once before the timed round
    return 0


def _round(
    url: str,
    prompts: list[list[int]],
    max_tokens: int,
    procs: int = 0,
    at_start: Callable[[], None] = lambda: None,
    kind: str = "httpx",
    requests: int = 1,
) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """One round: the row, each request's stamps, and the round's start (perf_counter).
    len(prompts) / requests clients, each sending its `requests` prompts one after another
    (1: a burst of one request a client). Every client is warm at the start (_clients);
    at_start() runs then, in this process (the warm-up requests have ended: what the
    engine counts from there is the round's)."""
    if requests < 1 or len(prompts) % requests:
        raise ValueError(f"serve_load: {len(prompts)} prompts are not {requests} a client")
    seqs = [prompts[i : i + requests] for i in range(0, len(prompts), requests)]
    procs = min(procs, len(seqs))
    t0 = 0.0

    def start() -> None:
        nonlocal t0
        at_start()
        t0 = time.perf_counter()

    if procs <= 0:
        res = asyncio.run(_clients(url, seqs, max_tokens, start, kind))
    else:
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(procs + 1)  # each process once warm, and this one
        with ctx.Pool(procs, _init_worker, (barrier,)) as pool:
            pool.map(_warm_worker, [kind] * procs, chunksize=1)
            shares = [(url, seqs[i::procs], max_tokens, kind) for i in range(procs)]
            parts = pool.starmap_async(_worker, shares, chunksize=1)
            # Every process warm and waiting: the round starts (t0) as this one, the last,
            # lets them all go.
            end = time.monotonic() + 120
            while barrier.n_waiting < procs and not parts.ready() and time.monotonic() < end:
                time.sleep(0.001)
            start()
            barrier.wait(120)
            res = [r for part in parts.get() for r in part]
    wall = max(r["stamps"][-1] if r["stamps"] else t0 for r in res) - t0
    ttft = [r["stamps"][0] - r["start"] for r in res if r["stamps"]]
    itl = [b - a for r in res for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    tokens = sum(r["tokens"] for r in res)
    row = {"clients": len(seqs), "requests_per_client": requests, "output_tokens": tokens,
           "wall_s": wall, "output_tok_s": tokens / wall, "ttft_p50_ms": 1e3 * _pct(ttft, 50),
           "ttft_p99_ms": 1e3 * _pct(ttft, 99), "itl_p50_ms": 1e3 * _pct(itl, 50),
           "itl_p99_ms": 1e3 * _pct(itl, 99), "itl_max_ms": 1e3 * max(itl, default=0.0),
           "client_procs": procs, "client": kind, "warm_clients": True,
           "prompt_ids_in": "extra_body" if kind == "openai" else "body"}  # fmt: skip
    return row, res, t0


class GpuMarks:
    """Each engine step's time on the GPU: a CUDA event recorded before and after each of
    the engine's launches (its _launch, wrapped on this engine object until close()),
    placed on the host's clock through a reference event recorded with the GPU idle."""

    def __init__(self, engine: Any, events: int = 1024) -> None:
        import pygpukit as gpk

        self.engine, self._gpk = engine, gpk
        self._pool = [gpk.Event() for _ in range(2 * events)]  # made before the round
        self._marks: list[tuple[Any, Any]] = []
        gpk.synchronize()
        self._ref = gpk.Event().record()
        self._ref.synchronize()
        self._t_ref = time.perf_counter()
        launch = engine._launch

        def marked(rows: Any, pieces: Any) -> Any:
            a = (self._pool.pop() if self._pool else gpk.Event()).record()
            out = launch(rows, pieces)
            self._marks.append((a, (self._pool.pop() if self._pool else gpk.Event()).record()))
            return out

        engine._launch = marked

    def close(self) -> list[tuple[float, float]]:
        """Unwrap the engine's launch; each marked step's GPU start and end (perf_counter
        seconds), in launch order."""
        del self.engine._launch
        self._gpk.synchronize()
        ms = self._ref.elapsed_time
        return [(self._t_ref + ms(a) / 1e3, self._t_ref + ms(b) / 1e3) for a, b in self._marks]


def round_timeline(tl: dict[str, Any], res: Sequence[dict[str, Any]], t0: float,
                   gpu: Sequence[tuple[float, float]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Where a round's wall went (ms after its start t0): Engine.timeline of the round
    (its requests, steps and idle periods), the clients' results and, on a GPU, the
    steps' GPU start and end (GpuMarks). The wall = gpu_first (before the GPU's first
    step) + gpu_busy (the steps' own GPU time) + gpu_gaps (the GPU idle between them) +
    tail (after its last step's end until the clients' last chunk); tl_handoff_*: a step's
    GPU end to its tokens' hand-off by the engine thread (p50, p99)."""
    reqs = tl["requests"]
    end = max((r["stamps"][-1] for r in res if r["stamps"]), default=t0)

    def ms(t: float) -> float:
        return 1e3 * (t - t0)

    def last(key: str) -> float:
        return max((ms(r[key]) for r in reqs if r[key]), default=float("nan"))

    out: dict[str, Any] = {
        "tl_client_start_last_ms": max((ms(r["start"]) for r in res), default=float("nan")),
        "tl_arrived_first_ms": min((ms(r["arrived"]) for r in reqs), default=float("nan")),
        "tl_arrived_p50_ms": _pct([ms(r["arrived"]) for r in reqs], 50),
    }
    for key in ("arrived", "submitted", "started", "prefilled", "first_token", "ended"):
        out[f"tl_{key}_last_ms"] = last(key)
    out["tl_queued_max_ms"] = max((1e3 * (r["started"] - r["submitted"]) for r in reqs
                                   if r["started"]), default=float("nan"))  # fmt: skip
    out["tl_tail_ms"] = ms(end) - out["tl_ended_last_ms"]
    steps = [s for s in tl["steps"] if t0 <= s["start"] <= end]
    kinds = [("decode" if not s["prompt_tokens"] else "prefill" if not s["rows"] else "mixed")
             for s in steps]  # fmt: skip
    for kind in ("decode", "mixed", "prefill"):
        out[f"tl_{kind}_steps"] = kinds.count(kind)
    last_in = max((r["submitted"] for r in reqs), default=end)
    out["tl_steps_before_last_submit"] = sum(s["start"] < last_in for s in steps)
    out["tl_first_step_ms"] = ms(steps[0]["start"]) if steps else float("nan")
    out["tl_engine_idle_ms"] = sum(1e3 * max(0.0, min(i["end"], end) - max(i["start"], t0))
                                   for i in tl["idle"])  # fmt: skip
    marks = [g for g in (gpu or []) if t0 <= g[0] <= end]
    if marks:
        out["tl_gpu_first_ms"] = ms(marks[0][0])
        out["tl_gpu_busy_ms"] = sum(1e3 * (b - a) for a, b in marks)
        out["tl_gpu_gaps_ms"] = sum(1e3 * max(0.0, b[0] - a[1])
                                    for a, b in zip(marks, marks[1:], strict=False))  # fmt: skip
        out["tl_gpu_gaps_after_last_submit_ms"] = sum(
            1e3 * max(0.0, b[0] - a[1]) for a, b in zip(marks, marks[1:], strict=False)
            if a[1] >= last_in)  # fmt: skip
        out["tl_gpu_last_ms"] = ms(marks[-1][1])
        # The read-back: each step's GPU end to its tokens' hand-off (marks and steps are
        # both in launch order and end with the round's last launch).
        paired = zip(list(gpu or [])[-len(steps) :] if steps else [], steps, strict=False)
        late = [1e3 * (s["emitted"] - g[1]) for g, s in paired if s["emitted"]]
        out["tl_handoff_p50_ms"], out["tl_handoff_p99_ms"] = _pct(late, 50), _pct(late, 99)
    return out


def decode_rows(engine: Any, b: int, context: int, spare: int,
                 rng: np.random.Generator) -> list[Any]:  # fmt: skip
    """b running requests (not started: the caller drives the engine) whose last token
    is at position `context`, as if their prompts had been prefilled: each one's blocks,
    token slot, and its device state (block table, position) stored as a prefill would."""
    import pygpukit as gpk
    from pygpukit.serve.engine import Request

    reqs = []
    table = np.zeros((b, engine.max_blocks), np.int32)
    for i in range(b):
        r = Request([int(t) for t in rng.integers(3, engine.vocab, size=context)],
                    spare, lambda ev: None)  # fmt: skip
        r.blocks = engine.blocks.allocate(-(-(context + spare) // engine.block_size))
        r.prefilled, r.scheduled, r.tok_slot = context, 1, engine._tok_free.pop()
        table[i, : len(r.blocks)] = r.blocks
        reqs.append(r)
    st = engine._step_obj
    at = gpk.from_numpy(np.array([r.tok_slot for r in reqs], np.int64))
    gpk.nn.paged_write(st.tables, gpk.from_numpy(table).reshape(b, 1, -1), at)
    gpk.nn.paged_write(st.pos, gpk.from_numpy(np.full((b, 1, 1), context, np.int64)), at)
    return reqs


def fills(engine: Any, budget: int, b: int) -> bool:
    """Whether fresh prompts can fill `budget` tokens beside b decode rows: pieces of at
    most prefill_chunk tokens of (max_model_len - 1)-token prompts, each taking a free
    token slot besides the rows' (at most STEP_PROMPTS)."""
    from pygpukit.serve.engine import MIN_PREFILL_TOKENS, STEP_PROMPTS

    piece = min(engine.prefill_chunk, engine.max_model_len - 1)
    need = -(-(budget - b) // piece)
    return (budget >= b + MIN_PREFILL_TOKENS and need <= STEP_PROMPTS
            and len(engine._tok_free) >= b + need)  # fmt: skip


def fresh_prompts(engine: Any, tokens: int, rng: np.random.Generator
                  ) -> tuple[list[tuple[Any, int]], list[Any]]:  # fmt: skip
    """Pieces of fresh (max_model_len - 1)-token prompts filling `tokens` tokens of a step
    (as the engine cuts them), and the prompts: each has its blocks and a token slot; give
    them back with drop_prompts once the step is launched."""
    from pygpukit.serve.engine import Request

    long = engine.max_model_len - 1
    fresh = []
    for _ in range(-(-tokens // min(engine.prefill_chunk, long))):
        r = Request([int(t) for t in rng.integers(3, engine.vocab, size=long)], 1,
                    lambda ev: None)  # fmt: skip
        r.blocks = engine.blocks.allocate(-(-(long + 1) // engine.block_size))
        r.tok_slot = engine._tok_free.pop()
        fresh.append(r)
    engine._prefilling.extend(fresh)
    return engine._prefill_pieces(tokens), fresh


def drop_prompts(engine: Any, fresh: Sequence[Any]) -> None:
    """Take fresh_prompts' prompts out of the engine after their step's launch: one the
    launch finished moved to the running batch, and its token is not streamed (ended).
    Stream-ordered: the next owner of their blocks and token slots writes after it."""
    engine._prefilling.clear()
    engine._running[:] = [r for r in engine._running if r not in fresh]
    for r in fresh:
        r.ended = True
    give_back(engine, fresh)


def give_back(engine: Any, reqs: Sequence[Any]) -> None:
    """Return requests' blocks and token slots to the engine (decode_rows, fresh_prompts)."""
    for r in reqs:
        engine.blocks.release(r.blocks)
        engine._tok_free.append(r.tok_slot)


def step_times(engine: Any, sizes: Sequence[int], context: int, steps: int = 20,
               budgets: Sequence[int] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """The engine's decode steps alone (not started: this thread drives them) at each
    batch size, every row at `context` keys, launched as the engine does (LOOKAHEAD steps
    in flight while the one before them is read back): ms per step, median of `steps` after 3
    warm-ups (and the kernels' optimised builds). Then, for each step token budget in
    `budgets`, the mixed steps of the largest batch: one launch of its decode rows and
    fresh prompts' pieces filling the rest of the budget (as _step cuts them: at most
    prefill_chunk tokens of a prompt); budgets the free token slots cannot fill are left
    out."""
    import pygpukit as gpk
    from pygpukit.serve.engine import LOOKAHEAD

    rows_out = []
    rng = np.random.default_rng(0)

    def timed(reqs: list[Any], prefill: Any = None) -> list[float]:
        times = []
        for i in range(steps + 3):
            if i == 3:
                # The warm-ups traced the step; a cold kernel cache ran it on quick builds
                # (the first of two tiers): time the optimised kernels, as serving does
                # after Engine.warmup (a fresh H200 timed batch 1 at 3.8 ms, not 1.0).
                while engine._inflight:
                    engine._retire()
                gpk.wait_for_compiles()
            t0 = time.perf_counter()
            pieces, fresh = prefill() if prefill is not None else ([], [])
            engine._inflight.append([engine._launch(reqs, pieces)])
            drop_prompts(engine, fresh)
            while len(engine._inflight) > LOOKAHEAD:
                engine._retire()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        while engine._inflight:
            engine._retire()
        return times

    def row(kind: str, b: int, times: list[float], **extra: Any) -> dict[str, Any]:
        out = {"impl": f"pygpukit serve {kind} step", "batch": b, "context": context, **extra,
               "step_ms": 1e3 * float(np.median(times)),
               "step_ms_min": 1e3 * float(np.min(times))}  # fmt: skip
        print(json.dumps(out), flush=True)
        return out

    for b in sizes:
        reqs = decode_rows(engine, b, context, steps + 8, rng)
        rows_out.append(row("decode", b, timed(reqs)))
        give_back(engine, reqs)
    b = max(sizes)
    budget_was = engine.step_tokens
    for budget in budgets:
        if not fills(engine, budget, b):
            continue
        reqs = decode_rows(engine, b, context, steps + 8, rng)

        def prefill(budget: int = budget) -> tuple[list[Any], list[Any]]:
            return fresh_prompts(engine, budget - b, rng)

        engine.step_tokens = budget  # the launch size: the whole budget
        try:
            times = timed(reqs, prefill)
        finally:
            engine.step_tokens = budget_was
        rows_out.append(row("mixed", b, times, step_tokens=budget, prefill_tokens=budget - b))
        give_back(engine, reqs)
    return rows_out


def _engine_split(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The engine thread's time in a round by phase (ms), and its steps."""
    out: dict[str, Any] = {f"engine_{k}_ms": after["time_ms"][k] - before["time_ms"][k]
                           for k in after["time_ms"]}  # fmt: skip
    for k in ("steps", "decode_steps", "prefill_steps", "mixed_steps", "prefix_hit_tokens"):
        out[k] = after[k] - before[k]
    out["step_tokens"] = after["step_tokens"]
    out["prefill_step_tokens"] = after["prefill_step_tokens"]
    out["prefix_caching"] = after["prefix_caching"]
    return out


def transformers_peer(cfg: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """transformers' continuous batching (generate_batch) on the same prompts."""
    import torch
    import transformers

    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
    )  # fmt: skip
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    gen = transformers.GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                                        eos_token_id=-1, pad_token_id=0)  # fmt: skip
    model.generate_batch(inputs=prompts[:2], generation_config=gen)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=prompts, generation_config=gen)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = sum(len(r.generated_tokens) for r in out.values())
    return {"clients": len(prompts), "output_tokens": tokens, "wall_s": wall,
            "output_tok_s": tokens / wall, "impl": f"transformers {transformers.__version__} "
            "generate_batch"}  # fmt: skip


def run(model_name: str, clients: Sequence[int], max_tokens: int, lo: int, hi: int,
        peer: bool, kv_memory: int | None, procs: int | None = None,
        steps: bool = False, step_tokens: int | None = None,
        prefill_step_tokens: int | None = None, single_process: bool = False,
        timelines: list[dict[str, Any]] | None = None,
        front_ends: int = 1, client: str = "httpx", shared_prefix: int = 0,
        prefix_caching: bool = True, requests: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """The rounds' rows (and, into `timelines` when given, each round's whole timeline:
    the engine's, the steps' GPU marks, the clients' stamps, on the perf_counter clock)."""
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    if model_name == "tiny":
        from pygpukit.llm.tiny import write_tiny_model

        model = llm.load(write_tiny_model())
    else:
        from .llm import random_model, tinyllama_config

        model = random_model(tinyllama_config(), "bfloat16")
    cfg = model.config
    longest = shared_prefix + hi + max(max_tokens, 4)
    engine = Engine(model, max_model_len=min(cfg.max_position_embeddings, longest),
                    max_batch=max(clients), kv_memory=kv_memory,
                    max_queue=max(clients) + 8, step_tokens=step_tokens,
                    prefill_step_tokens=prefill_step_tokens,
                    prefix_caching=prefix_caching)  # fmt: skip
    rows = []
    if steps:
        sizes = [b for b in (1, 16, 64) if b <= engine.max_batch]
        # 20 timed steps and 3 warm-ups (the 8 spare positions) after the context
        rows += step_times(
            engine, sizes, max(1, min(512, engine.max_model_len - 28)), budgets=MIXED_BUDGETS
        )
    engine.warmup(hi)  # every step shape traced before the first request
    server = Server(model, engine, "bench", port=0, processes=1 if single_process else 2,
                    front_ends=front_ends).start()  # fmt: skip
    if procs is None:
        procs = min(8, max(clients))
    try:
        warm = _prompts(min(4, max(clients)), cfg.vocab_size, lo, hi, 99)
        _round(server.url, warm, 4, kind=client)  # traces the step graphs
        for i, n in enumerate(clients):
            # Each round's prompts are new (the engine's prefix cache would serve a
            # repeated one from the blocks of the round before).
            seed = n if n not in clients[:i] else [n, i]
            prefix = _prompts(1, cfg.vocab_size, shared_prefix, shared_prefix, [7, i])[0]
            prompts = _prompts(n * requests, cfg.vocab_size, lo, hi, seed, prefix)
            marks = GpuMarks(engine) if gpk.backend_name() == "cuda" else None
            snap: dict[str, Any] = {}

            def at_start(snap: dict[str, Any] = snap) -> None:  # the clients' warm-ups ended
                snap["since"] = time.perf_counter()
                snap["before"] = engine.stats()

            got, res, t0 = _round(
                server.url, prompts, max_tokens, procs, at_start, client, requests
            )
            before, since = snap["before"], snap["since"]
            gpu = marks.close() if marks is not None else None
            row = {"impl": "pygpukit serve", **got, "shared_prefix": shared_prefix,
                   "front_end": "thread" if single_process else "process",
                   "front_ends": front_ends}  # fmt: skip
            after = engine.stats()
            row.update(_engine_split(before, after))
            # Every request has ended: its KV blocks are back (cached prefixes aside).
            row["used_blocks_after"] = after["used_blocks"]
            tl = engine.timeline(since)
            row.update(round_timeline(tl, res, t0, gpu))
            if timelines is not None:
                timelines.append({"clients": n, "t0": t0, "engine": tl, "gpu": gpu,
                                  "client_results": res})  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            if peer:
                try:
                    prow = transformers_peer(cfg, prompts, max_tokens)
                except Exception as e:  # the peer is optional
                    prow = {"impl": "transformers generate_batch", "error": str(e)[:200]}
                rows.append(prow)
                print(json.dumps(prow), flush=True)
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pygpukit.bench.serve_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="tinyllama",
        choices=["tinyllama", "tiny"],
        help="tinyllama: TinyLlama-1.1B shape, bf16, random weights",
    )
    p.add_argument("--clients", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--requests",
        type=int,
        default=1,
        help="requests each client sends, one after another (1: a burst of one a client)",
    )
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--kv-memory", type=int, default=None, help="bytes for the KV cache")
    p.add_argument("--peer", action="store_true", help="also time transformers generate_batch")
    p.add_argument(
        "--procs",
        type=int,
        default=None,
        help="client processes (default min(8, clients); 0: in this process)",
    )
    p.add_argument(
        "--step-times",
        action="store_true",
        help="first time the decode step alone at batch 1, 16 and 64",
    )
    p.add_argument(
        "--step-tokens",
        type=int,
        default=None,
        help="the engine's token budget of a step with decode rows (default: Engine's)",
    )
    p.add_argument(
        "--prefill-step-tokens",
        type=int,
        default=None,
        help="the budget of a step with no decode row (default: Engine's)",
    )
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default="httpx",
        help="read the streams with the openai client, or with httpx and json.loads",
    )
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="tokens of one random system prompt every prompt starts with (prefix caching)",
    )
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="the engine without its prefix cache",
    )
    p.add_argument(
        "--single-process",
        action="store_true",
        help="serve HTTP from a thread beside the engine (default: a process of its own)",
    )
    p.add_argument(
        "--front-ends",
        type=int,
        default=1,
        help="HTTP front-end processes sharing the port (Server's front_ends)",
    )
    p.add_argument(
        "--timeline",
        default=None,
        help="write each round's whole timeline (requests, steps, client streams) as JSON here",
    )
    p.add_argument(
        "--save", default=None, help="write {meta (commit, backend, command), rows} as JSON here"
    )
    a = p.parse_args(argv)
    timelines: list[dict[str, Any]] | None = [] if a.timeline else None
    rows = run(
        a.model,
        a.clients,
        a.max_tokens,
        a.prompt_min,
        a.prompt_max,
        a.peer,
        a.kv_memory,
        a.procs,
        a.step_times,
        a.step_tokens,
        a.prefill_step_tokens,
        a.single_process,
        timelines,
        a.front_ends,
        a.client,
        a.shared_prefix,
        a.prefix_caching,
        a.requests,
    )
    if a.timeline:
        with open(a.timeline, "w", encoding="utf-8") as f:
            json.dump(timelines, f)
    if a.save:
        import pygpukit as gpk

        from .timing import git_commit

        meta = {"git_commit": git_commit(), "backend": gpk.backend_name(),
                "command": "python -m pygpukit.bench.serve_load " + " ".join(
                    argv if argv is not None else sys.argv[1:])}  # fmt: skip
        with open(a.save, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
