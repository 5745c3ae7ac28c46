"""A float64 NumPy forward pass of the decoder (Llama/Mistral/Qwen), written from the
definition and reading the checkpoint directly: the reference for generation tests."""

from __future__ import annotations

import os

import numpy as np

from pygpukit.llm import ModelConfig
from pygpukit.llm.config import inv_freq
from pygpukit.llm.loader import Checkpoint, checkpoint_files


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Reference:
    """forward(ids) -> (logits [T, V], keys per layer [KV, T, D]) for one unpadded row."""

    def __init__(self, path: str) -> None:
        self.cfg = ModelConfig.from_json(os.path.join(path, "config.json"))
        ck = Checkpoint(checkpoint_files(path))
        self.w = {n: ck.numpy(n).astype(np.float64) for n in ck.tensors}
        ck.close()

    def forward(self, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        c, w = self.cfg, self.w
        t, d, g = len(ids), c.head_dim, c.num_heads // c.num_kv_heads
        ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq(c).astype(np.float64)[None]
        cos, sin = np.cos(ang), np.sin(ang)
        causal = np.tril(np.ones((t, t), bool))
        if c.sliding_window is not None:
            causal &= np.arange(t)[None, :] > np.arange(t)[:, None] - c.sliding_window
        x = w["model.embed_tokens.weight"][ids]
        keys = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            qkv = []
            for n, heads in (("q", c.num_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)):
                y = h @ w[p + f"self_attn.{n}_proj.weight"].T
                if c.attention_bias:
                    y = y + w[p + f"self_attn.{n}_proj.bias"]
                qkv.append(y.reshape(t, heads, d).transpose(1, 0, 2))
            q, k, v = qkv
            if c.qk_norm:
                q = _rms(q, w[p + "self_attn.q_norm.weight"], c.rms_norm_eps)
                k = _rms(k, w[p + "self_attn.k_norm.weight"], c.rms_norm_eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            keys.append(k)
            s = q @ np.repeat(k, g, 0).swapaxes(-1, -2) / np.sqrt(d)
            s = np.where(causal, s, -np.inf)
            prob = np.exp(s - s.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            o = (prob @ np.repeat(v, g, 0)).transpose(1, 0, 2).reshape(t, -1)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = _rms(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        x = _rms(x, w["model.norm.weight"], c.rms_norm_eps)
        head = w["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
        return x @ head.T, keys
