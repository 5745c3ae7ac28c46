"""A corpus of malformed checkpoints: each is a fixture copied to tmp_path with one thing
broken, and each must raise a LoadError that names the file and the field, quickly (a FIFO
must not block), before any pool memory is allocated."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import pygpukit as gpk
from pygpukit import llm
from pygpukit.errors import LoadError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "llm")
CONFIG, WEIGHTS, INDEX, TOKENIZER = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
)
SHARD1, SHARD2 = "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors"


# -- building blocks: each breaks one thing in the model directory d -------------------------


def _json(d: str, name: str) -> Any:
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return json.load(f)


def _put(d: str, name: str, data: bytes | str) -> None:
    path = os.path.join(d, name)
    if os.path.lexists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def config(**changes: Any) -> Callable[[str], None]:
    """Set top-level config fields (the value DELETE removes one)."""

    def edit(d: str) -> None:
        cfg = _json(d, CONFIG)
        for k, v in changes.items():
            if v is DELETE:
                del cfg[k]
            else:
                cfg[k] = v
        _put(d, CONFIG, json.dumps(cfg))

    return edit


def rope(**changes: Any) -> Callable[[str], None]:
    def edit(d: str) -> None:
        cfg = _json(d, CONFIG)
        for k, v in changes.items():
            if v is DELETE:
                del cfg["rope_parameters"][k]
            else:
                cfg["rope_parameters"][k] = v
        _put(d, CONFIG, json.dumps(cfg))

    return edit


DELETE = object()


def raw_config(text: Callable[[str], str]) -> Callable[[str], None]:
    """Rewrite config.json's text (for what json.dumps cannot write: NaN, duplicate keys)."""

    def edit(d: str) -> None:
        with open(os.path.join(d, CONFIG), encoding="utf-8") as f:
            old = f.read()
        _put(d, CONFIG, text(old))

    return edit


def swap(old: str, new: str) -> Callable[[str], None]:
    """Replace text in config.json (the fixture's own formatting)."""

    def text(t: str) -> str:
        assert old in t
        return t.replace(old, new)

    return raw_config(text)


def _read_st(path: str) -> tuple[dict[str, Any], bytes]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), f.read()


