"""The decoder-only transformer (Llama, Mistral, Qwen2, Qwen3) on GPUArrays.

One readable chain of small classes, after gpt-fast's model.py. Everything is written with
the array API and gpk.nn; the passes turn it into fused kernels (the RMSNorm below, with
its float32 upcast, is the pattern the RMSNorm fusion recognises; silu(gate) * up is
SwiGLU). Nothing here calls a kernel.

Shapes: B batch, T new tokens, S cache length, H/KV query/key-value heads, D head_dim.
The KV cache is static: [B, KV, S, D] per layer, written at a position given as a 0-d
integer array, so one decode step is one graph whatever the position, and one prefill
chunk of T tokens (written at [pos, pos + T)) is one graph whatever the chunk's position.

A chunk's attention (chunk_mask) is not written out: its left-padding queries see no key at
all, which a written-out softmax turns into NaN (and NaN in the cache leaks into real rows
through 0 * NaN), while sdpa defines such a row as zeros. The unchunked prefill mask lets a
padding query see itself instead, and that is not what sdpa's kv_start computes, so no
pass could map one onto the other exactly. The chunk step therefore calls
gpk.nn.scaled_dot_product_attention with the bounds it knows (causal, kv_len = pos + T,
kv_start = the padding offsets). A sliding-window model keeps the written-out form with a
[B, 1, 1, T, S] mask (padding queries see themselves) until sdpa takes a window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import pygpukit as gpk
from pygpukit.array import GPUArray
from pygpukit.ir.dtypes import DType

from .config import ModelConfig, rope_tables


class RMSNorm:
    """x / rms(x) * weight, normalised in float32 and cast back before the weight (as HF)."""

    def __init__(self, weight: GPUArray, eps: float) -> None:
        self.weight, self.eps = weight, eps

    def __call__(self, x: GPUArray) -> GPUArray:
        x32 = x.astype(gpk.float32)
        normed = x32 * gpk.rsqrt((x32 * x32).mean(-1, keepdims=True) + self.eps)
        return normed.astype(x.dtype) * self.weight


class RotaryEmbedding:
    """cos/sin tables [max_seq_len, D/2] (default, linear or llama3 frequencies)."""

    def __init__(self, cfg: ModelConfig, max_seq_len: int) -> None:
        cos, sin = rope_tables(cfg, max_seq_len)
        self.cos, self.sin = gpk.from_numpy(cos), gpk.from_numpy(sin)
        self.cos.readonly = self.sin.readonly = True

    def span(self, length: int) -> tuple[GPUArray, GPUArray]:
        """Positions 0..length-1 (a prefill)."""
        return self.cos[:length], self.sin[:length]

    def chunk(self, pos: GPUArray, length: int) -> tuple[GPUArray, GPUArray]:
        """Positions pos..pos+length-1 (a prefill chunk; pos is read on the device)."""
        rows = gpk.dynamic_slice(pos, length)
        return self.cos[rows], self.sin[rows]

    def at(self, pos: GPUArray) -> tuple[GPUArray, GPUArray]:
        """The one position `pos` (a 0-d integer array, read on the device)."""
        half = self.cos.shape[1]
        return self.cos[pos].reshape(1, half), self.sin[pos].reshape(1, half)


class KVCache:
    def __init__(
        self, batch: int, kv_heads: int, max_seq_len: int, head_dim: int, dtype: DType
    ) -> None:
        shape = (batch, kv_heads, max_seq_len, head_dim)
        self.k = gpk.zeros(shape, dtype).realize()
        self.v = gpk.zeros(shape, dtype).realize()

    def write(self, k: GPUArray, v: GPUArray, pos: GPUArray | None) -> tuple[GPUArray, GPUArray]:
        """Store the new k/v [B, KV, T, D]; return the keys/values attention should see.

        pos None: a prefill of T tokens from position 0, which attends to itself only.
        Otherwise T tokens at positions pos..pos+T-1 (a chunk, or one decode token, the
        form the kv-append fusion recognises), which attend to the whole cache (masked).
        """
        t = k.shape[2]
        if pos is None:
            self.k[:, :, :t] = k
            self.v[:, :, :t] = v
            return k, v
        if t == 1:
            self.k[:, :, pos] = k[:, :, 0]
            self.v[:, :, pos] = v[:, :, 0]
        else:
            rows = gpk.dynamic_slice(pos, t)
            self.k[:, :, rows] = k
            self.v[:, :, rows] = v
        return self.k, self.v

    def arrays(self) -> list[GPUArray]:
        return [self.k, self.v]


@dataclass(frozen=True)
class CacheBounds:
    """What the T queries of a prefill chunk at positions pos..pos+T-1 see of the cache:
    keys kv_start[b]..kv_len-1 (kv_len = pos + T), causally, so query i sees keys up to
    pos + i, and with a sliding window only its last `window` keys; a query that sees no
    key (left padding) gives zeros. sdpa's own masks."""

    kv_len: GPUArray  # 0-d integer
    kv_start: GPUArray  # [B] integers
    window: int | None = None


