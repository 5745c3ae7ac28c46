"""Accuracy of the quantized weight formats against the unquantized model.

For each format (int8, fp8 with 128x128 block scales, int4 symmetric groups) every linear
weight of the model (q/k/v, o, gate/up, down, the LM head) is quantized and the
last-position logits of random prompts are compared with the float model's: the relative
error ||q - f|| / ||f|| over all logits, and the top-1 agreement (the share of prompts
whose argmax token is the same).

    python -m pygpukit.bench.quant_accuracy [--model tinyllama|small|trained|DIR]
        [--prompts 256] [--prompt-len 16] [--formats int8,fp8,int4] [--group 128]
        [--dtype float32] [--floor] [--train-steps 1500] [--trained-dir DIR] [--json FILE]

tinyllama is the TinyLlama-1.1B shape with random weights (a GPU job); small is a
two-layer model of the same kind that runs on the CPU in seconds; DIR is a model directory
(the float checkpoint, quantized on load). trained is a byte-level Llama trained first with
torch and transformers (bench/trained_llm.py, about a minute on a GPU; --trained-dir keeps
the checkpoint there and reuses it), quantized on load like DIR, its prompts random spans
of held-out text: a model whose logits have margins, as trained checkpoints do.

--floor (with --dtype other than float32) also runs the model in float32 and reports each
row against it too (the *_vs_float32 keys), the unquantized model in --dtype first (format
"none"): how far rounding the weights and activations to
--dtype alone moves the logits, the floor a format's agreement is read against. The first
row's median_top1_gap is the median distance between each prompt's two largest float32
logits in units of that prompt's logit standard deviation: random weights give near-ties
(H200, TinyLlama shape, 256 prompts: 0.15), so bf16 itself agrees with float32 on 94% of
the top-1 tokens there, and int8 weights on 91%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit.llm.config import ModelConfig

FORMATS = ("int8", "fp8", "int4")
CHUNK = 64  # prompts a forward pass


def small_config() -> ModelConfig:
    """Two layers, every K a multiple of 128 (the default int4 group)."""
    return ModelConfig(
        arch="llama", vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=256,
    )  # fmt: skip


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 tensors: normal with std 1/sqrt(fan-in) (the embedding std 1),
    norms near 1. Each tensor is drawn from its own stream, so all are independent."""
    from pygpukit.llm.loader import weight_names

    out = {}
    for i, (name, shape) in enumerate(weight_names(cfg)):
        rng = np.random.default_rng([seed, i])
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
        else:
            std = 1.0 if "embed" in name else 1.0 / math.sqrt(shape[-1])
            out[name] = rng.standard_normal(shape, np.float32) * np.float32(std)
    return out


def build_model(cfg: ModelConfig, host: dict[str, np.ndarray], dtype: str) -> Any:
    """A gpk.llm.Model of the HF-named host weights (q/k/v and gate/up joined)."""
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.ir.dtypes import as_dtype
    from pygpukit.llm.model import Transformer

    d = as_dtype(dtype)

    def up(*names: str) -> Any:
        arr = gpk.from_numpy(np.concatenate([host[n] for n in names]).astype(d.np))
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
    w["lm_head"] = up("lm_head.weight") if not cfg.tie_word_embeddings else w["embed"]
    return llm.Model(cfg, Transformer(cfg, w, d), None, "random")


def last_logits(model: Any, prompts: np.ndarray) -> np.ndarray:
    """float32 [P, V]: each prompt's next-token logits (prefill, CHUNK prompts at a time)."""
    import pygpukit as gpk
    from pygpukit.llm.model import prefill_mask

    t = model.transformer
    out = []
    for i in range(0, len(prompts), CHUNK):
        rows = prompts[i : i + CHUNK]
        t.setup_cache(len(rows), rows.shape[1])
        start = gpk.from_numpy(np.zeros(len(rows), np.int64))
        logits = t(gpk.from_numpy(rows), prefill_mask(start, rows.shape[1]))
        out.append(logits.to_numpy())
    return np.concatenate(out)


def compare(base: np.ndarray, quant: np.ndarray) -> dict[str, float]:
    """Relative logits error and top-1 agreement of quantized logits against float ones."""
    base64, quant64 = base.astype(np.float64), quant.astype(np.float64)
    return {
        "logits_rel_err": float(np.linalg.norm(quant64 - base64) / np.linalg.norm(base64)),
        "top1_agreement": float((quant.argmax(-1) == base.argmax(-1)).mean()),
    }


def median_top1_gap(logits: np.ndarray) -> float:
    """Median over rows of (largest - second largest logit) / the row's standard deviation."""
    x = np.sort(logits.astype(np.float64), axis=-1)
    return float(np.median((x[:, -1] - x[:, -2]) / x.std(axis=-1)))