def _write_st(path: str, header: bytes | str | dict[str, Any], data: bytes) -> None:
    h = header if isinstance(header, bytes) else (
        header if isinstance(header, str) else json.dumps(header)
    ).encode()  # fmt: skip
    os.remove(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def header(edit_fn: Callable[[dict[str, Any]], Any], name: str = WEIGHTS) -> Callable[[str], None]:
    """Edit a safetensors header (the dict, in place; a returned value replaces it)."""

    def edit(d: str) -> None:
        path = os.path.join(d, name)
        h, data = _read_st(path)
        out = edit_fn(h)
        _write_st(path, h if out is None else out, data)

    return edit


def index(edit_fn: Callable[[dict[str, Any]], Any]) -> Callable[[str], None]:
    def edit(d: str) -> None:
        idx = _json(d, INDEX)
        out = edit_fn(idx)
        _put(d, INDEX, json.dumps(idx if out is None else out))

    return edit


def fifo(name: str) -> Callable[[str], None]:
    def edit(d: str) -> None:
        path = os.path.join(d, name)
        if os.path.lexists(path):
            os.remove(path)
        os.mkfifo(path)

    return edit


def directory(name: str) -> Callable[[str], None]:
    def edit(d: str) -> None:
        os.remove(os.path.join(d, name))
        os.mkdir(os.path.join(d, name))

    return edit


def escaping_symlink(name: str) -> Callable[[str], None]:
    """Move the file out of the model directory and leave a symlink to it."""

    def edit(d: str) -> None:
        outside = os.path.join(os.path.dirname(d), "outside-" + name)
        shutil.move(os.path.join(d, name), outside)
        os.symlink(outside, os.path.join(d, name))

    return edit


def remove(name: str) -> Callable[[str], None]:
    return lambda d: os.remove(os.path.join(d, name))


def deep(n: int) -> str:
    return "[" * n + "]" * n


def _set(h: dict[str, Any], tensor: str, key: str, value: Any) -> None:
    h[tensor][key] = value


def _overlap(h: dict[str, Any]) -> None:
    k, v = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
    h[v]["data_offsets"] = list(h[k]["data_offsets"])


def _duplicate_tensor(h: dict[str, Any]) -> str:
    text = json.dumps(h)
    name = "model.norm.weight"
    entry = json.dumps(h[name])
    return text[:-1] + f', "{name}": {entry}}}'


def _tokenizer_too_big(d: str) -> None:
    from pygpukit.llm.tiny import train_tokenizer

    train_tokenizer(512).save(os.path.join(d, TOKENIZER))  # type: ignore[attr-defined]


Q0 = "model.layers.0.self_attn.q_proj.weight"
EMB = "model.embed_tokens.weight"
QW0 = "model.layers.0.self_attn.q_proj.qweight"
SI0 = "model.layers.0.self_attn.q_proj.weight_scale_inv"
G_IDX = "model.layers.1.mlp.up_proj.g_idx"
# The quantized fixtures: the llama fixture written in a format (tests/quant_fixtures.py).
QUANTIZED = {
    "awq": ("awq", {"group": 32}),
    "gptq": ("gptq", {"group": 32}),
    "fp8": ("fp8", {"block": 32}),
    "ct-fp8": ("ct-fp8", {"strategy": "channel"}),
}


def quant(
    edit_fn: Callable[[dict[str, Any]], Any] | None = None, **changes: Any
) -> Callable[[str], None]:
    """Edit config.json's quantization_config (fields, or a function of it)."""

    def edit(d: str) -> None:
        cfg = _json(d, CONFIG)
        q = cfg["quantization_config"]
        q.update(changes)
        if edit_fn is not None:
            out = edit_fn(q)
            cfg["quantization_config"] = q if out is None else out
        _put(d, CONFIG, json.dumps(cfg))

    return edit


def _ct_weights(q: dict[str, Any], **changes: Any) -> None:
    q["config_groups"]["group_0"]["weights"].update(changes)


def _act_order(d: str) -> None:
    """Rewrite the weights with one g_idx permuted (an act-order checkpoint)."""
    import numpy as np
    from quant_fixtures import write_safetensors

    from pygpukit.llm.loader import Checkpoint

    path = os.path.join(d, WEIGHTS)
    ck = Checkpoint([path])
    tensors = {n: np.array(ck.numpy(n)) for n in ck.tensors}
    ck.close()
    tensors[G_IDX] = np.random.default_rng(0).permutation(tensors[G_IDX])
    write_safetensors(path, tensors)


@dataclass
class Case:
    id: str
    fixture: str
    breaks: Callable[[str], None]
    file: str  # the file the error names (base name)
    field: str | None  # the field the error names; None: the file as a whole
    says: str = ""  # a part of the message


CASES = [
    # config.json as a document
    Case("config-list", "llama", lambda d: _put(d, CONFIG, "[1, 2]"), CONFIG, None,
         "expected a JSON object"),
    Case("config-not-utf8", "llama", lambda d: _put(d, CONFIG, b'{"model_type": "\xff"}'),
         CONFIG, None, "not UTF-8"),
    Case("config-not-json", "llama", lambda d: _put(d, CONFIG, "{not json"), CONFIG, None,
         "not valid JSON"),
    Case("config-missing", "llama", remove(CONFIG), CONFIG, None, "no such file"),
    Case("config-fifo", "llama", fifo(CONFIG), CONFIG, None, "a FIFO"),
    Case("config-directory", "llama", directory(CONFIG), CONFIG, None, "a directory"),
    Case("config-symlink-out", "llama", escaping_symlink(CONFIG), CONFIG, None,
         "outside the model directory"),
    Case("config-duplicate-key", "llama",
         swap('"vocab_size": 256', '"vocab_size": 256, "vocab_size": 512'),
         CONFIG, "vocab_size", "twice"),
    Case("config-deep", "llama", raw_config(lambda t: t[:-1] + f', "x": {deep(100_000)}}}'),
         CONFIG, None, "nests 100000 levels"),
    # config.json fields: types, ranges, consistency
    Case("layers-huge", "llama", config(num_hidden_layers=10**8), CONFIG, "num_hidden_layers"),
    Case("layers-negative", "llama", config(num_hidden_layers=-1), CONFIG, "num_hidden_layers"),
    Case("layers-more", "llama", config(num_hidden_layers=3), CONFIG, "num_hidden_layers",
         "checkpoint has 2"),
    Case("layers-fewer", "llama", config(num_hidden_layers=1), CONFIG, "num_hidden_layers",
         "checkpoint has 2"),
    Case("heads-zero", "llama", config(num_attention_heads=0), CONFIG, "num_attention_heads"),
    Case("kv-heads-zero", "llama", config(num_key_value_heads=0), CONFIG, "num_key_value_heads"),
    Case("kv-heads-not-divisor", "llama", config(num_key_value_heads=3), CONFIG,
         "num_key_value_heads", "not a multiple"),
    Case("hidden-float", "llama", config(hidden_size=64.5), CONFIG, "hidden_size", "64.5"),
    Case("hidden-whole-float", "llama", config(hidden_size=64.0), CONFIG, "hidden_size"),
    Case("vocab-string", "llama", config(vocab_size="256"), CONFIG, "vocab_size"),
    Case("intermediate-missing", "llama", config(intermediate_size=DELETE), CONFIG,
         "intermediate_size", "missing"),
    Case("head-dim-odd", "llama", config(head_dim=15), CONFIG, "head_dim", "even"),
    Case("eps-negative", "llama", config(rms_norm_eps=-1e-6), CONFIG, "rms_norm_eps"),
    Case("eps-nan", "llama", swap('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'),
         CONFIG, "rms_norm_eps"),
    Case("rope-factor-missing", "llama", rope(factor=DELETE), CONFIG, "rope_parameters.factor",
         "missing"),
    Case("rope-factor-zero", "llama", rope(factor=0), CONFIG, "rope_parameters.factor"),
    Case("rope-theta-zero", "llama", rope(rope_theta=0), CONFIG, "rope_parameters.rope_theta"),
    Case("rope-freq-order", "llama", rope(high_freq_factor=1.0), CONFIG,
         "rope_parameters.high_freq_factor"),
    Case("rope-not-object", "llama", config(rope_parameters=[1, 2]), CONFIG, "rope_parameters"),
    Case("rope-unknown-type", "llama", rope(rope_type="yarn"), CONFIG, "rope_parameters", "yarn"),
    Case("pad-out-of-vocab", "llama", config(pad_token_id=256), CONFIG, "pad_token_id"),
    Case("eos-out-of-vocab", "llama", config(eos_token_id=[2, 1000]), CONFIG, "eos_token_id"),
    Case("bos-negative", "llama", config(bos_token_id=-1), CONFIG, "bos_token_id"),
    Case("tie-string", "llama", config(tie_word_embeddings="yes"), CONFIG, "tie_word_embeddings"),
    Case("model-type-unknown", "llama", config(model_type="gpt2"), CONFIG, "model_type", "gpt2"),
    Case("window-negative", "mistral", config(sliding_window=-4), CONFIG, "sliding_window"),
    Case("vocab-mismatch", "llama", config(vocab_size=300), WEIGHTS, f"tensor '{EMB}'",
         "vocab_size"),
    Case("head-dim-mismatch", "llama", config(head_dim=8), WEIGHTS, f"tensor '{Q0}'", "head_dim"),
    # safetensors files and headers
    Case("weights-fifo", "llama", fifo(WEIGHTS), WEIGHTS, None, "a FIFO"),
    Case("weights-directory", "llama", directory(WEIGHTS), WEIGHTS, None, "a directory"),
    Case("weights-symlink-out", "llama", escaping_symlink(WEIGHTS), WEIGHTS, None,
         "outside the model directory"),
    Case("weights-none", "llama", remove(WEIGHTS), "model", None, "no *.safetensors"),
    Case("header-short-file", "llama", lambda d: _put(d, WEIGHTS, b"\x01\x02"), WEIGHTS, None,
         "shorter than"),
    Case("header-length-huge", "llama", lambda d: _put(d, WEIGHTS, struct.pack("<Q", 1 << 40)),
         WEIGHTS, None, "header length"),
    Case("header-not-utf8", "llama", header(lambda h: b'{"a": "\xfe"}'), WEIGHTS, None,
         "not UTF-8"),
    Case("header-deep", "llama", header(lambda h: deep(100_000)), WEIGHTS, None,
         "nests 100000 levels"),
    Case("header-list", "llama", header(lambda h: "[]"), WEIGHTS, None, "expected a JSON object"),
    Case("header-duplicate", "llama", header(_duplicate_tensor), WEIGHTS, "model.norm.weight",
         "twice"),
    Case("header-overlap", "llama", header(_overlap), WEIGHTS,
         "tensor 'model.layers.0.self_attn.", "overlap"),
    Case("header-int32-weight", "llama", header(lambda h: _set(h, Q0, "dtype", "I32")), WEIGHTS,
         f"tensor '{Q0}'", "dtype I32"),
    Case("header-unknown-dtype", "llama", header(lambda h: _set(h, Q0, "dtype", "F8_E9")),
         WEIGHTS, f"tensor '{Q0}'", "F8_E9"),
    Case("header-float-shape", "llama", header(lambda h: _set(h, Q0, "shape", [64.0, 64])),
         WEIGHTS, f"tensor '{Q0}'", "shape"),
    Case("header-negative-offset", "llama",
         header(lambda h: _set(h, Q0, "data_offsets", [-16384, 0])), WEIGHTS, f"tensor '{Q0}'",
         "data_offsets"),
    Case("header-past-end", "llama",
         header(lambda h: _set(h, Q0, "data_offsets", [1 << 30, (1 << 30) + 16384])), WEIGHTS,
         f"tensor '{Q0}'", "past the end"),
    Case("header-entry-list", "llama", header(lambda h: h.__setitem__(Q0, [1])), WEIGHTS,
         f"tensor '{Q0}'", "expected an object"),
    Case("header-metadata", "llama", header(lambda h: h.__setitem__("__metadata__", {"a": 1})),
         WEIGHTS, "__metadata__"),
    Case("header-missing-tensor", "llama", header(lambda h: h.pop(Q0) and None), WEIGHTS,
         f"tensor '{Q0}'", "missing"),
    # the shard index
    Case("index-not-object", "mistral", index(lambda i: [1]), INDEX, None, "weight_map"),
    Case("index-map-list", "mistral", index(lambda i: i.__setitem__("weight_map", [SHARD1])),
         INDEX, "weight_map"),
    Case("index-map-int", "mistral", index(lambda i: i["weight_map"].__setitem__(EMB, 7)),
         INDEX, f"weight_map['{EMB}']"),
    Case("index-parent-dir", "mistral",
         index(lambda i: i["weight_map"].__setitem__(EMB, "../" + SHARD1)), INDEX,
         f"weight_map['{EMB}']", "outside the model directory"),
    Case("index-absolute", "mistral",
         index(lambda i: i["weight_map"].__setitem__(EMB, "/etc/passwd")), INDEX,
         f"weight_map['{EMB}']", "absolute path"),
    Case("index-missing-shard", "mistral",
         index(lambda i: i["weight_map"].__setitem__(EMB, "model-00009-of-00009.safetensors")),
         INDEX, f"weight_map['{EMB}']", "does not exist"),
    Case("index-wrong-shard", "mistral",
         index(lambda i: i["weight_map"].__setitem__(EMB, SHARD2)), INDEX,
         f"weight_map['{EMB}']", SHARD1),
    Case("index-shard-symlink-out", "mistral", escaping_symlink(SHARD1), INDEX, "weight_map['",
         "outside the model directory"),
    Case("index-shard-fifo", "mistral", fifo(SHARD2), SHARD2, None, "a FIFO"),
    Case("index-duplicate-key", "mistral",
         lambda d: _put(d, INDEX, '{"weight_map": {"a": "x", "a": "y"}}'), INDEX, "a", "twice"),
    # the tokenizer
    Case("tokenizer-fifo", "llama", fifo(TOKENIZER), TOKENIZER, None, "a FIFO"),
    Case("tokenizer-not-json", "llama", lambda d: _put(d, TOKENIZER, "{oops"), TOKENIZER, None,
         "cannot read the tokenizer"),
    Case("tokenizer-bigger-vocab", "llama", _tokenizer_too_big, TOKENIZER, "vocab",
         "vocab_size 256"),
    # quantized checkpoints (QUANTIZED: the llama fixture written in each format)
    Case("quant-config-list", "awq", quant(lambda q: [1]), CONFIG, "quantization_config",
         "must be an object"),
    Case("quant-method-unknown", "awq", quant(quant_method="bitsandbytes"), CONFIG,
         "quantization_config.quant_method", "bitsandbytes"),
    Case("awq-bits-8", "awq", quant(bits=8), CONFIG, "quantization_config.bits", "4-bit"),
    Case("gptq-bits-3", "gptq", quant(bits=3), CONFIG, "quantization_config.bits", "4-bit"),
    Case("awq-group-not-dividing", "awq", quant(group_size=48), CONFIG,
         "quantization_config.group_size", "48 does not divide K=64"),
    Case("gptq-group-zero", "gptq", quant(group_size=0), CONFIG,
         "quantization_config.group_size"),
    Case("awq-version-gemv", "awq", quant(version="gemv"), CONFIG,
         "quantization_config.version", "GEMM"),
    Case("gptq-format-marlin", "gptq", quant(checkpoint_format="marlin"), CONFIG,
         "quantization_config.checkpoint_format", "marlin"),
    Case("gptq-act-order", "gptq", _act_order, WEIGHTS, f"tensor '{G_IDX}'",
         "act-order"),
    Case("awq-qweight-shape", "awq", header(lambda h: _set(h, QW0, "shape", [8, 64])),
         WEIGHTS, f"tensor '{QW0}'", "needs [64, 8]"),
    Case("awq-qzeros-dtype", "awq",
         header(lambda h: _set(h, QW0.replace("qweight", "qzeros"), "dtype", "F32")), WEIGHTS,
         "qzeros'", "needs I32"),
    Case("gptq-scales-missing", "gptq",
         header(lambda h: h.pop(QW0.replace("qweight", "scales")) and None), WEIGHTS,
         "scales'", "missing"),
    Case("fp8-block-not-square", "fp8", quant(weight_block_size=[32, 64]), CONFIG,
         "quantization_config.weight_block_size", "square"),
    Case("fp8-scale-missing", "fp8", header(lambda h: h.pop(SI0) and None), WEIGHTS,
         f"tensor '{SI0}'", "missing"),
    Case("fp8-scale-shape", "fp8", header(lambda h: _set(h, SI0, "shape", [1, 4])), WEIGHTS,
         f"tensor '{SI0}'", "needs [2, 2]"),
    Case("fp8-weight-as-int8", "fp8", header(lambda h: _set(h, Q0, "dtype", "I8")), WEIGHTS,
         f"tensor '{Q0}'", "dtype I8"),
    Case("ct-format-packed", "ct-fp8", quant(format="pack-quantized"), CONFIG,
         "quantization_config.format", "pack-quantized"),
    Case("ct-strategy-group", "ct-fp8", quant(lambda q: _ct_weights(q, strategy="group")),
         CONFIG, "quantization_config.config_groups.group_0.weights.strategy", "group"),
    Case("ct-4-bit", "ct-fp8", quant(lambda q: _ct_weights(q, num_bits=4)), CONFIG,
         "quantization_config.config_groups.group_0.weights.type", "4 bits"),
]  # fmt: skip


class _Hung(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hung("the load did not finish in 20 s (a blocking open?)")


def test_enough_cases():
    assert len(CASES) >= 35 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_checkpoint(tmp_path, case: Case):
    d = str(tmp_path / "model")
    if case.fixture in QUANTIZED:
        from quant_fixtures import make_quantized

        method, opt = QUANTIZED[case.fixture]
        make_quantized(os.path.join(FIXTURES, "llama"), d, method, **opt)
    else:
        shutil.copytree(os.path.join(FIXTURES, case.fixture), d)
    llm.load(d, progress=False)  # the copy itself is fine
    case.breaks(d)
    before = gpk.pool_stats()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        with pytest.raises(LoadError) as info:
            llm.load(d, progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    e = info.value
    msg = str(e)
    assert isinstance(e, gpk.GPUKitError) and isinstance(e, ValueError)
    assert isinstance(e, OSError)
    assert e.file is not None and os.path.basename(e.file) == case.file, msg
    assert msg.startswith(e.file + ": "), msg
    if case.field is None:
        assert e.field is None, msg
    else:
        assert e.field is not None and case.field in e.field and e.field in msg, msg
    if case.says:
        assert case.says in msg, msg
    assert "\n" not in msg and "Traceback" not in msg
    after = gpk.pool_stats()
    # Refused before any allocation: nothing was allocated, so nothing leaked.
    assert after["alloc_count"] == before["alloc_count"], msg
    assert after["in_use_bytes"] == before["in_use_bytes"]
    assert after["live_blocks"] == before["live_blocks"]


def test_passwd_is_never_opened(tmp_path, monkeypatch):
    """An index entry pointing at /etc/passwd is refused by name: nothing outside the model
    directory is opened, so no byte of it can reach the message."""
    d = str(tmp_path / "model")
    shutil.copytree(os.path.join(FIXTURES, "mistral"), d)
    index(lambda i: i["weight_map"].__setitem__(EMB, "/etc/passwd"))(d)
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(LoadError, match="absolute path"):
        llm.load(d, progress=False)
    assert opened and all(os.path.realpath(p).startswith(os.path.realpath(d)) for p in opened)


def test_load_error_is_both_builtins(tmp_path):
    """Callers catching OSError (a missing directory) or ValueError (bad content) both work."""
    with pytest.raises(OSError, match="not a model directory"):
        llm.load(str(tmp_path / "nope"))
    d = str(tmp_path / "model")
    shutil.copytree(os.path.join(FIXTURES, "llama"), d)
    config(vocab_size=0)(d)
    with pytest.raises(ValueError, match="vocab_size"):
        llm.load(d)
    assert issubclass(llm.ConfigError, LoadError) and llm.LoadError is LoadError


@pytest.mark.parametrize("dtype", [None, "float16"])
def test_failed_upload_frees_what_it_uploaded(tmp_path, monkeypatch, dtype):
    """A step that fails half way through the weights (after every check passed and the
    bulk upload ran: the fifth weight's cast) frees every weight already on the device,
    cast or not, and names the failing weight's tensors."""
    from pygpukit.llm import loader

    d = str(tmp_path / "model")
    shutil.copytree(os.path.join(FIXTURES, "llama"), d)
    real = loader._as_weight
    calls = [0]

    def failing(a: Any, dtype: Any) -> Any:
        calls[0] += 1
        if calls[0] == 5:
            raise gpk.errors.OutOfMemoryError("simulated: the device is full")
        return real(a, dtype)

    monkeypatch.setattr(loader, "_as_weight", failing)
    before = gpk.pool_stats()
    with pytest.raises(gpk.errors.OutOfMemoryError, match=r"load model\.layers\.0\..*simulated"):
        llm.load(d, dtype=dtype, progress=False)
    after = gpk.pool_stats()
    assert after["alloc_count"] > before["alloc_count"]  # four uploads happened
    assert after["in_use_bytes"] == before["in_use_bytes"]
    assert after["live_blocks"] == before["live_blocks"]


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 22])
def test_nesting_scan_matches_the_parsed_depth(monkeypatch, chunk):
    """The vectorised pre-scan against the depth of the parsed document, for random JSON
    whose strings hold quotes, backslashes and brackets, with chunk boundaries anywhere."""
    import numpy as np

    from pygpukit.llm import files

    monkeypatch.setattr(files, "_CHUNK", chunk)
    rng = np.random.default_rng(chunk)

    def make(level: int) -> Any:
        r = rng.random()
        if level > 6 or r < 0.3:
            return "".join(rng.choice(list('ab[]{}"\\'), rng.integers(0, 6)))
        if r < 0.65:
            return [make(level + 1) for _ in range(rng.integers(0, 4))]
        return {make(99): make(level + 1) for _ in range(rng.integers(0, 4))}

    def depth(o: Any) -> int:
        kids = o.values() if isinstance(o, dict) else o if isinstance(o, list) else None
        return 0 if kids is None else 1 + max((depth(k) for k in kids), default=0)

    for _ in range(300):
        doc = make(0)
        assert files._depth(json.dumps(doc).encode()) == depth(doc)
