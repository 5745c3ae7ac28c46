"""Model configuration read from a Hugging Face config.json.

One dataclass covers the Llama family (Llama 2/3, TinyLlama, Mistral) and Qwen2/Qwen3;
the differences are flags (qkv bias, q/k norm, tied embeddings) rather than subclasses.
transformers 4.x writes rope_theta and rope_scaling; 5.x folds both into rope_parameters.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygpukit import errors

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(errors.LoadError):
    """A config.json this runtime cannot run (unknown architecture, a bad or inconsistent
    field); a LoadError naming the file and the field."""


MAX_DIM = (1 << 31) - 1  # sizes and counts index int32 on the device
_REQUIRED = object()


class _Fields:
    """Typed reads of config.json fields; each failure names the file and the field."""

    def __init__(self, d: dict[str, Any], source: str, prefix: str = "") -> None:
        self.d, self.source, self.prefix = d, source, prefix

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(message, file=self.source, field=self.prefix + field)

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.d:
            return self.d[key]
        if default is _REQUIRED:
            raise self.fail(key, "missing")
        return default

    def integer(self, key: str, default: Any = _REQUIRED, least: int = 1) -> Any:
        """An integer in [least, MAX_DIM]; JSON floats and strings are refused, not cut."""
        v = self.get(key, default)
        if v is default and default is not _REQUIRED:
            return v
        return self.check_int(key, v, least)

    def check_int(self, key: str, v: Any, least: int = 1, most: int = MAX_DIM) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= most:
            raise self.fail(key, f"must be an integer in [{least}, {most}], got {v!r}")
        return v

    def number(self, key: str, default: Any = _REQUIRED, positive: bool = True) -> float:
        """A finite number (> 0 when positive); an integer is taken as its float."""
        v = self.get(key, default)
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or (positive and v <= 0)
        ):
            want = "a finite number > 0" if positive else "a finite number"
            raise self.fail(key, f"must be {want}, got {v!r}")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {v!r}")
        return v

    def token(self, key: str, vocab: int) -> int | None:
        v = self.get(key, None)
        return None if v is None else self.check_int(key, v, 0, vocab - 1)


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
        """The RoPE scaling type from config.json's `rope_scaling` ("default" when none)."""
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    @classmethod
    def from_dict(cls, d: Any, source: str = "config.json") -> ModelConfig:
        """Read and check a config.json document: every field's type and range, and the
        fields' consistency (heads, head_dim, token ids, rope), before anything is made."""
        if not isinstance(d, dict):
            raise ConfigError(f"expected a JSON object, got {type(d).__name__}", file=source)
        f = _Fields(d, source)
        arch = f.get("model_type", "")
        if arch not in ARCHITECTURES:
            raise f.fail(
                "model_type", f"{arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
            )
        hidden = f.integer("hidden_size")
        heads = f.integer("num_attention_heads")
        kv = f.integer("num_key_value_heads", None)
        kv = heads if kv is None else kv
        head_dim = f.integer("head_dim", None)
        if head_dim is None:
            head_dim = hidden // heads
            if head_dim < 1:
                raise f.fail(
                    "num_attention_heads",
                    f"{heads} heads leave no head_dim for hidden_size {hidden}",
                )
        vocab = f.integer("vocab_size")
        eos = f.get("eos_token_id", None)
        eos_list = eos if isinstance(eos, list) else [eos]
        eos_ids = tuple(
            f.check_int("eos_token_id", e, 0, vocab - 1) for e in eos_list if e is not None
        )
        act = f.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise f.fail("hidden_act", f"{act!r} is not supported (only silu)")
        if f.flag("mlp_bias", False):
            raise f.fail("mlp_bias", "true is not supported")
        theta, rope = _rope(f)
        cfg = cls(
            arch=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=f.integer("intermediate_size"),
            num_layers=f.integer("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            rms_norm_eps=f.number("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=f.integer("max_position_embeddings", 2048),
            tie_word_embeddings=f.flag("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; its config does not say so.
            attention_bias=arch == "qwen2" or f.flag("attention_bias", False),
            qk_norm=arch == "qwen3",
            bos_token_id=f.token("bos_token_id", vocab),
            eos_token_ids=eos_ids,
            pad_token_id=f.token("pad_token_id", vocab),
            sliding_window=_sliding_window(arch, f),
        )
        if cfg.num_heads % cfg.num_kv_heads:
            raise f.fail(
                "num_key_value_heads",
                f"{cfg.num_heads} attention heads are not a "
                f"multiple of {cfg.num_kv_heads} key/value heads",
            )
        if cfg.head_dim % 2:
            raise f.fail("head_dim", f"{cfg.head_dim} must be even for rotary")
        return cfg

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ModelConfig:
        """Read config.json (a regular file; size, nesting and duplicate keys checked)."""
        from .files import load_json_file

        path = os.fspath(path)
        return cls.from_dict(load_json_file(path, "the model config"), path)

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
        """The number of parameters the config describes (the LM head counted unless tied).

        Returns:
            The count.
        """
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            layer += q + 2 * kv
        if self.qk_norm:
            layer += 2 * self.head_dim
        return self.num_layers * layer + v * h * (1 if self.tie_word_embeddings else 2) + h


def _sliding_window(arch: str, f: _Fields) -> int | None:
    if arch in ("qwen2", "qwen3"):
        # Qwen's window applies to some layers only (max_window_layers); the released
        # models switch it off, and a config that switches it on is refused, not misread.
        if f.flag("use_sliding_window", False):
            raise f.fail("use_sliding_window", f"true is not supported for {arch}")
        return None
    window = f.get("sliding_window", None)
    return None if window is None or window == 0 else f.check_int("sliding_window", window)


def _rope(f: _Fields) -> tuple[float, dict[str, Any]]:
    """rope_theta and the scaling dict (transformers 5 folds both into rope_parameters),
    each number checked: a zero or missing factor would make every logit NaN."""
    key = "rope_parameters" if f.d.get("rope_parameters") else "rope_scaling"
    raw = f.get(key, None) or {}
    if not isinstance(raw, dict):
        raise f.fail(key, f"must be an object, got {type(raw).__name__}")
    rope = dict(raw)
    if "rope_theta" in rope:
        theta = _Fields(rope, f.source, key + ".").number("rope_theta")
        del rope["rope_theta"]
    else:
        theta = f.number("rope_theta", 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise f.fail(
            key, f"rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    sub = _Fields(rope, f.source, key + ".")
    if kind in ("linear", "llama3"):
        sub.number("factor")
    if kind == "llama3":
        low = sub.number("low_freq_factor")
        high = sub.number("high_freq_factor")
        sub.number("original_max_position_embeddings")
        if high <= low:
            raise sub.fail("high_freq_factor", f"{high} must exceed low_freq_factor {low}")
    return theta, rope


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
