"""Quantized models: pre-quantized checkpoints (HF fp8, compressed-tensors, AWQ, GPTQ)
written here per each format's specification from the float fixtures, and
quantize-on-load (gpk.llm.load(quantize=...), quantize_model)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from llm_ref import Reference
from quant_fixtures import float_weights, make_quantized

import pygpukit as gpk
from pygpukit import llm
from pygpukit.llm.model import prefill_mask
from pygpukit.llm.quant_checkpoint import awq_columns, gptq_rows
from pygpukit.llm.quantize import quantize_model
from pygpukit.quant import QuantizedWeight

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "llm")
PARTS = {  # the model's fused weights and the HF weights each concatenates along N
    "wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "wo": ("self_attn.o_proj",),
    "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "w_down": ("mlp.down_proj",),
}
FORMATS = [  # (id, fixture, method, options, the format loaded, exact)
    ("fp8-block32", "llama", "fp8", {"block": 32}, "fp8", True),
    ("fp8-block128-requant", "llama", "fp8", {"block": 128}, "fp8", False),
    ("ct-fp8-tensor", "llama", "ct-fp8", {"strategy": "tensor"}, "fp8", True),
    ("ct-fp8-channel", "qwen2", "ct-fp8", {"strategy": "channel"}, "fp8", True),
    ("ct-int8-channel", "llama", "ct-int8", {}, "int8", True),
    ("awq-g32", "llama", "awq", {"group": 32}, "int4", True),
    ("awq-g64-qwen3", "qwen3", "awq", {"group": 64}, "int4", True),
    ("gptq-sym-v1", "llama", "gptq", {"group": 32, "sym": True, "v1": True}, "int4", True),
    ("gptq-asym-v2", "qwen2", "gptq", {"group": 32, "sym": False, "v1": False}, "int4", True),
    ("gptq-asym-v1", "llama", "gptq", {"group": 64, "sym": False, "v1": True}, "int4", True),
]


def _fused(truth: dict[str, np.ndarray], layer: int, key: str) -> np.ndarray:
    return np.concatenate([truth[f"model.layers.{layer}.{p}.weight"] for p in PARTS[key]])


def _forward(model: llm.Model, prompts: np.ndarray, last_only: bool = True) -> np.ndarray:
    t = model.transformer
    t.setup_cache(len(prompts), prompts.shape[1])
    start = gpk.from_numpy(np.zeros(len(prompts), np.int64))
    mask = prefill_mask(start, prompts.shape[1])
    return t(gpk.from_numpy(prompts), mask, last_only=last_only).to_numpy()


def _reference(path: str, weights: dict[str, np.ndarray]) -> Reference:
    """The float64 forward pass of `path`'s config with the given HF-named weights."""
    ref = Reference.__new__(Reference)
    ref.cfg = llm.ModelConfig.from_json(os.path.join(path, "config.json"))
    ref.w = weights
    return ref


@pytest.mark.parametrize("case", FORMATS, ids=[c[0] for c in FORMATS])
def test_prequantized_checkpoint_loads_what_it_stands_for(tmp_path, case):
    """Each linear loads as a QuantizedWeight whose float64 value is the weight the
    checkpoint's tensors mean (exactly, or within fp8 rounding where fp8 block scales of
    parts that end inside a block had to be requantized); the rest stays float; and the
    model's logits match a float64 forward pass on those weights."""
    _, fixture, method, opt, fmt, exact = case
    src = os.path.join(FIXTURES, fixture)
    d = str(tmp_path / "model")
    truth = make_quantized(src, d, method, **opt)
    model = llm.load(d, progress=False)
    w = model.transformer.weights
    for i in range(model.config.num_layers):
        for key in PARTS:
            q = w[f"{i}.{key}"]
            assert isinstance(q, QuantizedWeight) and q.spec.format == fmt
            want = _fused(truth, i, key)
            got = q.dequantize()
            assert got.shape == want.shape
            if exact:
                np.testing.assert_array_equal(got, want)
            else:  # e4m3 keeps 3 mantissa bits: each value within 2^-4 of itself
                tol = 2.0**-4 * np.abs(want) + 2.0**-9 * np.abs(want).max()
                assert (np.abs(got - want) <= tol).all()
    if method in ("awq", "gptq"):
        asym = not opt.get("sym", False)
        assert w["0.wqkv"].spec.has_zero == asym and w["0.wqkv"].spec.group == opt["group"]
    for key in ("embed", "lm_head", "norm"):
        assert not isinstance(w[key], QuantizedWeight)
    # The model end to end: float32 logits against float64 on the dequantized weights.
    floats = float_weights(d)
    ref_w = {**floats, **truth}
    if not exact:
        for i in range(model.config.num_layers):
            for key, parts in PARTS.items():
                deq, row = w[f"{i}.{key}"].dequantize(), 0
                for p in parts:
                    name = f"model.layers.{i}.{p}.weight"
                    n = truth[name].shape[0]
                    ref_w[name], row = deq[row : row + n], row + n
    ref = _reference(d, ref_w)
    prompts = np.random.default_rng(1).integers(0, model.config.vocab_size, (4, 9))
    got = _forward(model, prompts, last_only=False)
    want = np.stack([ref.forward(list(p))[0] for p in prompts])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_awq_and_gptq_nibble_orders_by_hand():
    """One packed word, unpacked by the formats' definitions: AWQ's nibble i (lowest
    first) holds column [0, 2, 4, 6, 1, 3, 5, 7][i] of its 8; GPTQ's nibble j, row j."""
    word = np.array([[sum((i + 1) << (4 * i) for i in range(8))]], np.uint32).view(np.int32)
    np.testing.assert_array_equal(awq_columns(word), [[1, 5, 2, 6, 3, 7, 4, 8]])
    np.testing.assert_array_equal(gptq_rows(word)[:, 0], [1, 2, 3, 4, 5, 6, 7, 8])
    top = np.array([[0xF0000000]], np.uint32).view(np.int32)  # the sign bit's nibble
    np.testing.assert_array_equal(awq_columns(top), [[0, 0, 0, 0, 0, 0, 0, 15]])  # column 7


