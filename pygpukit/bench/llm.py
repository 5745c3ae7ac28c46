"""LLM decode benchmark: PyGPUkit against gpt-fast-style torch.compile and transformers.

The model is the TinyLlama-1.1B shape (22 layers, hidden 2048, intermediate 5632, 32 heads,
4 KV heads, vocab 32000) with random bf16 weights, so no download is needed. Each
implementation prefills a 16-token prompt and then times greedy decode steps with a static
batch; tok/s is per sequence (one step makes one token of every row). The roofline row is
the measured device-to-device copy bandwidth divided by the weight bytes one step must
read, the ceiling for a memory-bound batch-1 decode.

    run(batches=(1, 4, 16)) -> list of row dicts      (the `--llm` harness calls this)
    python -m pygpukit.bench.llm [--impl pygpukit,torch_compile,transformers] [--jsonl F]

Issue 23's groups (the harness's llm_prefill, llm_long, llm_load; `--group` here):
run_prefill: the first prefill calls of a fresh process with an empty kernel cache (1x1024,
then 4x512, each with where its time went), then the chunked prefill end to end at batch x
prompt 1x128, 1x1024, 1x2048, 4x512 against gpt-fast's prefill, torch eager and
torch.compile. run_long: a Llama-3-8B-shaped
model with 32k positions, batch-1 decode tok/s at contexts 4k, 16k and 32k against
torch.compile, with the bytes roofline (weights + the KV cache a step reads, over the
measured copy bandwidth). run_load: loading a 2.2 GB checkpoint (TinyLlama shape, random
bf16, written to /tmp by transformers) plus the first token, against transformers, with the
kernel cache and the page cache warm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit.llm.config import ModelConfig

PROMPT_LEN = 16
IMPLS = ("pygpukit", "torch_compile", "transformers")


def tinyllama_config() -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
        num_layers=22, num_heads=32, num_kv_heads=4, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=2048, bos_token_id=1, eos_token_ids=(2,),
    )  # fmt: skip


def llama2_7b_config() -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
        num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,),
    )  # fmt: skip


MODELS: dict[str, Callable[[], ModelConfig]] = {
    "tinyllama": tinyllama_config,
    "llama2-7b": llama2_7b_config,
}


def weight_bytes(cfg: ModelConfig, itemsize: int = 2) -> int:
    return cfg.param_count() * itemsize


def model_name(cfg: ModelConfig) -> str:
    labels = {"tinyllama": "tinyllama-1.1b-shape", "llama2-7b": "llama-2-7b-shape"}
    for name, make in MODELS.items():
        if make() == cfg:
            return labels[name]
    return f"llama-{cfg.num_layers}x{cfg.hidden_size}"


def _row(impl: str, cfg: ModelConfig, batch: int, steps: int, seconds: float,
         **extra: Any) -> dict[str, Any]:  # fmt: skip
    tps = steps / seconds if seconds > 0 else 0.0
    row = {
        "bench": "llm_decode", "model": model_name(cfg), "dtype": "bfloat16",
        "impl": impl, "batch": batch, "steps": steps, "tok_s": tps, "tok_s_total": tps * batch,
        "ms_per_step": 1e3 * seconds / max(steps, 1),
        "weights_gb_s": weight_bytes(cfg) * tps / 1e9,
    }  # fmt: skip
    row.update(extra)
    return row


# -- PyGPUkit ------------------------------------------------------------------------------


def random_model(cfg: ModelConfig, dtype: str = "bfloat16", seed: int = 0) -> Any:
    """A gpk.llm.Model with random weights made on the device (no checkpoint): a block of
    normals is drawn on the host once per fan-in and tiled into every tensor on the device,
    so a Llama-3-8B shape (16 GB) costs 8 MB of uploads, not 16 GB of host work."""
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.ir.dtypes import as_dtype
    from pygpukit.llm.loader import weight_names
    from pygpukit.llm.model import Transformer

    d = as_dtype(dtype)
    rng = np.random.default_rng(seed)
    # One random block tiled over every tensor (what np.resize would give), scaled once per
    # fan-in and converted once: the values only need to be finite and O(1/sqrt(fan_in)).
    pool = rng.standard_normal(1 << 22).astype(np.float32)
    blocks: dict[int, Any] = {}
    shapes = dict(weight_names(cfg))

    def device(name: str) -> Any:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            return gpk.ones(shape, d)
        fan_in = shape[-1]
        if fan_in not in blocks:
            blocks[fan_in] = gpk.from_numpy((pool * np.float32(1 / math.sqrt(fan_in))).astype(d.np))
        block = blocks[fan_in]
        whole, rest = divmod(math.prod(shape), pool.size)
        parts = [gpk.broadcast_to(block.reshape(1, -1), (whole, pool.size)).reshape(-1)]
        parts = (parts if whole else []) + ([block[:rest]] if rest else [])
        if len(parts) > 1:
            return gpk.concatenate(parts).reshape(shape)
        # A slice or a one-row broadcast is a view of the block: copied, so no two weights
        # share memory.
        return parts[0].copy().reshape(shape) if whole <= 1 else parts[0].reshape(shape)

    def up(*names: str) -> Any:
        parts = [device(n) for n in names]
        arr = (gpk.concatenate(parts) if len(parts) > 1 else parts[0]).realize()
        arr.readonly = True
        return arr

    w: dict[str, Any] = {"embed": up("model.embed_tokens.weight")}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w[f"{i}.attn_norm"] = up(p + "input_layernorm.weight")
        w[f"{i}.wqkv"] = up(*(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        w[f"{i}.wo"] = up(p + "self_attn.o_proj.weight")
        w[f"{i}.mlp_norm"] = up(p + "post_attention_layernorm.weight")
        w[f"{i}.w_gate_up"] = up(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        w[f"{i}.w_down"] = up(p + "mlp.down_proj.weight")
    w["norm"] = up("model.norm.weight")
    w["lm_head"] = up("lm_head.weight")
    return llm.Model(cfg, Transformer(cfg, w, d), None, "random")


def bench_pygpukit(cfg: ModelConfig, batch: int, steps: int, model: Any = None) -> dict[str, Any]:
    import pygpukit as gpk
    from pygpukit.llm.sampling import SamplingParams

    model = model or random_model(cfg)
    prompt = [list(range(3, 3 + PROMPT_LEN))] * batch
    max_seq = 1 << math.ceil(math.log2(PROMPT_LEN + steps + 1))
    warm = model.generate_ids(prompt, 3, SamplingParams(), max_seq_len=max_seq, stop_at_eos=False)
    gpk.wait_for_compiles()  # time the optimised kernels, not a cold cache's quick builds
    res = model.generate_ids(prompt, steps + 1, SamplingParams(), max_seq_len=max_seq,
                             stop_at_eos=False)  # fmt: skip
    del warm
    return _row("pygpukit", cfg, batch, res.decode_steps, res.decode_s,
                backend=gpk.backend_name(), prefill_ms=1e3 * res.prefill_s)  # fmt: skip


# -- gpt-fast-style torch ---------------------------------------------------------------------


def _gptfast_model(cfg: ModelConfig, batch: int, max_seq: int) -> Any:
    """gpt-fast's model.py, trimmed: fused wqkv, static KV cache written at input_pos."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    h, nh, nkv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x: Any) -> Any:
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
            return xf.type_as(x) * self.weight

    def rope(x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wqkv = nn.Linear(h, (nh + 2 * nkv) * hd, bias=False)
            self.wo = nn.Linear(nh * hd, h, bias=False)
            shape = (batch, nkv, max_seq, hd)
            self.register_buffer("k_cache", torch.zeros(shape, dtype=torch.bfloat16))
            self.register_buffer("v_cache", torch.zeros(shape, dtype=torch.bfloat16))

        def forward(self, x: Any, cos: Any, sin: Any, mask: Any, input_pos: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.wqkv(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = rope(q.view(b, t, nh, hd).transpose(1, 2), cos, sin)
            k = rope(k.view(b, t, nkv, hd).transpose(1, 2), cos, sin)
            v = v.view(b, t, nkv, hd).transpose(1, 2)
            self.k_cache[:, :, input_pos] = k
            self.v_cache[:, :, input_pos] = v
            k = self.k_cache.repeat_interleave(nh // nkv, dim=1)
            v = self.v_cache.repeat_interleave(nh // nkv, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.wo(y.transpose(1, 2).reshape(b, t, nh * hd))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.attention = Attention()
            self.w1 = nn.Linear(h, cfg.intermediate_size, bias=False)
            self.w3 = nn.Linear(h, cfg.intermediate_size, bias=False)
            self.w2 = nn.Linear(cfg.intermediate_size, h, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, mask: Any, input_pos: Any) -> Any:
            x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
            y = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(y)) * self.w3(y))

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, h)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.num_layers))
            self.norm = RMSNorm()
            self.output = nn.Linear(h, cfg.vocab_size, bias=False)
            inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd)
            ang = torch.arange(max_seq).float()[:, None] * inv[None]
            self.register_buffer("cos", ang.cos().to(torch.bfloat16))
            self.register_buffer("sin", ang.sin().to(torch.bfloat16))
            causal = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
            self.register_buffer("causal", causal)

        def forward(self, idx: Any, input_pos: Any) -> Any:
            mask = self.causal[None, None, input_pos]
            cos, sin = self.cos[input_pos], self.sin[input_pos]
            x = self.tok_embeddings(idx)
            for layer in self.layers:
                x = layer(x, cos, sin, mask, input_pos)
            return self.output(self.norm(x))

    # Made in bf16 directly: a Llama-3-8B shape in float32 first would take 32 GB more.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Transformer()
    finally:
        torch.set_default_dtype(default)
    return model.to(torch.bfloat16).eval()