def run(
    model: str = "small",
    prompts: int = 256,
    prompt_len: int = 16,
    formats: Sequence[str] = FORMATS,
    group: int = 128,
    dtype: str = "float32",
    seed: int = 0,
    floor: bool = False,
    train_steps: int = 1500,
    trained_dir: str | None = None,
) -> list[dict[str, Any]]:
    """One row per format: {bench, model, format, dtype, prompts, logits_rel_err,
    top1_agreement, weight_bytes, float_weight_bytes}; with floor (dtype not float32) a
    first row for the unquantized model against float32 (format "none", median_top1_gap)
    and each format's logits_rel_err_vs_float32 and top1_agreement_vs_float32. For
    "trained" every row also carries the model's training figures (trained_llm.train)."""
    from pygpukit import llm
    from pygpukit.llm.loader import free_weights
    from pygpukit.llm.quantize import check_quantize, quantize_model

    for f in formats:
        check_quantize(f, group)
    make: Callable[[str | None, str], Any]
    labels = {"small": "small-random", "tinyllama": "tinyllama-1.1b-shape",
              "trained": "trained-byte-llama"}  # fmt: skip
    label = labels.get(model, model)
    trained: dict[str, Any] = {}
    prompt_ids = None
    if model == "trained":
        from . import trained_llm

        model = trained_dir or tempfile.mkdtemp(prefix="pygpukit-trained-")
        if not os.path.exists(os.path.join(model, "config.json")):  # else reused as it is
            trained = {**trained_llm.train(model, steps=train_steps, seed=seed),
                       "train_steps": train_steps}  # fmt: skip
        prompt_ids = trained_llm.spans(trained_llm.corpus()[1], prompts, prompt_len, seed + 1)
    if model in ("small", "tinyllama"):
        from .llm import tinyllama_config

        cfg = small_config() if model == "small" else tinyllama_config()
        host = random_weights(cfg, seed)

        def make(fmt: str | None, dt: str) -> Any:
            m = build_model(cfg, host, dt)
            return m if fmt is None else (quantize_model(m.transformer, fmt, group), m)[1]

    else:

        def make(fmt: str | None, dt: str) -> Any:
            return llm.load(model, dtype=dt, progress=False, quantize=fmt, quantize_group=group)

    rows: list[dict[str, Any]] = []
    float_model = make(None, dtype)
    cfg = float_model.config
    ids = prompt_ids
    if ids is None:
        ids = np.random.default_rng(seed + 1).integers(0, cfg.vocab_size, (prompts, prompt_len))
    base = last_logits(float_model, ids)
    float_bytes = float_model.weight_bytes
    free_weights(float_model.transformer.weights)
    ref32 = None
    if floor and dtype != "float32":
        m32 = make(None, "float32")
        ref32 = last_logits(m32, ids)
        free_weights(m32.transformer.weights)
        floor_row = {f"{k}_vs_float32": v for k, v in compare(ref32, base).items()}
        rows.append({"bench": "quant_accuracy", "model": label, "format": "none",
                     "label": f"{dtype} (unquantized)", "dtype": dtype, "prompts": prompts,
                     "prompt_len": prompt_len, **compare(base, base), **floor_row,
                     "median_top1_gap": median_top1_gap(ref32),
                     "weight_bytes": float_bytes, "float_weight_bytes": float_bytes,
                     **trained})  # fmt: skip
    for fmt in formats:
        t0 = time.perf_counter()
        m = make(fmt, dtype)
        got = last_logits(m, ids)
        row = {"bench": "quant_accuracy", "model": label, "format": fmt,
               "label": m.quantization, "dtype": dtype, "prompts": prompts,
               "prompt_len": prompt_len, **compare(base, got),
               "weight_bytes": m.weight_bytes, "float_weight_bytes": float_bytes,
               "seconds": time.perf_counter() - t0, **trained}  # fmt: skip
        if ref32 is not None:
            row.update({f"{k}_vs_float32": v for k, v in compare(ref32, got).items()})
        free_weights(m.transformer.weights)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pygpukit.bench.quant_accuracy",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--model", default="small",
                   help="tinyllama, small, trained, or a model directory")  # fmt: skip
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--group", type=int, default=128, help="int4 group size")
    p.add_argument("--dtype", default="float32", help="the activations' (and float weights') dtype")
    p.add_argument("--floor", action="store_true",
                   help="also against the float32 model (the dtype's own floor)")  # fmt: skip
    p.add_argument("--train-steps", type=int, default=1500, help="--model trained: its steps")
    p.add_argument("--trained-dir", default=None, metavar="DIR",
                   help="--model trained: keep (and reuse) the checkpoint here")  # fmt: skip
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    a = p.parse_args(argv)
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    rows = run(a.model, a.prompts, a.prompt_len, formats, a.group, a.dtype, floor=a.floor,
               train_steps=a.train_steps, trained_dir=a.trained_dir)  # fmt: skip
    vs32 = any("top1_agreement_vs_float32" in r for r in rows)
    print(f"{'format':<20}{'logits rel err':>16}{'top-1 agreement':>18}{'weights MB':>12}"
          + (f"{'vs float32: rel err':>22}{'top-1':>8}" if vs32 else ""))  # fmt: skip
    for r in rows:
        line = (f"{r['label']:<20}{r['logits_rel_err']:>16.5f}{r['top1_agreement']:>18.4f}"
                f"{r['weight_bytes'] / 1e6:>12.1f}")  # fmt: skip
        if "top1_agreement_vs_float32" in r:
            line += f"{r['logits_rel_err_vs_float32']:>22.5f}{r['top1_agreement_vs_float32']:>8.4f}"
        print(line)
    if "heldout_bits_per_byte" in rows[0]:
        r = rows[0]
        print(f"(trained {r['train_steps']} steps in {r['train_s']:.0f} s: held-out "
              f"{r['heldout_bits_per_byte']:.2f} bits a byte, next byte top-1 "
              f"{r['heldout_top1']:.3f})")  # fmt: skip
    if vs32:
        print(f"(median top-1 gap of the float32 logits: {rows[0]['median_top1_gap']:.3f} "
              f"standard deviations)")  # fmt: skip
    print(
        f"({rows[0]['model']}, {a.prompts} prompts of {a.prompt_len} tokens, {a.dtype}; "
        f"float weights {rows[0]['float_weight_bytes'] / 1e6:.1f} MB)",
        file=sys.stderr,
    )
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
