"""A paged KV cache and the model's forward pass over it (the serving engine's model).

The cache is a pool of fixed-size blocks per layer, k and v [num_blocks, KV, block, D];
a sequence owns a list of blocks (its block table), so sequences of any lengths share one
pool and a finished one gives its blocks back at once. One forward pass takes B rows of T
new tokens each with per-row positions, the slots their keys/values are stored at, the
rows' block tables and lengths -- all device arrays, so one compiled graph serves any mix
of sequences of one batch bucket. The layers are the Transformer's own (its norms, MLPs
and weights); only the attention's cache differs from model.py's static KVCache.
"""

from __future__ import annotations

import pygpukit as gpk
from pygpukit.array import GPUArray
from pygpukit.ir.dtypes import DType

from .model import RotaryEmbedding, Transformer


class PagedKVCache:
    """k/v block pools for every layer, and rotary tables up to max_seq_len."""

    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 max_seq_len: int) -> None:  # fmt: skip
        c = model.config
        self.num_blocks, self.block_size, self.max_seq_len = num_blocks, block_size, max_seq_len
        self.dtype: DType = model.dtype
        shape = (num_blocks, c.num_kv_heads, block_size, c.head_dim)
        self.k = [gpk.zeros(shape, self.dtype).realize() for _ in model.layers]
        self.v = [gpk.zeros(shape, self.dtype).realize() for _ in model.layers]
        self.rope = RotaryEmbedding(c, max_seq_len)

    @staticmethod
    def block_bytes(model: Transformer, block_size: int) -> int:
        """Bytes one block takes over all layers, keys and values."""
        c = model.config
        return 2 * c.num_layers * c.num_kv_heads * block_size * c.head_dim * model.dtype.itemsize

    def arrays(self) -> list[GPUArray]:
        return self.k + self.v


def paged_forward(
    model: Transformer,
    cache: PagedKVCache,
    tokens: GPUArray,
    positions: GPUArray,
    slots: GPUArray,
    block_table: GPUArray,
    seq_lens: GPUArray,
    out_rows: GPUArray | None = None,
) -> GPUArray:
    """Logits (float32) [B, V] of the last of each row's T tokens, or [R, V] of the tokens
    out_rows [R] picks (indices into the B*T tokens, row-major).

    tokens, positions [B, T] (a position < 0 is front padding: computed, never stored, and
    masked out of attention); slots [B*T] where each token's key/value is stored (-1: not
    stored); block_table [B, max_blocks] and seq_lens [B] (keys each row has after this
    step's stores) as paged_attention takes them. The serving engine's steps are B rows of
    one token each (T = 1): a running sequence's next token or one token of a prompt, each
    row with its own block table and length, so decode and prefill share one launch.
    """
    b, t = tokens.shape
    c = model.config
    hq, hk, d = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.head_dim
    half = d // 2
    pos = gpk.maximum(positions, 0)  # padding reads row 0 of the tables; its keys are not stored
    cos = gpk.take(cache.rope.cos, pos, axis=0).reshape(b, 1, t, half)
    sin = gpk.take(cache.rope.sin, pos, axis=0).reshape(b, 1, t, half)
    x = gpk.take(model.embed, tokens, axis=0)
    for i, layer in enumerate(model.layers):
        a = layer.attn
        qkv = gpk.nn.linear(layer.attn_norm(x), a.wqkv, a.bqkv)
        q = qkv[:, :, :hq].reshape(b, t, c.num_heads, d)
        k = qkv[:, :, hq : hq + hk].reshape(b, t, c.num_kv_heads, d)
        v = qkv[:, :, hq + hk :].reshape(b * t, c.num_kv_heads, d)
        if a.q_norm is not None and a.k_norm is not None:
            q, k = a.q_norm(q), a.k_norm(k)
        q = gpk.nn.rope(q.swapaxes(1, 2), cos, sin)
        k = gpk.nn.rope(k.swapaxes(1, 2), cos, sin)
        gpk.nn.paged_write(cache.k[i], k.swapaxes(1, 2).reshape(b * t, c.num_kv_heads, d), slots)
        gpk.nn.paged_write(cache.v[i], v, slots)
        y = gpk.nn.paged_attention(q, cache.k[i], cache.v[i], block_table, seq_lens)
        h = x + gpk.nn.linear(y.swapaxes(1, 2).reshape(b, t, hq), a.wo)
        x = h + layer.mlp(layer.mlp_norm(h))
    if out_rows is not None:  # only the rows that sample a token reach the LM head
        r = out_rows.shape[0]
        x = gpk.take(x.reshape(b * t, c.hidden_size), out_rows, axis=0).reshape(r, 1, c.hidden_size)
    else:
        x = x[:, t - 1 :]
    return gpk.nn.linear(model.norm(x), model.lm_head).astype(gpk.float32)[:, 0]
