"""Loading SafeTensors checkpoints (one file or sharded) into read-only GPUArrays.

The safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw data. The header is parsed here so that
every inconsistency is reported with the tensor and the file; the data is memory-mapped and
copied tensor by tensor to the backend, so a checkpoint never sits in host memory twice.

Loading runs at storage speed: every float tensor is uploaded in one bulk load
(creation.load_numpy_groups) that the CUDA backend stages from the page cache into pinned
buffers on several threads at once, each buffer's DMA overlapping the other threads'
copies (one thread's memcpy is about a sixth of the DMA rate), with no host concatenation
or cast -- the parts of a fused matrix are uploaded into their rows of it, and dtypes are
converted on the device -- while a thread asks the kernel to read the tensors ahead
(madvise WILLNEED, one request per tensor, so the shards of a sharded checkpoint are read
in parallel with the uploads and with each other).
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

import ml_dtypes
import numpy as np

from pygpukit import errors
from pygpukit.array import GPUArray
from pygpukit.creation import load_numpy, load_numpy_groups
from pygpukit.errors import LoadError
from pygpukit.ir import dtypes
from pygpukit.ops import concatenate, realize
from pygpukit.progress import ProgressBar
from pygpukit.quant import QuantizedWeight

from .config import ModelConfig
from .files import ModelDir, open_regular, parse_json, read_json

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
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),  # fp8 checkpoints' quantized weights
}
WEIGHT_DTYPES = ("F64", "F32", "F16", "BF16")  # what a model's float weights may be stored as
MAX_HEADER = 100 << 20  # the reference implementation's limit
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int
    stored: str = ""  # the safetensors dtype name (BF16, I32, ...)


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parse and check one .safetensors header; every error names the file (and tensor)."""
    with open_regular(path) as f:
        return _parse_header(f, path)


def _parse_header(f: IO[bytes], path: str) -> dict[str, TensorInfo]:
    try:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise LoadError("not a safetensors file (shorter than its 8-byte header)", file=path)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise LoadError(
                f"bad safetensors header: header length {n} does not fit the "
                f"file of {size} bytes (at most {MAX_HEADER})",
                file=path,
            )
        raw = f.read(n)
    except LoadError:
        raise
    except OSError as e:
        raise LoadError(f"cannot read: {e.strerror or e}", file=path) from None
    header = parse_json(raw, path, "the safetensors header")
    if not isinstance(header, dict):
        raise LoadError("bad safetensors header: expected a JSON object", file=path)
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise LoadError("must map names to strings", file=path, field="__metadata__")
    data_start, data_len = 8 + n, size - 8 - n
    out = {name: _entry(path, name, entry, data_start, data_len) for name, entry in header.items()}
    # Tensors own disjoint byte ranges (empty tensors own none).
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in out.values() if t.nbytes)
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise LoadError(
                f"bytes {begin - data_start}.. overlap tensor {a!r} (ending at {end - data_start})",
                file=path,
                field=f"tensor {b!r}",
            )
    return out


