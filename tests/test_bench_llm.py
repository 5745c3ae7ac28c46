"""The LLM benchmark's own machinery, on the CPU: random weights tiled on the device give
what tiling on the host (np.resize) gives, and llm_long's torch.compile peer stops at its
time budget with a row saying so."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pygpukit.bench import llm as bench_llm
from pygpukit.llm.loader import weight_names


def _host_weight(cfg, name: str, seed: int = 0) -> np.ndarray:
    """The reference: one block of float32 normals, scaled by 1/sqrt(fan_in), np.resize'd."""
    shape = dict(weight_names(cfg))[name]
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    pool = np.random.default_rng(seed).standard_normal(1 << 22).astype(np.float32)
    block = pool * np.float32(1 / math.sqrt(shape[-1]))
    return np.resize(block, math.prod(shape)).reshape(shape)


def test_random_model_tiles_on_the_device_as_np_resize():
    # embed and lm_head: exactly one block (4194304 values); the MLP matrices two blocks
    # and a part; q/k/v under one block (a copied slice of it).
    cfg = dataclasses.replace(bench_llm.tinyllama_config(), num_layers=1, vocab_size=8192,
                              hidden_size=512, intermediate_size=20000, num_heads=4,
                              num_kv_heads=2, head_dim=128)  # fmt: skip
    w = bench_llm.random_model(cfg, "float32").transformer.weights
    p = "model.layers.0."
    want = {
        "embed": _host_weight(cfg, "model.embed_tokens.weight"),
        "lm_head": _host_weight(cfg, "lm_head.weight"),
        "0.wqkv": np.concatenate(
            [_host_weight(cfg, p + f"self_attn.{x}_proj.weight") for x in "qkv"]
        ),  # fmt: skip
        "0.w_gate_up": np.concatenate(
            [
                _host_weight(cfg, p + "mlp.gate_proj.weight"),
                _host_weight(cfg, p + "mlp.up_proj.weight"),
            ]
        ),
        "0.w_down": _host_weight(cfg, p + "mlp.down_proj.weight"),
        "0.attn_norm": _host_weight(cfg, p + "input_layernorm.weight"),
    }
    for key, ref in want.items():
        got = w[key].to_numpy()
        assert got.shape == ref.shape, key
        np.testing.assert_array_equal(got, ref, err_msg=key)
        assert w[key].readonly
    # No two weights share memory: freeing one leaves the others readable.
    w["0.w_down"].free()
    np.testing.assert_array_equal(w["0.wqkv"].to_numpy(), want["0.wqkv"])


def test_long_peer_stops_at_its_time_budget(monkeypatch):
    """The peer's contexts run while the time spent plus the last context's fits the
    budget; the rest are rows that say they were skipped. Ours runs at every context."""
    clock = [0.0]
    cost = {"pygpukit": 5.0, "torch_compile": 25.0}

    def fake(impl):
        def bench(cfg, context, steps, model=None):
            clock[0] += cost[impl]
            return bench_llm._long_row(impl, cfg, context, steps, 0.5)

        return bench

    monkeypatch.setattr(bench_llm.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench_llm, "copy_bandwidth", lambda: (4e12, "a fake copy"))
    monkeypatch.setattr(bench_llm, "random_model", lambda cfg: object())
    monkeypatch.setattr(bench_llm, "bench_long_pygpukit", fake("pygpukit"))
    monkeypatch.setattr(bench_llm, "bench_long_torch_compile", fake("torch_compile"))
    rows = bench_llm.run_long((4096, 16384, 32768), steps=4, peer_budget_s=60.0)
    by = [(r["impl"], r["context"], "skipped" in r) for r in rows]
    assert by == [("roofline", 4096, False), ("roofline", 16384, False),
                  ("roofline", 32768, False), ("pygpukit", 4096, False),
                  ("pygpukit", 16384, False), ("pygpukit", 32768, False),
                  ("torch_compile", 4096, False), ("torch_compile", 16384, False),
                  ("torch_compile", 32768, True)]  # fmt: skip
    assert "60 s" in rows[-1]["skipped"] and "50 s spent" in rows[-1]["skipped"]
    cfg = bench_llm.llama3_8b_long_config()
    roof = rows[0]
    moved = bench_llm.weight_bytes(cfg) + bench_llm.kv_bytes(cfg, 4096)
    assert roof["bytes_per_step"] == moved
    assert math.isclose(roof["tok_s"], 4e12 / moved)
    # 2 * layers * kv_heads * head_dim * context * 2 bytes: 0.54 GB of KV at 4k.
    assert bench_llm.kv_bytes(cfg, 4096) == 2 * 32 * 8 * 128 * 4096 * 2
    assert math.isclose(rows[3]["pct_of_roofline"], 100 * (4 / 0.5) / roof["tok_s"])
