"""Model configuration read from a Hugging Face config.json.

One dataclass covers the Llama family (Llama 2/3, TinyLlama, Mistral) and Qwen2/Qwen3;
the differences are flags (qkv bias, q/k norm, tied embeddings) rather than subclasses.
transformers 4.x writes rope_theta and rope_scaling; 5.x folds both into rope_parameters.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygpukit import errors

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(errors.GPUKitError, ValueError):
    """A config.json this runtime cannot run (unknown architecture, bad field)."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    sliding_window: int | None = None  # Mistral: a key is visible while i - j < window

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        arch = str(d.get("model_type", ""))
        if arch not in ARCHITECTURES:
            raise ConfigError(
                f"{source}: model_type {arch!r} is not supported (supported: "
                f"{', '.join(ARCHITECTURES)})"
            )
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            kv = int(d.get("num_key_value_heads") or heads)
            head_dim = int(d.get("head_dim") or hidden // heads)
            rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
            eos = d.get("eos_token_id")
            eos_ids = tuple(
                int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None
            )
            act = d.get("hidden_act", "silu")
            cfg = cls(
                arch=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=kv,
                head_dim=head_dim,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=rope,
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases; its config does not say so.
                attention_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
                qk_norm=arch == "qwen3",
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos_ids,
                pad_token_id=d.get("pad_token_id"),
                sliding_window=_sliding_window(arch, d, source),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{source}: missing or bad field {e}") from None
        if d.get("mlp_bias"):
            raise ConfigError(f"{source}: mlp_bias is not supported")
        if act not in ("silu", "swish"):
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only silu)")
        if cfg.num_heads % cfg.num_kv_heads:
            raise ConfigError(
                f"{source}: {cfg.num_heads} attention heads are not a multiple of "
                f"{cfg.num_kv_heads} key/value heads"
            )
        if cfg.head_dim % 2:
            raise ConfigError(f"{source}: head_dim {cfg.head_dim} must be even for rotary")
        if cfg.rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"{source}: rope type {cfg.rope_type!r} is not supported "
                f"(supported: {', '.join(ROPE_TYPES)})"
            )
        return cfg

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ModelConfig:
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the model config: {e}") from None
        return cls.from_dict(d, str(path))

    def to_dict(self) -> dict[str, Any]:
        """The config.json fields this runtime reads (tiny.py writes models with it)."""
        d: dict[str, Any] = {
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
        }
        if self.rope_scaling:
            d["rope_scaling"] = dict(self.rope_scaling)
        if self.sliding_window is not None:
            d["sliding_window"] = self.sliding_window
        return d

    def param_count(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            layer += q + 2 * kv
        if self.qk_norm:
            layer += 2 * self.head_dim
        return self.num_layers * layer + v * h * (1 if self.tie_word_embeddings else 2) + h


def _sliding_window(arch: str, d: dict[str, Any], source: str) -> int | None:
    window = d.get("sliding_window")
    if arch in ("qwen2", "qwen3"):
        # Qwen's window applies to some layers only (max_window_layers); the released
        # models switch it off, and a config that switches it on is refused, not misread.
        if d.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window is not supported for {arch}")
        return None
    return int(window) if window else None


def inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Rotary inverse frequencies [head_dim/2] with the config's scaling, in float32 as HF."""
    d = cfg.head_dim
    base = np.float32(1.0) / (
        np.float32(cfg.rope_theta) ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)
    )
    base = base.astype(np.float32)
    kind = cfg.rope_type
    s = cfg.rope_scaling
    if kind == "default":
        return base
    factor = float(s["factor"])
    if kind == "linear":
        return (base / np.float32(factor)).astype(np.float32)
    # llama3: long wavelengths divided by factor, short kept, a smooth ramp between.
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = np.float32(2 * math.pi) / base
    out = np.where(wavelen > low_wavelen, base / np.float32(factor), base)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / np.float32(factor) + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out).astype(np.float32)


def rope_tables(cfg: ModelConfig, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [max_seq_len, head_dim/2], float32, angles computed as HF does."""
    freqs = np.arange(max_seq_len, dtype=np.float32)[:, None] * inv_freq(cfg)[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
