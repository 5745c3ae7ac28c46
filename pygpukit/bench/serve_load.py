"""Load generator for `pygpukit serve`: N concurrent streaming clients.

    python -m pygpukit.bench.serve_load --clients 16 64 256          # TinyLlama shape, bf16
    python -m pygpukit.bench.serve_load --model tiny --clients 4 --max-tokens 8   # CPU smoke

Each client sends one completion request with a random 128-512 token prompt (token ids)
and asks for 128 tokens (EOS ignored), streaming, through the real `openai` client against
a server on 127.0.0.1 with random weights. Reported: total output tok/s, p50/p99 time to
first token, p50/p99 inter-token latency. `--peer` also times transformers' continuous
batching (`generate_batch`) on the same prompts, where transformers and torch are installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else float("nan")


def _prompts(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, size=int(rng.integers(lo, hi + 1)))]
            for _ in range(n)]  # fmt: skip


async def _client(client: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    n = 0
    stream = await client.completions.create(model="bench", prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})  # fmt: skip
    async for chunk in stream:
        if chunk.choices:
            stamps.append(time.perf_counter())
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    return {"start": t0, "stamps": stamps, "tokens": n}


async def _round(url: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        max_retries=0,
        timeout=3600,
    )
    t0 = time.perf_counter()
    res = await asyncio.gather(*(_client(client, p, max_tokens) for p in prompts))
    wall = time.perf_counter() - t0
    await client.close()
    ttft = [r["stamps"][0] - r["start"] for r in res if r["stamps"]]
    itl = [b - a for r in res for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    tokens = sum(r["tokens"] for r in res)
    return {"clients": len(prompts), "output_tokens": tokens, "wall_s": wall,
            "output_tok_s": tokens / wall, "ttft_p50_ms": 1e3 * _pct(ttft, 50),
            "ttft_p99_ms": 1e3 * _pct(ttft, 99), "itl_p50_ms": 1e3 * _pct(itl, 50),
            "itl_p99_ms": 1e3 * _pct(itl, 99)}  # fmt: skip


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
        peer: bool, kv_memory: int | None) -> list[dict[str, Any]]:  # fmt: skip
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
    engine = Engine(model, max_model_len=min(cfg.max_position_embeddings, hi + max_tokens),
                    max_batch=max(clients), kv_memory=kv_memory,
                    max_queue=max(clients) + 8)  # fmt: skip
    server = Server(model, engine, "bench", port=0).start()
    rows = []
    try:
        warm = _prompts(min(4, max(clients)), cfg.vocab_size, lo, hi, 99)
        asyncio.run(_round(server.url, warm, 4))  # traces the step graphs
        for n in clients:
            prompts = _prompts(n, cfg.vocab_size, lo, hi, n)
            row = {"impl": "pygpukit serve", **asyncio.run(_round(server.url, prompts,
                                                                   max_tokens))}  # fmt: skip
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
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--kv-memory", type=int, default=None, help="bytes for the KV cache")
    p.add_argument("--peer", action="store_true", help="also time transformers generate_batch")
    p.add_argument("--save", default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    rows = run(a.model, a.clients, a.max_tokens, a.prompt_min, a.prompt_max, a.peer, a.kv_memory)
    if a.save:
        with open(a.save, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