Mask = GPUArray | CacheBounds


def attention(q: GPUArray, k: GPUArray, v: GPUArray, mask: Mask) -> GPUArray:
    """softmax(q k^T / sqrt(D), masked) v with grouped-query heads.

    The G = H / KV query heads sharing a key/value head are folded into the row axis, so
    k and v are read once per group rather than repeated. mask [B, 1, 1, T, S] is True
    where a query may see a key. Scores and softmax are float32, as HF's eager attention.
    CacheBounds (a prefill chunk, see the module docstring) goes to sdpa as it is.
    """
    if isinstance(mask, CacheBounds):
        return gpk.nn.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            kv_len=mask.kv_len,
            kv_start=mask.kv_start,
            window=mask.window,
        )
    b, h, t, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    g = h // kv
    scores = (q.reshape(b, kv, g * t, d) @ k.swapaxes(-1, -2)).astype(gpk.float32)
    scores = scores.reshape(b, kv, g, t, s) * (1.0 / math.sqrt(d))
    scores = gpk.where(mask, scores, -math.inf)
    p = gpk.nn.softmax(scores, axis=-1).astype(q.dtype).reshape(b, kv, g * t, s)
    return (p @ v).reshape(b, h, t, d)


def _unreduced(x: GPUArray) -> GPUArray:
    """A row-parallel linear's output as it is: one rank holds the whole sum (llm/parallel.py
    makes it an all_reduce over the ranks)."""
    return x


