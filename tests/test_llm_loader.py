"""SafeTensors loading: error paths name the tensor and the file; weights are read-only."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

import pygpukit as gpk
from pygpukit import llm
from pygpukit.llm.loader import Checkpoint, LoadError, read_header

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "llm", "llama")


def _copy_fixture(tmp_path) -> str:
    dst = tmp_path / "model"
    shutil.copytree(FIXTURE, dst)
    return str(dst)


def _raw(path: str) -> tuple[dict, bytes]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        return header, f.read()


def _write(path: str, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def test_read_header_matches_safetensors_library(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.integers(0, 9, (7,)).astype(np.int64)}  # fmt: skip
    p = str(tmp_path / "t.safetensors")
    save_file(tensors, p)
    ck = Checkpoint([p])
    for name, want in tensors.items():
        np.testing.assert_array_equal(ck.numpy(name), want)
        assert ck.info(name).file == p


def test_bad_header_json(tmp_path):
    p = str(tmp_path / "bad.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 10) + b"{not json!" + b"\0" * 16)
    with pytest.raises(LoadError, match="bad.safetensors.*not valid JSON"):
        read_header(p)


def test_header_length_past_end(tmp_path):
    p = str(tmp_path / "short.safetensors")
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(LoadError, match="short.safetensors.*header length"):
        read_header(p)


def test_wrong_size_names_tensor_and_file(tmp_path):
    d = _copy_fixture(tmp_path)
    p = os.path.join(d, "model.safetensors")
    header, data = _raw(p)
    name = "model.layers.1.mlp.up_proj.weight"
    header[name]["shape"] = [header[name]["shape"][0] + 1, header[name]["shape"][1]]
    _write(p, header, data)
    with pytest.raises(LoadError, match=rf"model.safetensors: tensor '{name}'.*needs"):
        llm.load(d)


def test_truncated_file_names_tensor(tmp_path):
    d = _copy_fixture(tmp_path)
    p = os.path.join(d, "model.safetensors")
    header, data = _raw(p)
    names = [k for k in header if k != "__metadata__"]
    last = max(names, key=lambda k: header[k]["data_offsets"][1])
    _write(p, header, data[:-4])
    with pytest.raises(LoadError, match=rf"tensor '{last}'.*past the end"):
        llm.load(d)


def test_missing_tensor(tmp_path):
    d = _copy_fixture(tmp_path)
    p = os.path.join(d, "model.safetensors")
    header, data = _raw(p)
    del header["model.layers.0.self_attn.k_proj.weight"]
    _write(p, header, data)
    with pytest.raises(LoadError, match=r"model.safetensors: tensor "
                       r"'model.layers.0.self_attn.k_proj.weight': missing"):  # fmt: skip
        llm.load(d)


def test_shape_disagrees_with_config(tmp_path):
    d = _copy_fixture(tmp_path)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["intermediate_size"] = 96
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(
        LoadError,
        match=r"tensor 'model.layers.0.mlp.gate_proj.weight': has shape.*intermediate_size",
    ):
        llm.load(d)


def test_unknown_architecture(tmp_path):
    d = _copy_fixture(tmp_path)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["model_type"] = "gpt2"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(llm.ConfigError, match="gpt2"):
        llm.load(d)


def test_errors_are_gpk_errors():
    assert issubclass(LoadError, gpk.GPUKitError) and issubclass(LoadError, ValueError)
    assert issubclass(llm.ConfigError, gpk.GPUKitError)


def test_transformers4_config_fields():
    """transformers 4.x writes rope_theta and rope_scaling {"type": ...} at the top level."""
    d = json.load(open(os.path.join(FIXTURE, "config.json")))
    params = d.pop("rope_parameters")
    d["rope_theta"] = params.pop("rope_theta")
    d["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    old = llm.ModelConfig.from_dict(d)
    new = llm.ModelConfig.from_json(os.path.join(FIXTURE, "config.json"))
    assert old.rope_theta == new.rope_theta == 500000.0
    assert old.rope_type == new.rope_type == "llama3"
    assert llm.ModelConfig.from_dict(new.to_dict()) == new


def test_weights_are_read_only():
    model = llm.load(FIXTURE, progress=False)
    w = model.transformer.weights["0.wo"]
    before = w.to_numpy()
    assert w.readonly
    with pytest.raises(gpk.GPUKitError, match="read-only") as e:
        w[0] = 1.0
    assert isinstance(e.value, ValueError)
    assert "test_llm_loader.py" in str(e.value)  # the user's line
    np.testing.assert_array_equal(w.to_numpy(), before)
    c = w.copy()  # a copy is an ordinary, writable array
    c[0] = 1.0
    assert (c.to_numpy()[0] == 1.0).all()


def test_readonly_flag_on_any_array():
    x = gpk.from_numpy(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32))
    assert not x.readonly
    x[1] = 2.0
    x.readonly = True
    with pytest.raises(gpk.GPUKitError, match=r"setitem: the array f32\[4, 3\] is read-only"):
        x[0, 0] = 5.0
    x.readonly = False
    x[0, 0] = 5.0
    assert x.to_numpy()[0, 0] == 5.0 and (x.to_numpy()[1] == 2.0).all()


def test_readonly_covers_views_of_the_memory():
    """Read-only marks the memory: a view taken before or after cannot write it either
    (the GEMV relies on it to read weights ahead of the kernel before it)."""
    x = gpk.from_numpy(np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32))
    x[0] = 1.0  # lazy: marking read-only realises it
    before_view = x.reshape(6, 4)
    x.readonly = True
    after_view = x.T
    for v in (before_view, after_view, after_view[1:]):
        assert not v.readonly
        with pytest.raises(gpk.GPUKitError, match="read-only"):
            v[0] = 5.0
    assert (x.to_numpy()[0] == 1.0).all() and not (x.to_numpy() == 5.0).any()
    x.readonly = False
    v = x.T
    v[0] = 5.0  # as NumPy: writable again once the flag is cleared
    assert (v.to_numpy()[0] == 5.0).all()


def test_load_casts_and_shows_progress(capsys):
    model = llm.load(FIXTURE, dtype="bfloat16", progress=True)
    err = capsys.readouterr().err
    assert "loading [" in err and "MB" in err
    w = model.transformer.weights["embed"]
    ck = Checkpoint([os.path.join(FIXTURE, "model.safetensors")])
    want = ck.numpy("model.embed_tokens.weight").astype(gpk.bfloat16.np)
    np.testing.assert_array_equal(w.to_numpy(), want)


def test_sharded_checkpoint_uses_index():
    d = os.path.join(os.path.dirname(FIXTURE), "mistral")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    model = llm.load(d, progress=False)
    ck = Checkpoint(sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors")))
    q = ck.numpy("model.layers.1.self_attn.q_proj.weight")
    k = ck.numpy("model.layers.1.self_attn.k_proj.weight")
    got = model.transformer.weights["1.wqkv"].to_numpy()
    np.testing.assert_array_equal(got[: q.shape[0]], q)
    np.testing.assert_array_equal(got[q.shape[0] : q.shape[0] + k.shape[0]], k)


@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_every_weight_as_safetensors_reads_it(dtype):
    """A sharded checkpoint loaded through the memory maps (fused matrices concatenated and
    cast on the device) holds, for every weight, what the safetensors library reads,
    concatenated and cast on the host."""
    from safetensors.numpy import load_file

    d = os.path.join(os.path.dirname(FIXTURE), "mistral")
    host: dict[str, np.ndarray] = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            host.update(load_file(os.path.join(d, f)))
    model = llm.load(d, dtype=dtype, progress=False)
    cfg = model.config
    want_dtype = gpk.ir.dtypes.as_dtype(dtype or host["model.norm.weight"].dtype).np
    w = model.transformer.weights

    def same(key: str, *names: str) -> None:
        want = np.concatenate([host[n] for n in names]).astype(want_dtype)
        assert w[key].dtype.np == want_dtype and w[key].readonly
        np.testing.assert_array_equal(w[key].to_numpy(), want)

    same("embed", "model.embed_tokens.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        same(f"{i}.wqkv", *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        same(f"{i}.wo", p + "self_attn.o_proj.weight")
        same(f"{i}.w_gate_up", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        same(f"{i}.w_down", p + "mlp.down_proj.weight")
        same(f"{i}.attn_norm", p + "input_layernorm.weight")
    same("norm", "model.norm.weight")
    assert model.load_stats["bytes"] == sum(a.nbytes for a in host.values())


def test_prefetch_ranges():
    """prefetch asks for every tensor's bytes (page-aligned) without changing what is read."""
    d = os.path.join(os.path.dirname(FIXTURE), "mistral")
    ck = Checkpoint(sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors")))
    before = {n: ck.numpy(n).copy() for n in ck.tensors}
    ck.prefetch(list(ck.tensors) + ["not a tensor"])
    for n, a in before.items():
        np.testing.assert_array_equal(ck.numpy(n), a)
    ck.close()
