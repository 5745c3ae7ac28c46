"""A paged KV cache and the model's forward pass over it (the serving engine's model).

The cache is a pool of fixed-size blocks per layer, kv [num_blocks, 2 KV, block, D] (a
block's KV key heads, then its KV value heads); a sequence owns a list of blocks (its
block table), so sequences of any lengths share one pool and a finished one gives its
blocks back at once. Keys and values share a pool so that one paged_write stores a step's
keys (rotated on the way: RoPE fused into the store) and values straight from the QKV
projection, one kernel where the separate rotation and two stores took three; with one
token a row (the serving steps) the attention rotates the queries as it reads them. One
forward pass takes B rows of T new tokens each with per-row positions, the slots their
keys/values are stored at, the rows' block tables and lengths -- all device arrays, so one
compiled graph serves any mix of sequences of one batch bucket. The layers are the
Transformer's own (its norms, MLPs and weights); only the attention's cache differs from
model.py's static KVCache.
"""

from __future__ import annotations

import pygpukit as gpk
from pygpukit.array import GPUArray
from pygpukit.ir.dtypes import DType

from .model import RotaryEmbedding, Transformer


class PagedKVCache:
    """A block pool of keys and values for every layer, and rotary tables up to
    max_seq_len."""

    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 max_seq_len: int) -> None:  # fmt: skip
        c = model.config
        self.num_blocks, self.block_size, self.max_seq_len = num_blocks, block_size, max_seq_len
        self.dtype: DType = model.dtype
        self.kv_heads = c.num_kv_heads
        shape = (num_blocks, 2 * c.num_kv_heads, block_size, c.head_dim)
        self.kv = [gpk.zeros(shape, self.dtype).realize() for _ in model.layers]
        self.rope = RotaryEmbedding(c, max_seq_len)

    def pools(self, layer: int) -> tuple[GPUArray, GPUArray]:
        """Layer `layer`'s key and value pools [num_blocks, KV, block, D]: views of its pool
        as it is now (after this step's stores)."""
        kv, n = self.kv[layer], self.kv_heads
        return kv[:, :n], kv[:, n:]

    @staticmethod
    def block_bytes(model: Transformer, block_size: int) -> int:
        """Bytes one block takes over all layers, keys and values."""
        c = model.config
        return 2 * c.num_layers * c.num_kv_heads * block_size * c.head_dim * model.dtype.itemsize

    def arrays(self) -> list[GPUArray]:
        return list(self.kv)


def paged_forward(
    model: Transformer,
    cache: PagedKVCache,
    tokens: GPUArray,
    positions: GPUArray,
    slots: GPUArray,
    block_table: GPUArray,
    seq_lens: GPUArray,
    out_rows: GPUArray | None = None,
    pieces: bool = True,
    decode_rows: int | None = None,
) -> GPUArray:
    """Logits (float32) [B, V] of the last of each row's T tokens, or [R, V] of the tokens
    out_rows [R] picks (indices into the B*T tokens, row-major).

    tokens, positions [B, T] (a position < 0 is front padding: computed, never stored, and
    masked out of attention); slots [B*T] where each token's key/value is stored (-1: not
    stored); block_table [B, max_blocks] and seq_lens [B] (keys each row has after this
    step's stores) as paged_attention takes them. The serving engine's steps are B rows of
    one token each (T = 1): a running sequence's next token or one token of a prompt, each
    row with its own block table and length, so decode and prefill share one launch.
    pieces False: no two rows are tokens of one prompt (a decode-only step), so the
    attention launches no prompt-piece kernel (paged_attention's pieces); decode_rows is
    paged_attention's hint (at most that many rows are not tokens of a prompt piece).
    """
    b, t = tokens.shape
    n = b * t
    c = model.config
    h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
    hq = h * d
    # One table row per token: the rope kernel's [seq, D/2] layout with the step's tokens as
    # its sequence (padding reads row 0; its keys are not stored).
    pos = gpk.maximum(positions, 0).reshape(n)
    cos = gpk.take(cache.rope.cos, pos, axis=0).astype(cache.dtype)
    sin = gpk.take(cache.rope.sin, pos, axis=0).astype(cache.dtype)
    x = gpk.take(model.embed, tokens, axis=0)
    for i, layer in enumerate(model.layers):
        a = layer.attn
        rows = gpk.nn.linear(layer.attn_norm(x), a.wqkv, a.bqkv).reshape(n, h + 2 * kv, d)
        q, new_kv = rows[:, :h], rows[:, h:]  # [N, H, D]; [N, 2 KV, D]: keys, then values
        if a.q_norm is not None and a.k_norm is not None:
            q = a.q_norm(q)
            new_kv = gpk.concatenate([a.k_norm(new_kv[:, :kv]), new_kv[:, kv:]], axis=1)
        gpk.nn.paged_write(cache.kv[i], new_kv, slots, cos=cos, sin=sin, rope_heads=kv)
        k_pool, v_pool = cache.pools(i)
        if t == 1:  # the attention rotates q as it reads it: no rope launch of its own
            q = q.reshape(b, h, 1, d)
            y = gpk.nn.paged_attention(q, k_pool, v_pool, block_table, seq_lens, pieces=pieces,
                                       cos=cos, sin=sin, decode_rows=decode_rows)  # fmt: skip
        else:  # q as [1, H, N, D]: the tokens are the rotation's sequence, then [B, H, T, D]
            q = gpk.nn.rope(q.swapaxes(0, 1).reshape(1, h, n, d), cos, sin)
            q = q.reshape(h, b, t, d).swapaxes(0, 1)
            y = gpk.nn.paged_attention(q, k_pool, v_pool, block_table, seq_lens, pieces=pieces)
        h_res = x + gpk.nn.linear(y.swapaxes(1, 2).reshape(b, t, hq), a.wo)
        x = h_res + layer.mlp(layer.mlp_norm(h_res))
    if out_rows is not None:  # only the rows that sample a token reach the LM head
        r = out_rows.shape[0]
        x = gpk.take(x.reshape(b * t, c.hidden_size), out_rows, axis=0).reshape(r, 1, c.hidden_size)
    else:
        x = x[:, t - 1 :]
    return gpk.nn.linear(model.norm(x), model.lm_head).astype(gpk.float32)[:, 0]