class Attention:
    def __init__(self, cfg: ModelConfig, w: dict[str, GPUArray], i: int) -> None:
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.wqkv, self.wo = w[f"{i}.wqkv"], w[f"{i}.wo"]
        self.bqkv = w.get(f"{i}.bqkv")
        self.q_norm = RMSNorm(w[f"{i}.q_norm"], cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(w[f"{i}.k_norm"], cfg.rms_norm_eps) if cfg.qk_norm else None
        self.cache: KVCache | None = None
        self.reduce: Callable[[GPUArray], GPUArray] = _unreduced  # tensor parallel: all_reduce

    def __call__(
        self, x: GPUArray, cos: GPUArray, sin: GPUArray, mask: Mask, pos: GPUArray | None
    ) -> GPUArray:
        assert self.cache is not None, "Transformer.setup_cache() first"
        b, t, _ = x.shape
        hq, hk, d = self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.head_dim
        qkv = gpk.nn.linear(x, self.wqkv, self.bqkv)
        q = qkv[:, :, :hq].reshape(b, t, self.n_heads, d)
        k = qkv[:, :, hq : hq + hk].reshape(b, t, self.n_kv, d)
        v = qkv[:, :, hq + hk :].reshape(b, t, self.n_kv, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = gpk.nn.rope(q.swapaxes(1, 2), cos, sin)
        k = gpk.nn.rope(k.swapaxes(1, 2), cos, sin)
        keys, values = self.cache.write(k, v.swapaxes(1, 2), pos)
        y = attention(q, keys, values, mask)
        return self.reduce(gpk.nn.linear(y.swapaxes(1, 2).reshape(b, t, hq), self.wo))


class MLP:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one GEMM."""

    def __init__(self, cfg: ModelConfig, w: dict[str, GPUArray], i: int) -> None:
        self.inter = cfg.intermediate_size
        self.w_gate_up, self.w_down = w[f"{i}.w_gate_up"], w[f"{i}.w_down"]
        self.reduce: Callable[[GPUArray], GPUArray] = _unreduced  # tensor parallel: all_reduce

    def __call__(self, x: GPUArray) -> GPUArray:
        gu = gpk.nn.linear(x, self.w_gate_up)
        gate, up = gu[:, :, : self.inter], gu[:, :, self.inter :]
        return self.reduce(gpk.nn.linear(gpk.nn.silu(gate) * up, self.w_down))


class Block:
    def __init__(self, cfg: ModelConfig, w: dict[str, GPUArray], i: int) -> None:
        self.attn_norm = RMSNorm(w[f"{i}.attn_norm"], cfg.rms_norm_eps)
        self.attn = Attention(cfg, w, i)
        self.mlp_norm = RMSNorm(w[f"{i}.mlp_norm"], cfg.rms_norm_eps)
        self.mlp = MLP(cfg, w, i)

    def __call__(
        self, x: GPUArray, cos: GPUArray, sin: GPUArray, mask: Mask, pos: GPUArray | None
    ) -> GPUArray:
        h = x + self.attn(self.attn_norm(x), cos, sin, mask, pos)
        return h + self.mlp(self.mlp_norm(h))


class Transformer:
    """Embedding, the blocks, the final norm and the LM head."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, GPUArray], dtype: DType) -> None:
        self.config, self.weights, self.dtype = cfg, weights, dtype
        self.embed, self.lm_head = weights["embed"], weights["lm_head"]
        self.layers = [Block(cfg, weights, i) for i in range(cfg.num_layers)]
        self.norm = RMSNorm(weights["norm"], cfg.rms_norm_eps)
        self.rope: RotaryEmbedding | None = None
        self.batch = self.max_seq_len = 0

    def setup_cache(self, batch: int, max_seq_len: int) -> None:
        """Static KV caches [batch, KV, max_seq_len, D]; reused while the sizes stay."""
        if max_seq_len > self.config.max_position_embeddings:
            raise gpk.errors.GPUKitValueError(
                f"setup_cache: max_seq_len {max_seq_len} exceeds the model's "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )
        if (batch, max_seq_len) == (self.batch, self.max_seq_len):
            return
        c = self.config
        for layer in self.layers:
            layer.attn.cache = KVCache(batch, c.num_kv_heads, max_seq_len, c.head_dim, self.dtype)
        self.rope = RotaryEmbedding(c, max_seq_len)
        self.batch, self.max_seq_len = batch, max_seq_len

    def cache_arrays(self) -> list[GPUArray]:
        """The KV-cache arrays of every layer (after `setup_cache`): the arrays the compiled
        prefill and decode steps capture and write.

        Returns:
            A new list of the arrays.
        """
        return [a for layer in self.layers if layer.attn.cache for a in layer.attn.cache.arrays()]

    def __call__(
        self, tokens: GPUArray, mask: Mask, pos: GPUArray | None = None, last_only: bool = True
    ) -> GPUArray:
        """Logits (float32) for tokens [B, T]: a prefill from position 0 (pos None), or T
        tokens at positions pos..pos+T-1 (a prefill chunk, mask from chunk_mask; T == 1 is
        a decode step, mask from decode_mask). last_only keeps the last position's [B, V]."""
        assert self.rope is not None, "setup_cache() first"
        t = tokens.shape[1]
        if pos is None:
            cos, sin = self.rope.span(t)
        else:
            cos, sin = self.rope.at(pos) if t == 1 else self.rope.chunk(pos, t)
        x = gpk.take(self.embed, tokens, axis=0)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos)
        if last_only:
            x = x[:, t - 1 :]
        logits = gpk.nn.linear(self.norm(x), self.lm_head).astype(gpk.float32)
        return logits[:, 0] if last_only else logits


def prefill_mask(start: GPUArray, length: int, window: int | None = None) -> GPUArray:
    """[B, 1, 1, T, T]: causal, and no real token sees the left padding before start[b].

    A padding query sees itself, so no softmax row is empty (an empty row would be NaN,
    and NaN in the padding's values would leak through 0 * NaN). With a sliding window,
    query i sees keys j > i - window only (Mistral's rule).
    """
    i = gpk.arange(length).reshape(length, 1)
    j = gpk.arange(length).reshape(1, length)
    st = start.reshape(-1, 1, 1)
    ok = (j <= i) & ((j >= st) | (j == i))
    if window is not None and window < length:
        ok = ok & (j > i - window)
    return ok.reshape(-1, 1, 1, length, length)


def chunk_mask(
    start: GPUArray, pos: GPUArray, length: int, max_seq_len: int, window: int | None = None
) -> Mask:
    """What a prefill chunk of `length` queries at positions pos.. sees of the cache:
    causal, from start[b] on, and with a sliding window narrower than the cache, query i
    sees keys j > pos + i - window only (Mistral's rule): CacheBounds, sdpa's own masks."""
    return CacheBounds(pos + length, start, window if window is not None and
                       window < max_seq_len else None)  # fmt: skip


def decode_mask(
    start: GPUArray, pos: GPUArray, max_seq_len: int, window: int | None = None
) -> GPUArray:
    """[B, 1, 1, 1, S]: cache slots start[b]..pos are visible (the last `window` of them)."""
    j = gpk.arange(max_seq_len).reshape(1, max_seq_len)
    ok = (j <= pos) & (j >= start.reshape(-1, 1))
    if window is not None and window < max_seq_len:
        ok = ok & (j > pos - window)
    return ok.reshape(-1, 1, 1, 1, max_seq_len)


def left_pad(tokens: list[list[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to `length`: ids [B, length] and start offsets [B] (int64)."""
    ids = np.full((len(tokens), length), pad_id, dtype=np.int64)
    start = np.zeros(len(tokens), dtype=np.int64)
    for b, row in enumerate(tokens):
        ids[b, length - len(row) :] = row
        start[b] = length - len(row)
    return ids, start
