"""Tensor parallelism (Megatron-style) for the decoder of model.py, over gpk.distributed.

Each of the N ranks holds:
- column-parallel: its heads' rows of q/k/v (and their biases; the fused wqkv is
  [q_r; k_r; v_r], each part split by heads) and its rows of gate and up (w_gate_up is
  [gate_r; up_r]): attention and the SwiGLU run on the rank's heads and columns alone;
- row-parallel: the matching columns of o_proj and down_proj, whose partial outputs are
  summed by one all_reduce each (Attention.reduce and MLP.reduce);
- replicated: the embedding, the LM head, every norm (q/k norms act per head).
The KV cache is sharded by KV head (the rank's config has num_kv_heads / N), and every
rank computes the same logits (all_reduce gives each the same bits), so sampling with one
seed picks the same tokens on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .config import ConfigError, ModelConfig
from .model import Transformer


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size` takes the rank-th of `size` equal blocks along `axis` (q, k,
    v, gate and up are separate Hugging Face tensors, each split on its own, so the fused
    wqkv and w_gate_up hold the rank's heads of each part)."""

    axis: int
    rank: int
    size: int  # ranks

    def take(self, a: np.ndarray) -> np.ndarray:
        """The rank's slice of `a` (a view: a memory-mapped tensor reads these bytes only)."""
        n = a.shape[self.axis]
        step = n // self.size
        index = [slice(None)] * a.ndim
        index[self.axis] = slice(self.rank * step, (self.rank + 1) * step)
        return a[tuple(index)]


# How each Hugging Face tensor is split, by the name's ending: 0 rows, 1 columns.
_SPLIT = {
    "q_proj.weight": 0,
    "k_proj.weight": 0,
    "v_proj.weight": 0,
    "q_proj.bias": 0,
    "k_proj.bias": 0,
    "v_proj.bias": 0,
    "gate_proj.weight": 0,
    "up_proj.weight": 0,
    "o_proj.weight": 1,
    "down_proj.weight": 1,
}


def rank_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config one of `size` ranks runs: heads, KV heads and the MLP width divided by
    size. ConfigError naming the field that does not divide."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"tensor_parallel must be an integer >= 1, got {size!r}")
    for field, value in (("num_attention_heads", cfg.num_heads),
                         ("num_key_value_heads", cfg.num_kv_heads),
                         ("intermediate_size", cfg.intermediate_size)):  # fmt: skip
        if value % size:
            raise ConfigError(f"{value} does not split over tensor_parallel={size} ranks",
                              field=field)  # fmt: skip
    if size == 1:
        return cfg
    return replace(cfg, num_heads=cfg.num_heads // size, num_kv_heads=cfg.num_kv_heads // size,
                   intermediate_size=cfg.intermediate_size // size)  # fmt: skip


def shard_of(name: str, rank: int, size: int) -> Shard | None:
    """How rank `rank` of `size` slices the Hugging Face tensor `name` (None: it is
    replicated)."""
    if size == 1:
        return None
    axis = next((ax for end, ax in _SPLIT.items() if name.endswith(end)), None)
    return None if axis is None else Shard(axis, rank, size)


def shard_weight(name: str, a: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s part of tensor `name` (itself when replicated)."""
    s = shard_of(name, rank, size)
    return a if s is None else s.take(a)


def sharder(rank: int, size: int) -> Callable[[str, np.ndarray], np.ndarray]:
    """shard_weight bound to one rank: what the loader applies to each tensor it reads."""

    def shard(name: str, a: np.ndarray) -> np.ndarray:
        return shard_weight(name, a, rank, size)

    return shard


def parallelize(model: Transformer, size: int) -> Transformer:
    """Add the all_reduce after every row-parallel linear (nothing at size 1)."""
    if size > 1:
        from pygpukit import distributed

        for layer in model.layers:
            layer.attn.reduce = layer.mlp.reduce = distributed.all_reduce
    return model
