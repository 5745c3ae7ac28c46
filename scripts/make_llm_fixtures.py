"""Make the tiny Hugging Face reference models under tests/fixtures/llm/<arch>/.

Runs where torch and transformers are installed (the GPU machine); it imports no pygpukit,
so it needs no built extension. Each fixture is a random-initialised model of one
architecture, saved with save_pretrained (safetensors), plus reference.npz with:

  prompt_a, prompt_b     int64 token ids of two prompts of different lengths
  greedy_a, greedy_b     the 32 greedy tokens after each prompt, f32, full forward each step
  logits_a, logits_b     f32 logits [len(prompt)+32, vocab] of prompt + greedy tokens
  logits_a_bf16          logits of the same sequence with the model cast to bfloat16
  inv_freq               the rotary inverse frequencies transformers computed (scaling applied)

    python scripts/make_llm_fixtures.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import transformers

N_NEW = 32
SEED = 1234

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.08,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

V5 = int(transformers.__version__.split(".")[0]) >= 5


def rope_kwargs(theta: float, scaling: dict | None) -> dict:
    """transformers 5 folds rope_theta and rope_scaling into rope_parameters."""
    if V5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    out: dict = {"rope_theta": theta}
    if scaling:
        out["rope_scaling"] = scaling
    return out


def specs() -> dict[str, tuple[str, str, dict, dict]]:
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return {
        # arch: (config class, model class, config kwargs, save kwargs)
        "llama": ("LlamaConfig", "LlamaForCausalLM",
                  {**COMMON, **rope_kwargs(500000.0, llama3), "tie_word_embeddings": False}, {}),
        "llama_linear": ("LlamaConfig", "LlamaForCausalLM",
                         {**COMMON, **rope_kwargs(10000.0, {"rope_type": "linear",
                                                            "factor": 2.0}),
                          "tie_word_embeddings": False}, {}),
        # Sharded on purpose, so the loader's index.json path is exercised.
        "mistral": ("MistralConfig", "MistralForCausalLM",
                    {**COMMON, **rope_kwargs(10000.0, None), "sliding_window": None,
                     "tie_word_embeddings": False}, {"max_shard_size": "100KB"}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
                  {**COMMON, **rope_kwargs(1000000.0, None), "tie_word_embeddings": True,
                   "use_sliding_window": False}, {}),
        # head_dim 32 != hidden/heads (16), as Qwen3 allows.
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
                  {**COMMON, **rope_kwargs(1000000.0, None), "tie_word_embeddings": True,
                   "head_dim": 32, "use_sliding_window": False}, {}),
    }  # fmt: skip


def perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Default init leaves norms at 1 and biases at 0; randomise them so they are tested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    seq = prompt.clone()
    for _ in range(N_NEW):
        logits = model(seq[None]).logits[0, -1]
        seq = torch.cat([seq, logits.argmax()[None]])
    full = model(seq[None]).logits[0].float().numpy()
    return seq[len(prompt) :].numpy(), full


def make(arch: str, out_root: str) -> None:
    cfg_name, model_name, kwargs, save_kwargs = specs()[arch]
    torch.manual_seed(SEED)
    cfg = getattr(transformers, cfg_name)(**kwargs)
    try:
        cfg._attn_implementation = "eager"  # plain matmul/softmax: the textbook reference
    except Exception as e:
        print(arch, "keeps the default attention:", e)
    model = getattr(transformers, model_name)(cfg).eval().float()
    gen = torch.Generator().manual_seed(SEED + 1)
    perturb(model, gen)
    out = os.path.join(out_root, arch)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, **save_kwargs)

    g = torch.Generator().manual_seed(SEED + 2)
    prompt_a = torch.randint(3, cfg.vocab_size, (11,), generator=g)
    prompt_b = torch.randint(3, cfg.vocab_size, (5,), generator=g)
    greedy_a, logits_a = greedy(model, prompt_a)
    greedy_b, logits_b = greedy(model, prompt_b)
    seq_a = torch.cat([prompt_a, torch.from_numpy(greedy_a)])
    inv_freq = model.model.rotary_emb.inv_freq.float().numpy()
    bf = model.to(torch.bfloat16)
    with torch.no_grad():
        logits_a_bf16 = bf(seq_a[None]).logits[0].float().numpy()
    np.savez(
        os.path.join(out, "reference.npz"),
        prompt_a=prompt_a.numpy(), prompt_b=prompt_b.numpy(),
        greedy_a=greedy_a, greedy_b=greedy_b,
        logits_a=logits_a, logits_b=logits_b, logits_a_bf16=logits_a_bf16,
        inv_freq=inv_freq,
    )  # fmt: skip
    with open(os.path.join(out, "provenance.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "seed": SEED, "device": "cpu", "script": "scripts/make_llm_fixtures.py"},
                  f, indent=1)  # fmt: skip
    print(arch, "ok", sorted(os.listdir(out)), "greedy_a", greedy_a[:8].tolist())
    with open(os.path.join(out, "config.json")) as f:
        print(f.read())


def main() -> int:
    out_root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/llm"
    print("transformers", transformers.__version__, "torch", torch.__version__)
    failed = []
    for arch in specs():
        try:
            make(arch, out_root)
        except Exception as e:  # one architecture missing from this transformers is not fatal
            print(f"{arch} FAILED: {type(e).__name__}: {e}")
            failed.append(arch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