def bench_torch_compile(
    cfg: ModelConfig, batch: int, steps: int, transform: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """gpt-fast-style decode under torch.compile; `transform` rewrites the model first (the
    quant bench's weight-only quantized linears)."""
    import torch

    max_seq = 1 << math.ceil(math.log2(PROMPT_LEN + steps + 1))
    model = _gptfast_model(cfg, batch, max_seq)
    if transform is not None:
        model = transform(model)

    def decode_one(m: Any, tok: Any, pos: Any) -> Any:
        return m(tok, pos)[:, -1].argmax(-1, keepdim=True)

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        idx = torch.randint(3, cfg.vocab_size, (batch, PROMPT_LEN), device="cuda")
        tok = model(idx, torch.arange(PROMPT_LEN, device="cuda"))[:, -1].argmax(-1, keepdim=True)
        t_c = time.perf_counter()
        for i in range(3):  # compile and capture
            tok = step(model, tok, torch.tensor([PROMPT_LEN + i], device="cuda")).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t_c
        poss = [torch.tensor([PROMPT_LEN + i], device="cuda") for i in range(steps)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            tok = step(model, tok, poss[i]).clone()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    del model
    torch.cuda.empty_cache()
    return _row("torch_compile", cfg, batch, steps, dt, compile_s=compile_s,
                note="gpt-fast-style, mode=reduce-overhead, fullgraph")  # fmt: skip


def bench_transformers(cfg: ModelConfig, batch: int, steps: int) -> dict[str, Any]:
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
    idx = torch.randint(3, cfg.vocab_size, (batch, PROMPT_LEN), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(idx, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(4)
    t1 = min(timed(1) for _ in range(2))
    tn = timed(steps + 1)
    note = f"transformers {transformers.__version__} generate, greedy, dynamic cache"
    return _row("transformers", cfg, batch, steps, tn - t1, note=note)


# -- roofline ---------------------------------------------------------------------------------


def copy_bandwidth() -> tuple[float, str]:
    """Bytes/s (read + written) of a device-to-device copy; torch's when it has CUDA."""
    try:
        import torch

        if torch.cuda.is_available():
            x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            y = torch.empty_like(x)
            best = float("inf")
            for _ in range(6):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                y.copy_(x)
                e.record()
                e.synchronize()
                best = min(best, s.elapsed_time(e) / 1e3)
            del x, y
            return 2 * (1 << 30) / best, f"device-to-device copy ({torch.cuda.get_device_name()})"
    except ImportError:
        pass
    from pygpukit.llm.perf import copy_bandwidth as gpk_copy

    return gpk_copy()


def roofline_rows(cfg: ModelConfig, batches: Sequence[int]) -> list[dict[str, Any]]:
    bw, how = copy_bandwidth()
    wb = weight_bytes(cfg)
    return [_row("roofline", cfg, b, 1, wb / bw, copy_gb_s=bw / 1e9,
                 note=f"weights {wb / 1e9:.2f} GB / {how}") for b in batches]  # fmt: skip


# -- prefill, long-context decode, load + first token (issue 23) ------------------------------

Row = dict[str, Any]
Sink = Callable[[Row], None]
PREFILL_SHAPES = ((1, 128), (1, 1024), (1, 2048), (4, 512))  # (batch, prompt tokens)
LONG_CONTEXTS = (4096, 16384, 32768)


def llama3_8b_long_config() -> ModelConfig:
    """Llama-3-8B's shape with 32k positions (random weights: only the shape matters)."""
    return ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=32768, bos_token_id=1,
        eos_token_ids=(2,),
    )  # fmt: skip


def kv_bytes(cfg: ModelConfig, context: int, itemsize: int = 2) -> int:
    """Bytes of keys and values one decode step reads at this context (every layer)."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * context * itemsize


def _prompts(cfg: ModelConfig, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, cfg.vocab_size, length).tolist() for _ in range(batch)]


PREFILL_WARM = 5  # calls after the first before timing (either side)
PREFILL_REPS = 20  # timed calls; the best is kept (either side)


def best_of(call: Callable[[], float], warm: int = PREFILL_WARM,
            reps: int = PREFILL_REPS) -> float:  # fmt: skip
    """The least of `reps` timings call() returns, after `warm` untimed calls: both sides
    of the prefill comparison are timed so, a host hiccup in one call costs nothing."""
    for _ in range(warm):
        call()
    return min(call() for _ in range(reps))


def first_prefill(model: Any, batch: int, length: int) -> dict[str, Any]:
    """The first prefill call of a (batch, prompt) shape on `model` (a new generator:
    traces, compiles and captures each new chunk shape; kernels come from the kernel
    cache as found), end to end (generate_ids of one token), with where its time went
    (breakdown_ms: generator_ms, making the generator and its KV cache;
    compiled.first_call_breakdown of the chunk entries; other_ms, the rest: uploads, the
    token read back)."""
    from pygpukit.llm.sampling import SamplingParams

    from .compiled import first_call_breakdown

    prompts = _prompts(model.config, batch, length)
    max_seq = min(model.config.max_position_embeddings, length + 16)
    t0 = time.perf_counter()
    gen = model.generator(batch, max_seq)  # what generate_ids makes first
    generator_ms = (time.perf_counter() - t0) * 1e3
    res = model.generate_ids(prompts, 1, SamplingParams(), max_seq_len=max_seq,
                             stop_at_eos=False)  # fmt: skip
    seconds = time.perf_counter() - t0
    entries = gen._prefill.stats().get("entries", [])
    first = [e["replay"].get("first_call") for e in entries]
    breakdown = first_call_breakdown({"phases_ms": [e.get("phases_ms") for e in entries],
                                      "first_call": first})  # fmt: skip
    breakdown["generator_ms"] = round(generator_ms, 2)
    parts = generator_ms + sum(e["trace_ms"] for e in entries) + sum(
        (f or {}).get(k, 0.0)
        for f in first
        for k in ("dry_run_ms", "compile_wait_ms", "load_ms", "first_run_ms", "capture_ms")
    )  # fmt: skip
    breakdown["other_ms"] = round(seconds * 1e3 - parts, 2)
    return {"batch": batch, "prompt_len": length, "first_call_s": seconds,
            "chunks": res.stats["chunks"], "breakdown_ms": breakdown}  # fmt: skip


def bench_prefill_pygpukit(cfg: ModelConfig, batch: int, length: int, model: Any,
                           reps: int = PREFILL_REPS) -> dict[str, Any]:  # fmt: skip
    """The chunked prefill end to end (chunks, then the first token read back), best_of
    its timings; first_call_s is the first call's (first_prefill; kernels come from the
    kernel cache as found), first_call_ms where it went."""
    import pygpukit as gpk
    from pygpukit.llm.sampling import SamplingParams

    prompts = _prompts(cfg, batch, length)
    max_seq = min(cfg.max_position_embeddings, length + 16)

    def call() -> float:
        return float(model.generate_ids(prompts, 1, SamplingParams(), max_seq_len=max_seq,
                                        stop_at_eos=False).prefill_s)  # fmt: skip

    first = first_prefill(model, batch, length)
    gpk.wait_for_compiles()  # time the optimised kernels, not a cold cache's quick builds
    best = best_of(call, reps=reps)
    return _prefill_row("pygpukit", cfg, batch, length, best,
                        first_call_s=first["first_call_s"], chunks=first["chunks"],
                        first_call_ms=first["breakdown_ms"])  # fmt: skip


# The first prefill calls of a fresh process: one per shape, in order (argv[1], JSON).
_COLD_PREFILL = r"""
import dataclasses, json, sys
from pygpukit.bench import llm
layers = json.loads(sys.argv[2])
cfg = llm.tinyllama_config()
model = llm.random_model(cfg if layers is None else dataclasses.replace(cfg, num_layers=layers))
for batch, length in json.loads(sys.argv[1]):
    print("RESULT " + json.dumps(llm.first_prefill(model, batch, length)), flush=True)
"""
COLD_PREFILL_SHAPES = ((1, 1024), (4, 512))
FIRST_PREFILL_TARGET_S = 1.0  # issue 23: compile + capture of a new chunk shape, cold cache


def bench_prefill_cold(shapes: Sequence[tuple[int, int]] = COLD_PREFILL_SHAPES,
                       layers: int | None = None,
                       sink: Sink | None = None) -> list[Row]:  # fmt: skip
    """The first prefill call of each shape in a fresh process whose kernel caches (ours
    and NVRTC's: compiled.cold_cache_env) are new and empty: the first shape compiles every
    kernel (NVRTC), the later ones what they add; each row with its breakdown
    (first_prefill).
    The TinyLlama shape (random weights), with `layers` layers (None: its 22)."""
    import subprocess
    import tempfile

    from .compiled import cold_cache_env

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as cache:
        env = cold_cache_env(cache)
        argv = [sys.executable, "-c", _COLD_PREFILL, json.dumps(shapes), json.dumps(layers)]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    got = [json.loads(ln[len("RESULT ") :]) for ln in out.stdout.splitlines()
           if ln.startswith("RESULT ")]  # fmt: skip
    if len(got) < len(shapes):
        raise RuntimeError(f"cold prefill: {len(got)} of {len(shapes)} shapes ran:\n"
                           f"{out.stderr[-2000:]}")  # fmt: skip
    for k, r in enumerate(got):
        cfg = tinyllama_config()
        cfg = cfg if layers is None else dataclasses.replace(cfg, num_layers=layers)
        row = {"bench": "llm_prefill", "model": model_name(cfg),
               "dtype": "bfloat16", "impl": "pygpukit",
               "workload": "first prefill call, cold cache" if k == 0
               else "first prefill call, next new chunk shape",
               "batch": r["batch"], "prompt_len": r["prompt_len"],
               "seconds": round(r["first_call_s"], 3), "chunks": r["chunks"],
               "breakdown_ms": r["breakdown_ms"],
               "cache": "PYGPUKIT_CACHE_DIR, HOME: new empty directories, fresh process"
               if k == 0
               else f"the same process, after {got[k - 1]['batch']}x{got[k - 1]['prompt_len']}",
               "target_s": FIRST_PREFILL_TARGET_S,
               "met": r["first_call_s"] <= FIRST_PREFILL_TARGET_S}  # fmt: skip
        rows.append(row)
        if sink:
            sink(row)
    return rows


def _prefill_row(impl: str, cfg: ModelConfig, batch: int, length: int, seconds: float,
                 **extra: Any) -> dict[str, Any]:  # fmt: skip
    row = {"bench": "llm_prefill", "model": model_name(cfg), "dtype": "bfloat16", "impl": impl,
           "batch": batch, "prompt_len": length, "ms": 1e3 * seconds,
           "tok_s": batch * length / seconds if seconds > 0 else 0.0}  # fmt: skip
    row.update(extra)
    return row


def gptfast_prefill(cfg: ModelConfig, batch: int, length: int,
                    compiled: bool) -> tuple[Callable[[], float], float]:  # fmt: skip
    """gpt-fast's prefill (the whole prompt in one call, cache of the prompt's length,
    logits of every position, argmax of the last), eager or torch.compile'd (static
    shapes, fullgraph): (a call timing one prefill with the first token read back, the
    first call's seconds). A compiled one's compile workers are shut down after its
    first call: left running beside the timed calls, they took host time from a peer
    that launches without CUDA graphs (17.1 ms at 4x512 in one such run, 8.8 warm)."""
    import torch

    model = _gptfast_model(cfg, batch, length)

    def prefill(m: Any, idx: Any, pos: Any) -> Any:
        return m(idx, pos)[:, -1].argmax(-1)

    if compiled:
        # A fresh dynamo per shape: otherwise the second shape's recompile marks the changed
        # sizes dynamic (automatic dynamic shapes) and the peer depends on the shape order.
        torch._dynamo.reset()
    fn = torch.compile(prefill, fullgraph=True) if compiled else prefill
    idx = torch.tensor(_prompts(cfg, batch, length), device="cuda")
    pos = torch.arange(length, device="cuda")

    def call() -> float:
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(model, idx, pos).cpu()
            return time.perf_counter() - t0

    first = call()
    if compiled:
        try:
            from torch._inductor.async_compile import shutdown_compile_workers

            shutdown_compile_workers()
        except (ImportError, AttributeError):  # another torch: nothing to shut down
            pass
    return call, first


def bench_prefill_torch(cfg: ModelConfig, batch: int, length: int,
                        compiled: bool) -> dict[str, Any]:  # fmt: skip
    """gpt-fast's prefill (gptfast_prefill), eager or torch.compile'd, best_of its timings."""
    import torch

    call, first = gptfast_prefill(cfg, batch, length, compiled)
    best = best_of(call)
    del call
    torch.cuda.empty_cache()
    impl = "torch_compile" if compiled else "torch_eager"
    how = ", fullgraph, static shapes" if compiled else ""
    return _prefill_row(
        impl,
        cfg,
        batch,
        length,
        best,
        first_call_s=first,
        note=f"gpt-fast-style prefill{how}, best of {PREFILL_REPS} after {PREFILL_WARM} warm calls",
    )


def run_prefill(shapes: Sequence[tuple[int, int]] = PREFILL_SHAPES,
                impls: Sequence[str] = ("pygpukit", "torch_eager", "torch_compile"),
                cfg: ModelConfig | None = None,
                sink: Sink | None = None) -> list[Row]:  # fmt: skip
    """llm_prefill rows: ours' first calls in a fresh process with an empty kernel cache
    (bench_prefill_cold, the TinyLlama shape), then each implementation at each (batch,
    prompt) shape, ours first (a run cut short keeps ours at every shape), with ours'
    speedup over each torch row."""
    cfg = cfg or tinyllama_config()
    rows: list[dict[str, Any]] = []
    if "pygpukit" in impls and cfg == tinyllama_config():
        try:
            rows += bench_prefill_cold(sink=sink)
        except Exception as e:  # the steady-state rows still run
            traceback.print_exc()
            rows.append({"bench": "llm_prefill", "impl": "pygpukit",
                         "workload": "first prefill call, cold cache",
                         "error": repr(e)[:500]})  # fmt: skip
            if sink:
                sink(rows[-1])
    model = random_model(cfg) if "pygpukit" in impls else None
    ours: dict[tuple[int, int], dict[str, Any]] = {}
    for impl in sorted(impls, key=lambda i: i != "pygpukit"):
        for batch, length in shapes:
            try:
                if impl == "pygpukit":
                    r = ours[batch, length] = bench_prefill_pygpukit(cfg, batch, length, model)
                else:
                    r = bench_prefill_torch(cfg, batch, length, impl == "torch_compile")
                    if (batch, length) in ours:
                        r["ours_speedup"] = r["ms"] / ours[batch, length]["ms"]
            except Exception as e:  # one implementation failing must not lose the others
                traceback.print_exc()
                r = {"bench": "llm_prefill", "impl": impl, "batch": batch,
                     "prompt_len": length, "error": repr(e)[:500]}  # fmt: skip
            rows.append(r)
            if sink:
                sink(r)
    return rows


def bench_long_pygpukit(cfg: ModelConfig, context: int, steps: int, model: Any) -> dict[str, Any]:
    """Batch-1 greedy decode whose positions end at context - 1, after a chunked prefill
    of the rest of the context (random tokens)."""
    import pygpukit as gpk
    from pygpukit.llm.sampling import SamplingParams

    prompt = _prompts(cfg, 1, context - steps - 1)
    kw = dict(max_seq_len=context, stop_at_eos=False)
    model.generate_ids(prompt, 3, SamplingParams(), **kw)  # traces and captures
    gpk.wait_for_compiles()
    res = model.generate_ids(prompt, steps + 1, SamplingParams(), **kw)
    return _long_row("pygpukit", cfg, context, res.decode_steps, res.decode_s,
                     prefill_s=res.prefill_s,
                     prefill_tok_s=len(prompt[0]) / res.prefill_s)  # fmt: skip


def _long_row(impl: str, cfg: ModelConfig, context: int, steps: int, seconds: float,
              **extra: Any) -> dict[str, Any]:  # fmt: skip
    tps = steps / seconds if seconds > 0 else 0.0
    moved = weight_bytes(cfg) + kv_bytes(cfg, context)
    row = {"bench": "llm_long", "model": "llama-3-8b-shape-32k", "dtype": "bfloat16",
           "impl": impl, "batch": 1, "context": context, "steps": steps, "tok_s": tps,
           "ms_per_step": 1e3 * seconds / max(steps, 1), "bytes_per_step": moved,
           "gb_s": moved * tps / 1e9}  # fmt: skip
    row.update(extra)
    return row


def bench_long_torch_compile(cfg: ModelConfig, context: int, steps: int) -> dict[str, Any]:
    """gpt-fast's decode step (mode=reduce-overhead) at positions context-steps..context-1
    of a cache of `context` positions; the cache contents do not change the time."""
    import torch

    model = _gptfast_model(cfg, 1, context)

    def decode_one(m: Any, tok: Any, pos: Any) -> Any:
        return m(tok, pos)[:, -1].argmax(-1, keepdim=True)

    torch._dynamo.reset()  # static shapes at every context (no automatic dynamic cache)
    t_c = time.perf_counter()
    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    first = context - steps - 1
    with torch.no_grad():
        tok = torch.randint(3, cfg.vocab_size, (1, 1), device="cuda")
        for i in range(3):
            tok = step(model, tok, torch.tensor([first - 3 + i], device="cuda")).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t_c
        poss = [torch.tensor([first + i], device="cuda") for i in range(steps)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            tok = step(model, tok, poss[i]).clone()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    del model, step
    torch.cuda.empty_cache()
    return _long_row("torch_compile", cfg, context, steps, dt, compile_s=compile_s,
                     note="gpt-fast-style, mode=reduce-overhead, fullgraph, cache of "
                          "`context` positions")  # fmt: skip


LONG_PEER_BUDGET_S = 60.0  # torch.compile's seconds (compile + capture + timing), all contexts


def run_long(contexts: Sequence[int] = LONG_CONTEXTS, steps: int = 64,
             impls: Sequence[str] = ("pygpukit", "torch_compile"),
             sink: Sink | None = None,
             peer_budget_s: float = LONG_PEER_BUDGET_S) -> list[Row]:  # fmt: skip
    """llm_long rows: the bytes roofline at each context (weights + the KV cache one step
    reads, over the measured copy bandwidth), then each implementation; pct_of_roofline is
    the measured tok/s over the roofline's. The torch.compile peer compiles a model per
    context; once its next context would overrun peer_budget_s (judged by the last one's
    cost), the remaining contexts get a row that says the peer was skipped."""
    cfg = llama3_8b_long_config()
    bw, how = copy_bandwidth()
    rows: list[dict[str, Any]] = []

    def emit(r: dict[str, Any]) -> None:
        rows.append(r)
        if sink:
            sink(r)

    roof: dict[int, float] = {}
    for c in contexts:
        moved = weight_bytes(cfg) + kv_bytes(cfg, c)
        r = _long_row("roofline", cfg, c, 1, moved / bw, copy_gb_s=bw / 1e9,
                      note=f"(weights + KV) {moved / 1e9:.2f} GB / {how}")  # fmt: skip
        roof[c] = r["tok_s"]
        emit(r)
    for impl in impls:
        model = random_model(cfg) if impl == "pygpukit" else None
        spent = last = 0.0
        for c in contexts:
            if impl != "pygpukit" and spent + last > peer_budget_s:
                emit({"bench": "llm_long", "impl": impl, "context": c,
                      "skipped": f"the peer's time budget ({peer_budget_s:.0f} s) would be "
                                 f"overrun: {spent:.0f} s spent, {last:.0f} s for the last "
                                 "context"})  # fmt: skip
                continue
            t0 = time.perf_counter()
            try:
                if impl == "pygpukit":
                    r = bench_long_pygpukit(cfg, c, steps, model)
                else:
                    r = bench_long_torch_compile(cfg, c, steps)
                r["pct_of_roofline"] = 100 * r["tok_s"] / roof[c]
            except Exception as e:  # one implementation failing must not lose the others
                traceback.print_exc()
                r = {"bench": "llm_long", "impl": impl, "context": c, "error": repr(e)[:500]}
            last = time.perf_counter() - t0
            spent += last
            r["wall_s"] = last
            emit(r)
        del model
    return rows


def write_checkpoint(path: str, cfg: ModelConfig | None = None) -> str:
    """A Hugging Face Llama checkpoint with random bf16 weights (TinyLlama's shape: 2.2 GB),
    saved by transformers; kept when already there."""
    import torch
    import transformers

    cfg = cfg or tinyllama_config()
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(hf_cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def run_load(path: str = "/tmp/pygpukit-bench-tinyllama-bf16", reps: int = 3,
             sink: Sink | None = None) -> list[Row]:  # fmt: skip
    """llm_load rows: load the checkpoint and produce the first token of a 16-token prompt,
    ours (gpk.llm.load + generate_ids) against transformers (from_pretrained with
    device_map="cuda", then generate), best of reps after a warm-up run of each: the
    kernel cache and the page cache are warm. load_s is the load's own time (ours: what
    gpk.llm.load measured, until the weights are on the device), first_token_s the rest."""
    import gc

    import torch
    import transformers

    import pygpukit as gpk
    from pygpukit import llm

    write_checkpoint(path)
    prompt = list(range(3, 3 + PROMPT_LEN))
    nbytes = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                 if f.endswith(".safetensors"))  # fmt: skip

    def ours() -> tuple[float, float]:
        t0 = time.perf_counter()
        m = llm.load(path, progress=False)
        m.generate_ids([prompt], 1, stop_at_eos=False)
        dt = time.perf_counter() - t0
        load_s = m.load_stats["seconds"]
        for a in {id(w): w for w in m.transformer.weights.values()}.values():
            a.free()
        del m
        gc.collect()
        gpk.synchronize()
        return dt, load_s

    def theirs() -> tuple[float, float]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, device_map="cuda"
        )
        torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
        idx = torch.tensor([prompt], device="cuda")
        m.generate(idx, max_new_tokens=1, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        del m
        gc.collect()
        torch.cuda.empty_cache()
        return dt, load_s

    rows: list[dict[str, Any]] = []
    for impl, fn in (("pygpukit", ours), ("transformers", theirs)):
        try:
            fn()  # warm: page cache, kernel cache, imports
            dt, load_s = min(fn() for _ in range(reps))
            r = {"bench": "llm_load", "impl": impl, "model": "tinyllama-1.1b-shape",
                 "dtype": "bfloat16", "checkpoint_gb": nbytes / 1e9, "load_first_token_s": dt,
                 "load_s": load_s, "load_gb_s": nbytes / 1e9 / load_s,
                 "first_token_s": dt - load_s,
                 "note": "kernel cache warm, page cache warm, 16-token prompt"}  # fmt: skip
        except Exception as e:
            traceback.print_exc()
            r = {"bench": "llm_load", "impl": impl, "error": repr(e)[:500]}
        rows.append(r)
        if sink:
            sink(r)
    if len(rows) == 2 and "error" not in rows[0] and "error" not in rows[1]:
        rows[0]["vs_transformers"] = rows[0]["load_first_token_s"] / rows[1]["load_first_token_s"]
    return rows


BENCHES: dict[str, Callable[[ModelConfig, int, int], dict[str, Any]]] = {
    "pygpukit": bench_pygpukit,
    "torch_compile": bench_torch_compile,
    "transformers": bench_transformers,
}


def run(batches: Sequence[int] = (1, 4, 16), steps: int = 64,
        impls: Sequence[str] = IMPLS, cfg: ModelConfig | None = None,
        sink: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of results (dicts). A failing implementation gives a row with its error."""
    cfg = cfg or tinyllama_config()
    rows = roofline_rows(cfg, batches)
    bw = rows[0]["copy_gb_s"]
    for r in rows:
        if sink:
            sink(r)
    for impl in impls:
        for b in batches:
            try:
                r = BENCHES[impl](cfg, b, steps)
            except Exception as e:  # one implementation failing must not lose the others
                r = {"bench": "llm_decode", "impl": impl, "batch": b, "error": repr(e)[:500]}
                traceback.print_exc()
            if "weights_gb_s" in r:
                r["pct_of_copy_bw"] = 100 * r["weights_gb_s"] / bw
            rows.append(r)
            if sink:
                sink(r)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'impl':<14} {'batch':>5} {'tok/s/seq':>10} {'tok/s':>10} {'ms/step':>8} "
             f"{'GB/s':>8} {'%copy':>6}"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"{r['impl']:<14} {r['batch']:>5} error: {r['error'][:80]}")
            continue
        lines.append(
            f"{r['impl']:<14} {r['batch']:>5} {r['tok_s']:>10.1f} {r['tok_s_total']:>10.1f} "
            f"{r['ms_per_step']:>8.2f} {r['weights_gb_s']:>8.1f} "
            f"{r.get('pct_of_copy_bw', 100.0):>6.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default=",".join(IMPLS))
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--model", default="tinyllama", choices=sorted(MODELS))
    ap.add_argument("--jsonl", default=None, help="append each row here as it is measured")
    ap.add_argument("--group", default="decode", choices=("decode", "prefill", "long", "load"),
                    help="decode (the default), prefill (llm_prefill), long (llm_long: "
                         "Llama-3-8B shape at 4k/16k/32k) or load (llm_load: load + first "
                         "token against transformers)")  # fmt: skip
    a = ap.parse_args(argv)

    def sink(r: dict[str, Any]) -> None:
        print(json.dumps(r), flush=True)
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(r) + "\n")

    if a.group != "decode":
        {"prefill": lambda: run_prefill(sink=sink), "long": lambda: run_long(sink=sink),
         "load": lambda: run_load(sink=sink)}[a.group]()  # fmt: skip
        return 0

    rows = run([int(b) for b in a.batches.split(",")], a.steps, a.impl.split(","),
               cfg=MODELS[a.model](), sink=sink)  # fmt: skip
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
