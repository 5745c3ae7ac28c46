"""Tensor parallelism on the CPU: every weight of each architecture shards so that the
shards put together are the full weight, each rank loads only its shard, and TP=2 and
TP=4 simulated on the NumPy backend (ranks as threads) give the TP=1 logits and greedy
tokens."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import replace

import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.distributed as dist
from pygpukit import llm
from pygpukit.llm.config import ConfigError, ModelConfig
from pygpukit.llm.loader import weight_names
from pygpukit.llm.model import prefill_mask
from pygpukit.llm.parallel import rank_config, shard_of, shard_weight
from pygpukit.llm.tiny import random_weights

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "llm")

# Simulated ranks are threads on the NumPy backend; a GPU runs one process per rank
# (tests/gpu/test_distributed_nccl.py).
pytestmark = pytest.mark.skipif(gpk.backend_name() != "cpu", reason="simulated ranks: CPU backend")


def _config(arch: str) -> ModelConfig:
    """8 query heads and 4 KV heads, so TP=4 splits every part; each architecture's flags."""
    base = ModelConfig(arch=arch, vocab_size=96, hidden_size=64, intermediate_size=96,
                       num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8,
                       rms_norm_eps=1e-5, max_position_embeddings=64, bos_token_id=1,
                       eos_token_ids=(), pad_token_id=0)  # fmt: skip
    if arch == "mistral":
        return replace(base, sliding_window=6)
    if arch == "qwen2":
        return replace(base, attention_bias=True, tie_word_embeddings=True)
    if arch == "qwen3":
        return replace(base, qk_norm=True, tie_word_embeddings=True)
    return base


def _write(path: str, cfg: ModelConfig) -> str:
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f)
    save_file(random_weights(cfg, seed=11), os.path.join(path, "model.safetensors"))
    return path


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(str(tmp_path_factory.mktemp(request.param)), _config(request.param))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tp", [2, 4])
def test_shards_put_together_are_the_weight(arch: str, tp: int) -> None:
    cfg = ModelConfig.from_dict(_config(arch).to_dict())
    weights = random_weights(cfg)
    split = 0
    for name, shape in weight_names(cfg):
        full = weights[name]
        parts = [shard_weight(name, full, r, tp) for r in range(tp)]
        s = shard_of(name, 0, tp)
        if s is None:  # replicated: embedding, LM head, norms
            assert all(p is full for p in parts), name
            continue
        split += 1
        assert all(p.shape[s.axis] * tp == shape[s.axis] for p in parts), name
        np.testing.assert_array_equal(np.concatenate(parts, axis=s.axis), full, err_msg=name)
    per_layer = 3 + 3 * cfg.attention_bias + 2 + 2  # q k v (+biases) o, gate up down
    assert split == cfg.num_layers * per_layer
    rc = rank_config(cfg, tp)
    assert (rc.num_heads, rc.num_kv_heads, rc.intermediate_size) == (8 // tp, 4 // tp, 96 // tp)


def test_each_rank_holds_its_heads(model_dir: str) -> None:
    cfg = ModelConfig.from_json(os.path.join(model_dir, "config.json"))
    full = random_weights(cfg, seed=11)
    d, q, kv = cfg.head_dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim

    def rank_weights() -> dict[str, np.ndarray]:
        m = llm.load(model_dir, progress=False, tensor_parallel=2)
        return {k: v.to_numpy() for k, v in m.transformer.weights.items()}

    for r, w in enumerate(dist.simulate(2, rank_weights)):
        p = "model.layers.1."
        rows = slice(r * q // 2, (r + 1) * q // 2)
        kv_rows = slice(r * kv // 2, (r + 1) * kv // 2)
        want = np.concatenate([full[p + "self_attn.q_proj.weight"][rows],
                               full[p + "self_attn.k_proj.weight"][kv_rows],
                               full[p + "self_attn.v_proj.weight"][kv_rows]])  # fmt: skip
        np.testing.assert_array_equal(w["1.wqkv"], want)
        np.testing.assert_array_equal(w["1.wo"], full[p + "self_attn.o_proj.weight"][:, rows])
        inter = slice(r * cfg.intermediate_size // 2, (r + 1) * cfg.intermediate_size // 2)
        np.testing.assert_array_equal(w["1.w_down"], full[p + "mlp.down_proj.weight"][:, inter])
        np.testing.assert_array_equal(w["embed"], full["model.embed_tokens.weight"])
        assert w["1.wqkv"].shape == ((q + 2 * kv) // 2, cfg.hidden_size)
        if cfg.qk_norm:
            np.testing.assert_array_equal(w["1.q_norm"], full[p + "self_attn.q_norm.weight"])
        assert d == cfg.head_dim


def _run(model_dir: str, tp: int | None) -> tuple[np.ndarray, list[list[int]]]:
    """Prefill logits of a 12-token prompt, and greedy tokens for a batch of two prompts."""
    m = llm.load(model_dir, progress=False, tensor_parallel=tp)
    t = m.transformer
    t.setup_cache(1, 32)
    ids = np.random.default_rng(5).integers(3, 96, 12)
    start = gpk.from_numpy(np.zeros(1, np.int64))
    logits = t(gpk.from_numpy(ids[None]), prefill_mask(start, 12), last_only=False).to_numpy()
    res = m.generate_ids([list(ids[:7]), list(ids[:3])], 8, stop_at_eos=False)
    return logits, [list(map(int, row)) for row in res.tokens]


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_gives_the_tp1_result(model_dir: str, tp: int) -> None:
    want_logits, want_tokens = _run(model_dir, None)
    ranks = dist.simulate(tp, _run, model_dir, tp)
    for logits, tokens in ranks:
        np.testing.assert_allclose(logits, want_logits, rtol=2e-5, atol=2e-5)
        assert tokens == want_tokens
    # every rank has the same bits (the all_reduce hands each the same sum)
    assert all(r[0].tobytes() == ranks[0][0].tobytes() for r in ranks)


def test_errors() -> None:
    path = os.path.join(FIXTURES, "llama")  # 2 KV heads
    with pytest.raises(ConfigError, match="num_key_value_heads: 2 does not split over"):
        dist.simulate(4, functools.partial(llm.load, progress=False, tensor_parallel=4), path)
    with pytest.raises(gpk.errors.DistributedError, match="no communicator"):
        llm.load(path, progress=False, tensor_parallel=2)
    with pytest.raises(gpk.errors.DistributedError, match="communicator has 2 ranks"):
        dist.simulate(2, functools.partial(llm.load, progress=False, tensor_parallel=4), path)