# -- quantize-on-load -----------------------------------------------------------------------


def _bound(fmt: str, w: np.ndarray, group: int) -> np.ndarray:
    """The largest rounding error each element of w may take in the format."""
    if fmt == "int8":  # half a step of the row's absmax / 127
        return np.broadcast_to(np.abs(w).max(axis=1, keepdims=True) / 254 * (1 + 1e-6), w.shape)
    if fmt == "int4":  # symmetric groups: half a step of the group's absmax / 7
        n, k = w.shape
        g = np.abs(w.reshape(n, k // group, group)).max(axis=2) / 14
        return np.repeat(g, group, axis=1) * (1 + 1e-6)
    b = 128  # fp8 blocks: 2^-4 relative, subnormals below 2^-6 of the block scale
    n, k = w.shape
    nb, kb = -(-n // b), -(-k // b)
    pad = np.zeros((nb * b, kb * b))
    pad[:n, :k] = np.abs(w)
    s = pad.reshape(nb, b, kb, b).max(axis=(1, 3)) / 448
    full = np.repeat(np.repeat(s, b, 0), b, 1)[:n, :k]
    return 2.0**-4 * np.abs(w) + 2.0**-10 * full


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
@pytest.mark.parametrize("fixture", ["llama", "qwen3"])
def test_quantize_on_load(fixture, fmt):
    src = os.path.join(FIXTURES, fixture)
    floats = float_weights(src)
    before = gpk.pool_stats()["in_use_bytes"]
    model = llm.load(src, progress=False, quantize=fmt, quantize_group=32)
    w = model.transformer.weights
    for i in range(model.config.num_layers):
        for key in PARTS:
            q = w[f"{i}.{key}"]
            assert isinstance(q, QuantizedWeight) and q.spec.format == fmt
            assert q.data.readonly and q.scale.readonly
            want = _fused(floats, i, key)
            assert (np.abs(q.dequantize() - want) <= _bound(fmt, want, 32)).all()
    head = w["lm_head"]
    emb = floats["model.embed_tokens.weight"]
    head_w = emb if model.config.tie_word_embeddings else floats["lm_head.weight"]
    assert isinstance(head, QuantizedWeight)
    assert (np.abs(head.dequantize() - head_w) <= _bound(fmt, head_w, 32)).all()
    assert model.transformer.lm_head is head
    # The embedding stays float (and exact), a tied one too.
    np.testing.assert_array_equal(w["embed"].to_numpy(), emb.astype(np.float32))
    # No float copy of a linear stays on the device: the model takes less than the floats.
    float_bytes = sum(a.nbytes for a in floats.values()) // 2  # the fixture is float32
    assert model.weight_bytes < float_bytes
    assert gpk.pool_stats()["in_use_bytes"] - before < float_bytes
    out = model.generate_ids([[1, 5, 9]], 4, stop_at_eos=False)
    assert len(out.tokens[0]) == 4


def _tiny(tmp_path, seed: int = 0) -> str:
    """The `--model tiny` architecture with random weights (no tokenizer needed)."""
    from safetensors.numpy import save_file

    from pygpukit.llm.tiny import random_weights, tiny_config

    cfg = dataclasses.replace(tiny_config(384), intermediate_size=192)
    d = tmp_path / "tiny"
    d.mkdir()
    save_file(random_weights(cfg, seed), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg.to_dict()))
    return str(d)


def test_int8_on_load_agrees_with_the_float_model(tmp_path):
    """256 random prompts, float32 on the CPU: int8 quantize-on-load against the float
    model. The logits move by about the weights' rounding (0.6% rms per weight); top-1
    agreement is at least 95%, and every prompt whose top-1 changed is a near-tie of
    the float model: its two candidates' logits were closer than 4x the rms change of a
    logit difference (random weights have near-tied top logits; see the report)."""
    d = _tiny(tmp_path)
    rng = np.random.default_rng(7)
    prompts = rng.integers(0, 384, (256, 16))
    base = _forward(llm.load(d, progress=False), prompts)
    got = _forward(llm.load(d, progress=False, quantize="int8"), prompts)
    rel = np.linalg.norm(got - base) / np.linalg.norm(base)
    assert rel < 0.03
    a, b = base.argmax(-1), got.argmax(-1)
    assert (a == b).mean() >= 0.95
    rows = np.flatnonzero(a != b)
    diff_rms = np.sqrt(2) * np.sqrt(((got - base) ** 2).mean())
    gaps = base[rows, a[rows]] - base[rows, b[rows]]
    assert (gaps < 4 * diff_rms).all(), (gaps, diff_rms)


def test_quantize_model_replaces_and_frees(tmp_path):
    src = os.path.join(FIXTURES, "qwen3")  # a tied head: the embedding must survive
    model = llm.load(src, progress=False)
    t = model.transformer
    floats = {k: v.to_numpy() for k, v in t.weights.items()}
    in_use = gpk.pool_stats()["in_use_bytes"]
    quantize_model(t, "int8")
    linear = [k for k in t.weights if k.split(".")[-1] in ("wqkv", "wo", "w_gate_up", "w_down")]
    for k in [*linear, "lm_head"]:
        q = t.weights[k]
        assert isinstance(q, QuantizedWeight)
        assert (np.abs(q.dequantize() - floats[k]) <= _bound("int8", floats[k], 0)).all()
    assert t.lm_head is t.weights["lm_head"] and t.layers[1].mlp.w_down is t.weights["1.w_down"]
    assert t.layers[0].attn.wqkv is t.weights["0.wqkv"]
    np.testing.assert_array_equal(t.weights["embed"].to_numpy(), floats["embed"])
    assert gpk.pool_stats()["in_use_bytes"] < in_use  # the float linears were freed
    prompts = np.random.default_rng(3).integers(0, 256, (2, 8))
    assert np.isfinite(_forward(model, prompts)).all()
    with pytest.raises(gpk.errors.GPUKitValueError, match="already quantized"):
        quantize_model(t, "fp8")


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"quantize": "int3"}, "'int3' is not a weight format"),
        ({"quantize": "INT8"}, "'INT8'"),
        ({"quantize": 8}, "8 is not a weight format"),
        ({"quantize": "int4", "quantize_group": 0}, "group must be a positive even"),
        ({"quantize": "int4", "quantize_group": 128}, "group 128 does not divide K=64"),
    ],
)
def test_quantize_argument_errors(kwargs, says):
    before = gpk.pool_stats()
    with pytest.raises(gpk.errors.GPUKitValueError, match=says) as info:
        llm.load(os.path.join(FIXTURES, "llama"), progress=False, **kwargs)
    assert isinstance(info.value, ValueError)
    assert gpk.pool_stats()["alloc_count"] == before["alloc_count"]