def _entry(path: str, name: str, e: Any, data_start: int, data_len: int) -> TensorInfo:
    """One header entry {dtype, shape, data_offsets}, every value's type and range checked."""

    def bad(what: str) -> LoadError:
        return LoadError(f"bad header entry: {what}", file=path, field=f"tensor {name!r}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(e, dict):
        raise bad(f"expected an object, got {type(e).__name__}")
    stored = e.get("dtype")
    if not isinstance(stored, str) or stored not in SAFETENSORS_DTYPES:
        raise bad(f"dtype {stored!r} is not one of {', '.join(SAFETENSORS_DTYPES)}")
    shape, offsets = e.get("shape"), e.get("data_offsets")
    if not isinstance(shape, list) or not all(is_int(s) for s in shape):
        raise bad(f"shape {shape!r} is not a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
        raise bad(f"data_offsets {offsets!r} is not two integers >= 0")
    dt = SAFETENSORS_DTYPES[stored]
    begin, end = offsets
    want = math.prod(shape) * dt.itemsize
    if end < begin or end - begin != want:
        raise LoadError(
            f"{stored}{shape} needs {want} bytes, the header gives {end - begin} "
            f"(offsets {begin}..{end})",
            file=path,
            field=f"tensor {name!r}",
        )
    if end > data_len:
        raise LoadError(
            f"bytes {begin}..{end} run past the end of the data ({data_len} "
            f"bytes; the file is truncated?)",
            file=path,
            field=f"tensor {name!r}",
        )
    return TensorInfo(name, path, dt, tuple(shape), data_start + begin, want, stored)


def read_index(model: ModelDir) -> dict[str, str] | None:
    """The index's weight_map (tensor name -> shard file name), or None without an index."""
    if not model.has(INDEX):
        return None
    path = model.path(INDEX)
    with model.open(INDEX) as f:
        index = read_json(f, path, "the shard index")
    if not isinstance(index, dict) or "weight_map" not in index:
        raise LoadError("expected an object with a weight_map", file=path)
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict):
        raise LoadError(
            f"must map tensor names to file names, got {type(weight_map).__name__}",
            file=path,
            field="weight_map",
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise LoadError(
                f"expected a file name, got {shard!r}", file=path, field=f"weight_map[{name!r}]"
            )
    return weight_map


def checkpoint_files(path: str | ModelDir) -> list[str]:
    """The .safetensors files of a model directory: the index's shards, or all of them,
    each a regular file inside the directory (resolved path)."""
    model = path if isinstance(path, ModelDir) else ModelDir(path)
    weight_map = read_index(model)
    index = model.path(INDEX) if weight_map is not None else None
    if weight_map is not None:
        names: dict[str, str | None] = {s: f"weight_map[{t!r}]" for t, s in weight_map.items()}
    else:
        names = {f: None for f in os.listdir(model.root) if f.endswith(".safetensors")}
    if not names:
        raise LoadError("no *.safetensors files", file=model.given)
    files = []
    for name, field in sorted(names.items()):
        with model.open(name, index, field):  # refused unless a regular file inside
            files.append(model.path(name))
    return files


class Checkpoint:
    """The tensors of one checkpoint, by name, memory-mapped on demand.

    Each file is opened once (a regular file, checked on the open descriptor) and stays
    open: the memory maps are made from those descriptors, so a file swapped after the
    check is never read.
    """

    def __init__(self, files: Iterable[str]) -> None:
        self.files = list(files)
        self.tensors: dict[str, TensorInfo] = {}
        self._open: dict[str, IO[bytes]] = {}
        self._maps: dict[str, mmap.mmap] = {}
        self.loaded_bytes = 0  # bytes load_weights read (set there)
        try:
            for path in self.files:
                f = self._open[path] = open_regular(path)
                for name, info in _parse_header(f, path).items():
                    if name in self.tensors:
                        raise LoadError(
                            f"also in {self.tensors[name].file}",
                            file=path,
                            field=f"tensor {name!r}",
                        )
                    self.tensors[name] = info
        except BaseException:
            self.close()
            raise

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            where = ", ".join(os.path.basename(f) for f in self.files)
            file = self.files[0] if len(self.files) == 1 else os.path.dirname(self.files[0])
            raise LoadError(
                f"missing (looked in {where})", file=file, field=f"tensor {name!r}"
            ) from None

    def check_index(self, weight_map: dict[str, str], index: str) -> None:
        """Every tensor the index lists is in the shard it names."""
        for name, shard in weight_map.items():
            t = self.tensors.get(name)
            if t is None or os.path.basename(t.file) != os.path.basename(shard):
                found = "in no shard" if t is None else f"in {t.file}"
                raise LoadError(
                    f"names {shard!r}, but the tensor is {found}",
                    file=index,
                    field=f"weight_map[{name!r}]",
                )

    def numpy(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as a read-only memory-mapped array, its shape checked if given."""
        t = self.info(name)
        if shape is not None and t.shape != tuple(shape):
            raise LoadError(
                f"has shape {list(t.shape)}, the config needs {list(shape)}",
                file=t.file,
                field=f"tensor {name!r}",
            )
        if t.nbytes == 0:
            return np.zeros(t.shape, t.dtype)
        mm = self._map(t.file)
        return np.frombuffer(mm, dtype=t.dtype, count=math.prod(t.shape), offset=t.offset).reshape(
            t.shape
        )

    def _map(self, path: str) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            f = self._open.get(path) or open_regular(path)
            self._open[path] = f
            mm = self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return mm

    def prefetch(self, names: Iterable[str]) -> None:
        """Ask the kernel to start reading these tensors' bytes (asynchronously; a no-op
        where madvise is missing), so they are in memory when they are copied."""
        if not hasattr(mmap, "MADV_WILLNEED"):
            return
        for name in names:
            t = self.tensors.get(name)
            if t is None or t.nbytes == 0:
                continue
            begin = t.offset - t.offset % mmap.PAGESIZE
            try:
                self._map(t.file).madvise(mmap.MADV_WILLNEED, begin, t.offset + t.nbytes - begin)
            except OSError:
                return  # advice only: reading works without it

    def close(self) -> None:
        # Dropped, not closed: arrays made by numpy() may still view a map; it is unmapped
        # when the last of them goes.
        self._maps.clear()
        for f in self._open.values():
            f.close()
        self._open.clear()


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


# The config.json fields each weight's dimensions come from, by the name's ending.
_DIM_FIELDS = {
    "embed_tokens.weight": ("vocab_size", "hidden_size"),
    "lm_head.weight": ("vocab_size", "hidden_size"),
    "q_proj.weight": ("num_attention_heads * head_dim", "hidden_size"),
    "k_proj.weight": ("num_key_value_heads * head_dim", "hidden_size"),
    "v_proj.weight": ("num_key_value_heads * head_dim", "hidden_size"),
    "q_proj.bias": ("num_attention_heads * head_dim",),
    "k_proj.bias": ("num_key_value_heads * head_dim",),
    "v_proj.bias": ("num_key_value_heads * head_dim",),
    "q_norm.weight": ("head_dim",),
    "k_norm.weight": ("head_dim",),
    "o_proj.weight": ("hidden_size", "num_attention_heads * head_dim"),
    "gate_proj.weight": ("intermediate_size", "hidden_size"),
    "up_proj.weight": ("intermediate_size", "hidden_size"),
    "down_proj.weight": ("hidden_size", "intermediate_size"),
    "norm.weight": ("hidden_size",),
}
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _dim_fields(name: str) -> str:
    fields = next(f for end, f in _DIM_FIELDS.items() if name.endswith(end))
    return ", ".join(fields)


# Weights the model applies with gpk.nn.linear (its keys' last part): what may be quantized.
LINEAR_KEYS = ("wqkv", "wo", "w_gate_up", "w_down", "lm_head")
# Checkpoint linears loaded as one matrix (concatenated along N), by the name's ending.
FUSED = (("q_proj.weight", "k_proj.weight", "v_proj.weight"),
         ("gate_proj.weight", "up_proj.weight"))  # fmt: skip


def is_linear_name(name: str) -> bool:
    """Whether a checkpoint weight name is one of the model's linear weights."""
    ends = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
            "gate_proj.weight", "up_proj.weight", "down_proj.weight")  # fmt: skip
    return name == "lm_head.weight" or (name.startswith("model.layers.") and name.endswith(ends))


class LinearSource(Protocol):
    """Where quantized linear weights come from: a pre-quantized checkpoint's own tensors
    (quant_checkpoint.py) or float tensors quantized as they stream in (quantize.py). Each
    method takes a Hugging Face weight name ("...q_proj.weight") of logical shape [N, K]."""

    tied_head: bool  # a tied LM head is quantized too (from the embedding's tensor)

    def owns(self, ckpt: Checkpoint, name: str) -> bool:
        """Whether this source loads the linear weight `name` (else it loads as a float)."""
        ...

    def check(self, ckpt: Checkpoint, name: str, shape: tuple[int, int], source: str) -> None:
        """LoadError (naming the file and tensor) unless the tensors behind `name` fit."""
        ...

    def nbytes(self, ckpt: Checkpoint, name: str) -> int:
        """The bytes read from the checkpoint for `name` (for the progress bar)."""
        ...

    def load(
        self, ckpt: Checkpoint, names: Sequence[str], shapes: Sequence[tuple[int, int]]
    ) -> QuantizedWeight:
        """The weights `names` concatenated along N as one QuantizedWeight on the device."""
        ...


def check_checkpoint(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    source: str = "config.json",
    linears: LinearSource | None = None,
) -> None:
    """The config against the tensors found, before anything is allocated: the layer count
    (checked first, so a huge num_hidden_layers costs nothing), then every needed tensor's
    presence, shape and dtype. `source` is the config's path, for the errors. `linears`
    checks the linear weights it owns (a quantized checkpoint, or quantize-on-load)."""
    layers = {int(m.group(1)) for n in ckpt.tensors if (m := _LAYER.match(n))}
    if len(layers) != cfg.num_layers or layers != set(range(cfg.num_layers)):
        found = f"layers {sorted(layers)[:8]}{'...' if len(layers) > 8 else ''}"
        raise LoadError(
            f"{cfg.num_layers}, but the checkpoint has {len(layers)} "
            f"({found if layers else 'none'})",
            file=source,
            field="num_hidden_layers",
        )
    owned = {n for n, _ in weight_names(cfg) if linears is not None and linears.owns(ckpt, n)}
    for name, shape in weight_names(cfg):
        if name in owned:
            assert linears is not None and len(shape) == 2
            _check_fused(name, owned, ckpt)
            linears.check(ckpt, name, (shape[0], shape[1]), source)
            continue
        check_float(ckpt, name, shape, source)


def check_float(ckpt: Checkpoint, name: str, shape: tuple[int, ...], source: str) -> None:
    """The float tensor `name` is present, of `shape` and a float dtype."""
    t = ckpt.info(name)
    if t.shape != shape:
        raise LoadError(
            f"has shape {list(t.shape)}, but {source} ({_dim_fields(name)}) needs {list(shape)}",
            file=t.file,
            field=f"tensor {name!r}",
        )
    if t.stored not in WEIGHT_DTYPES:
        raise LoadError(
            f"dtype {t.stored}: weights must be one of {', '.join(WEIGHT_DTYPES)}",
            file=t.file,
            field=f"tensor {name!r}",
        )


def _check_fused(name: str, owned: set[str], ckpt: Checkpoint) -> None:
    """The parts of one fused matrix are all quantized or all float: one GEMM reads them."""
    for group in FUSED:
        part = next((p for p in group if name.endswith(p)), None)
        if part is not None:
            stem = name[: -len(part)]
            float_parts = [stem + p for p in group if stem + p not in owned]
            if float_parts:
                t = ckpt.info(float_parts[0])
                raise LoadError(
                    f"is stored as a float weight, but {name!r} is quantized; the parts of "
                    f"{'/'.join(p.split('.')[0] for p in group)} are loaded as one matrix and "
                    f"must share one format",
                    file=t.file,
                    field=f"tensor {float_parts[0]!r}",
                )


def free_weights(weights: dict[str, Any]) -> None:
    """Free every distinct array of a weight dict (a QuantizedWeight's arrays included)."""
    arrays: dict[int, GPUArray] = {}
    for w in weights.values():
        parts = [w.data, w.scale, w.zero] if isinstance(w, QuantizedWeight) else [w]
        arrays.update({id(a): a for a in parts if a is not None})
    for arr in arrays.values():
        arr.free()


def _upload(parts: list[np.ndarray], dtype: dtypes.DType) -> GPUArray:
    """The parts (memory-mapped, as stored, of mixed dtypes) concatenated along axis 0 and
    cast to dtype, on the device. Parts of one dtype take the staged path instead
    (_upload_staged)."""
    pieces = [load_numpy(np.ascontiguousarray(p)) for p in parts]
    arr = concatenate(pieces).astype(dtype)
    realize(arr)
    for p in pieces:
        p.free()
    arr.readonly = True
    return arr


def _as_weight(arr: GPUArray, dtype: dtypes.DType) -> GPUArray:
    """An uploaded weight as the model keeps it: cast to dtype on the device (the upload
    freed), read-only."""
    if arr.dtype != dtype:
        cast = arr.astype(dtype)
        realize(cast)
        arr.free()
        arr = cast
    arr.readonly = True
    return arr


def _upload_staged(ckpt: Checkpoint, staged: list[tuple[str, tuple[str, ...], list[np.ndarray]]],
                   dtype: dtypes.DType, bar: ProgressBar) -> dict[str, GPUArray]:  # fmt: skip
    """key -> weight for the (key, tensor names, parts) groups, all uploaded as one bulk
    load (creation.load_numpy_groups: on CUDA, staged on several threads at once) while a
    thread asks the kernel to read the tensors ahead (madvise costs about 15 ns a page, 8 ms
    for 2.2 GB, even when the page cache holds the file: it runs beside the copies). What
    was uploaded is freed if a later step fails."""
    names = [n for _, group, _ in staged for n in group]
    ahead = threading.Thread(target=ckpt.prefetch, args=(names,), name="pygpukit-read-ahead",
                             daemon=True)  # fmt: skip
    ahead.start()
    try:
        arrays = load_numpy_groups([parts for _, _, parts in staged], progress=bar.update)
    except errors.GPUKitError as e:
        more = ", ..." if len(names) > 3 else ""
        raise type(e)(f"load {', '.join(names[:3])}{more}: {e}") from None
    finally:
        ahead.join()
    out: dict[str, GPUArray] = {}
    try:
        for (key, group, _), arr in zip(staged, arrays, strict=True):
            try:
                out[key] = _as_weight(arr, dtype)
            except errors.GPUKitError as e:
                raise type(e)(f"load {', '.join(group)}: {e}") from None
    except BaseException:
        for arr in [*arrays, *out.values()]:
            arr.free()  # idempotent: an array cast and freed, or in both lists
        raise
    return out


def load_weights(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    dtype: dtypes.DType | None,
    progress: bool | None,
    source: str = "config.json",
    linears: LinearSource | None = None,
    shard: Callable[[str, np.ndarray], np.ndarray] | None = None,
) -> tuple[dict[str, Any], dtypes.DType]:
    """name -> read-only GPUArray (or QuantizedWeight, for the linear weights `linears`
    owns). q/k/v and gate/up are concatenated into one matrix each, so a decode step runs
    one GEMM where the checkpoint has two or three. Everything is checked
    (check_checkpoint) before the first allocation, and what was uploaded is freed if a
    copy still fails. shard(name, tensor) gives the part this rank keeps (a view of the
    memory map, so only its bytes are read; llm/parallel.py)."""
    check_checkpoint(ckpt, cfg, source, linears)
    needed = dict(weight_names(cfg))
    owned = {n for n in needed if linears is not None and linears.owns(ckpt, n)}
    target = dtype or dtypes.as_dtype(ckpt.info("model.embed_tokens.weight").dtype)
    if not target.is_float:
        raise LoadError(f"weights must load as a float dtype, got {target}")
    sizes = {n: linears.nbytes(ckpt, n) if linears and n in owned else ckpt.info(n).nbytes
             for n in needed}  # fmt: skip
    ckpt.loaded_bytes = sum(sizes.values())  # read from the files, for the load rate
    bar = ProgressBar(ckpt.loaded_bytes, progress)
    out: dict[str, Any] = {}
    order: list[str] = []  # the weights' keys in the model's order
    # Float weights of one stored dtype: uploaded together at the end, several at once.
    staged: list[tuple[str, tuple[str, ...], list[np.ndarray]]] = []

    def get(name: str) -> np.ndarray:
        a = ckpt.numpy(name, needed[name])
        return a if shard is None else shard(name, a)

    def put(key: str, *names: str) -> None:
        order.append(key)
        if names[0] in owned and linears is not None:
            shapes = [(needed[n][0], needed[n][1]) for n in names]
            out[key] = linears.load(ckpt, names, shapes)
            bar.update(sum(sizes[n] for n in names))
            return
        parts = [get(n) for n in names]
        if all(p.dtype == parts[0].dtype for p in parts):
            staged.append((key, names, parts))
            return
        try:
            out[key] = _upload(parts, target)
        except errors.GPUKitError as e:
            raise type(e)(f"load {', '.join(names)}: {e}") from None
        bar.update(sum(sizes[n] for n in names))

    try:
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
        if cfg.tie_word_embeddings and linears is not None and linears.tied_head:
            emb = "model.embed_tokens.weight"
            order.append("lm_head")
            out["lm_head"] = linears.load(ckpt, [emb], [(needed[emb][0], needed[emb][1])])
        elif not cfg.tie_word_embeddings:
            put("lm_head", "lm_head.weight")
        if staged:
            read = sum(sizes[n] for _, names, _ in staged for n in names)
            uploaded = sum(p.nbytes for _, _, parts in staged for p in parts)
            out.update(_upload_staged(ckpt, staged, target, bar))
            bar.update(read - uploaded)  # a tensor-parallel rank reads only its shard
        if cfg.tie_word_embeddings and "lm_head" not in out:
            order.append("lm_head")
            out["lm_head"] = out["embed"]
        out = {k: out[k] for k in order}
    except BaseException:
        free_weights(out)
        raise
    finally:
        bar.finish()
    return out, target
