"""Loading SafeTensors checkpoints (one file or sharded) into read-only GPUArrays.

The safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw data. The header is parsed here so that
every inconsistency is reported with the tensor and the file; the data is memory-mapped and
copied tensor by tensor to the backend, so a checkpoint never sits in host memory twice.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from pygpukit import errors
from pygpukit.array import GPUArray
from pygpukit.creation import from_numpy
from pygpukit.ir import dtypes

from .config import ModelConfig

SAFETENSORS_DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
MAX_HEADER = 100 << 20  # the reference implementation's limit


class LoadError(errors.GPUKitError, ValueError):
    """A checkpoint that cannot be loaded: bad header, wrong sizes, a missing tensor."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parse and check one .safetensors header; every error names the file (and tensor)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise LoadError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise LoadError(
                    f"{path}: bad safetensors header: header length {n} does not fit the "
                    f"file of {size} bytes"
                )
            raw = f.read(n)
    except OSError as e:
        raise LoadError(f"{path}: cannot read: {e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{path}: bad safetensors header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise LoadError(f"{path}: bad safetensors header: expected a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = SAFETENSORS_DTYPES[meta["dtype"]]
            shape = tuple(int(s) for s in meta["shape"])
            begin, end = (int(o) for o in meta["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise LoadError(
                f"{path}: tensor {name!r}: bad header entry {meta!r} ({type(e).__name__}: {e})"
            ) from None
        want = math.prod(shape) * dt.itemsize
        if end - begin != want or begin < 0:
            raise LoadError(
                f"{path}: tensor {name!r}: {meta['dtype']}{list(shape)} needs {want} bytes, "
                f"the header gives {end - begin} (offsets {begin}..{end})"
            )
        if end > data_len:
            raise LoadError(
                f"{path}: tensor {name!r}: bytes {begin}..{end} run past the end of the data "
                f"({data_len} bytes; the file is truncated?)"
            )
        out[name] = TensorInfo(name, path, dt, shape, data_start + begin, want)
    return out


def checkpoint_files(path: str) -> list[str]:
    """The .safetensors files of a model directory: the index's shards, or all of them."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise LoadError(f"{index}: bad index: {e}") from None
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise LoadError(f"{path}: no *.safetensors files")
    return [os.path.join(path, f) for f in files]


class Checkpoint:
    """The tensors of one checkpoint, by name, memory-mapped on demand."""

    def __init__(self, files: Iterable[str]) -> None:
        self.files = list(files)
        self.tensors: dict[str, TensorInfo] = {}
        for f in self.files:
            for name, info in read_header(f).items():
                if name in self.tensors:
                    raise LoadError(f"{f}: tensor {name!r} is also in {self.tensors[name].file}")
                self.tensors[name] = info
        self._maps: dict[str, np.memmap[Any, Any]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            where = ", ".join(os.path.basename(f) for f in self.files)
            raise LoadError(f"missing tensor {name!r} (looked in {where})") from None

    def numpy(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as a read-only memory-mapped array, its shape checked if given."""
        t = self.info(name)
        if shape is not None and t.shape != tuple(shape):
            raise LoadError(
                f"{t.file}: tensor {name!r} has shape {list(t.shape)}, the config needs "
                f"{list(shape)}"
            )
        mm = self._maps.get(t.file)
        if mm is None:
            mm = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return np.frombuffer(mm, dtype=t.dtype, count=math.prod(t.shape), offset=t.offset).reshape(
            t.shape
        )

    def close(self) -> None:
        self._maps.clear()


class Progress:
    """A plain one-line progress bar on stderr (no dependency)."""

    def __init__(self, total_bytes: int, enabled: bool, label: str = "loading") -> None:
        self.total, self.done, self.enabled, self.label = total_bytes, 0, enabled, label
        self.t0 = time.perf_counter()

    def update(self, nbytes: int) -> None:
        self.done += nbytes
        if not self.enabled:
            return
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        dt = max(time.perf_counter() - self.t0, 1e-9)
        sys.stderr.write(
            f"\r{self.label} [{bar:<30}] {self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB "
            f"{self.done / 1e9 / dt:5.2f} GB/s"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def weight_names(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor the model needs, with its shape, in Hugging Face naming."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    yield "model.embed_tokens.weight", (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        if cfg.attention_bias:
            yield p + "self_attn.q_proj.bias", (q,)
            yield p + "self_attn.k_proj.bias", (kv,)
            yield p + "self_attn.v_proj.bias", (kv,)
        if cfg.qk_norm:
            yield p + "self_attn.q_norm.weight", (cfg.head_dim,)
            yield p + "self_attn.k_norm.weight", (cfg.head_dim,)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (cfg.intermediate_size, h)
        yield p + "mlp.up_proj.weight", (cfg.intermediate_size, h)
        yield p + "mlp.down_proj.weight", (h, cfg.intermediate_size)
    yield "model.norm.weight", (h,)
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (cfg.vocab_size, h)


def _upload(a: np.ndarray, dtype: dtypes.DType) -> GPUArray:
    host = a if a.dtype == dtype.np else a.astype(dtype.np)
    arr = from_numpy(np.ascontiguousarray(host))
    arr.readonly = True
    return arr


def load_weights(
    ckpt: Checkpoint, cfg: ModelConfig, dtype: dtypes.DType | None, progress: bool
) -> tuple[dict[str, GPUArray], dtypes.DType]:
    """name -> read-only GPUArray. q/k/v and gate/up are concatenated into one matrix each,
    so a decode step runs one GEMM where the checkpoint has two or three."""
    needed = dict(weight_names(cfg))
    for name in needed:
        ckpt.info(name)  # every missing tensor is reported before any copy starts
    first = ckpt.info("model.embed_tokens.weight").dtype
    target = dtype or dtypes.as_dtype(first)
    if not target.is_float:
        raise LoadError(f"load: weights must load as a float dtype, got {target}")
    bar = Progress(sum(ckpt.info(n).nbytes for n in needed), progress)
    out: dict[str, GPUArray] = {}

    def get(name: str) -> np.ndarray:
        a = ckpt.numpy(name, needed[name])
        bar.update(a.nbytes)
        return a

    def put(key: str, *names: str) -> None:
        parts = [get(n) for n in names]
        try:
            out[key] = _upload(parts[0] if len(parts) == 1 else np.concatenate(parts), target)
        except errors.GPUKitError as e:
            raise type(e)(f"load {', '.join(names)}: {e}") from None

    put("embed", "model.embed_tokens.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        put(f"{i}.attn_norm", p + "input_layernorm.weight")
        put(f"{i}.wqkv", a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
        if cfg.attention_bias:
            put(f"{i}.bqkv", a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
        if cfg.qk_norm:
            put(f"{i}.q_norm", a + "q_norm.weight")
            put(f"{i}.k_norm", a + "k_norm.weight")
        put(f"{i}.wo", a + "o_proj.weight")
        put(f"{i}.mlp_norm", p + "post_attention_layernorm.weight")
        put(f"{i}.w_gate_up", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        put(f"{i}.w_down", p + "mlp.down_proj.weight")
    put("norm", "model.norm.weight")
    if cfg.tie_word_embeddings:
        out["lm_head"] = out["embed"]
    else:
        put("lm_head", "lm_head.weight")
    bar.finish()
    return out, target