def test_quantize_refuses_a_prequantized_checkpoint(tmp_path):
    d = str(tmp_path / "m")
    make_quantized(os.path.join(FIXTURES, "llama"), d, "awq", group=32)
    with pytest.raises(gpk.errors.GPUKitValueError, match=r"already quantized \(awq\)"):
        llm.load(d, progress=False, quantize="int8")


def test_mixed_fused_parts_are_refused(tmp_path):
    """q_proj quantized but k_proj float: one GEMM cannot read both."""
    from quant_fixtures import write_safetensors

    from pygpukit.llm.loader import Checkpoint, checkpoint_files

    d = str(tmp_path / "m")
    make_quantized(os.path.join(FIXTURES, "llama"), d, "ct-fp8", strategy="channel")
    ck = Checkpoint(checkpoint_files(d))
    tensors = {n: np.array(ck.numpy(n)) for n in ck.tensors}
    ck.close()
    k = "model.layers.1.self_attn.k_proj."
    tensors[k + "weight"] = tensors[k + "weight"].astype(np.float32)
    del tensors[k + "weight_scale"]
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with pytest.raises(llm.LoadError, match="must share one format") as info:
        llm.load(d, progress=False)
    assert info.value.field == f"tensor '{k}weight'"


def test_nan_scale_is_refused(tmp_path):
    from quant_fixtures import write_safetensors

    from pygpukit.llm.loader import Checkpoint, checkpoint_files

    d = str(tmp_path / "m")
    make_quantized(os.path.join(FIXTURES, "llama"), d, "gptq", group=32)
    ck = Checkpoint(checkpoint_files(d))
    tensors = {n: np.array(ck.numpy(n)) for n in ck.tensors}
    ck.close()
    name = "model.layers.0.mlp.up_proj.scales"
    tensors[name][1, 3] = np.nan
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    before = gpk.pool_stats()["alloc_count"]
    with pytest.raises(llm.LoadError, match="NaN or infinite scale") as info:
        llm.load(d, progress=False)
    assert info.value.field == f"tensor '{name}'"
    assert gpk.pool_stats()["alloc_count"] == before
