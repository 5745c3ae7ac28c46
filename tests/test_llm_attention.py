"""The model's masked GQA attention against a float64 loop written from the definition."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.llm.model import attention, decode_mask, prefill_mask


def ref_attention(q, k, v, visible):
    """q [B,H,T,D], k/v [B,KV,S,D], visible(b, i, j) -> bool; head h reads kv head h // G."""
    b_, h_, t_, d_ = q.shape
    g = h_ // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(t_):
                js = [j for j in range(k.shape[2]) if visible(b, i, j)]
                s = np.array([q[b, h, i] @ k[b, h // g, j] for j in js]) / np.sqrt(d_)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, h, i] = p @ v[b, h // g, js]
    return out


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("window", [None, 3])
def test_prefill_left_padded(window):
    rng = np.random.default_rng(0 if window is None else window)
    b, h, kv, t, d = 2, 6, 2, 7, 8
    q, k, v = _rand(rng, b, h, t, d), _rand(rng, b, kv, t, d), _rand(rng, b, kv, t, d)
    start = np.array([0, 3])

    def visible(bb, i, j):
        if i < start[bb]:  # a padding query sees itself only
            return j == i
        return start[bb] <= j <= i and (window is None or j > i - window)

    mask = prefill_mask(gpk.from_numpy(start), t, window)
    got = attention(gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v), mask).to_numpy()
    want = ref_attention(q, k, v, visible)
    real = (np.arange(t)[None, :] >= start[:, None])[:, None, :].repeat(h, 1)  # pads: any
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("window", [None, 4])
def test_decode_over_static_cache(window):
    rng = np.random.default_rng(7)
    b, h, kv, s, d = 3, 4, 1, 12, 8
    q = _rand(rng, b, h, 1, d)
    k, v = _rand(rng, b, kv, s, d), _rand(rng, b, kv, s, d)
    start, pos = np.array([0, 2, 5]), 9

    def visible(bb, i, j):
        return start[bb] <= j <= pos and (window is None or j > pos - window)

    mask = decode_mask(gpk.from_numpy(start), gpk.from_numpy(np.array(pos)), s, window)
    got = attention(gpk.from_numpy(q), gpk.from_numpy(k), gpk.from_numpy(v), mask).to_numpy()
    np.testing.assert_allclose(got, ref_attention(q, k, v, visible), rtol=1e-5, atol=1e-5)


def test_sliding_window_config():
    from pygpukit.llm import ConfigError, ModelConfig

    base = {"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}  # fmt: skip
    assert ModelConfig.from_dict({**base, "sliding_window": 4096}).sliding_window == 4096
    assert ModelConfig.from_dict({**base, "sliding_window": None}).sliding_window is None
    qwen = {**base, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}
    assert ModelConfig.from_dict(qwen).sliding_window is None
    with pytest.raises(ConfigError, match="use_sliding_window"):
        ModelConfig.from_dict({**qwen, "use_sliding_window": True})
    with pytest.raises(ConfigError, match="mlp_bias"):
        ModelConfig.from_dict({**base, "mlp_bias": True})
