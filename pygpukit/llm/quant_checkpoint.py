"""Pre-quantized checkpoints: `quantization_config` in config.json, converted at load.

Each linear weight of logical shape [N, K] (q/k/v, o, gate/up, down, the LM head) that
the checkpoint stores quantized is converted on the host into the layouts of
pygpukit.ir.quant and uploaded as a QuantizedWeight; the rest loads as floats.

  quant_method           tensors of a linear `<name>` (weight name without ".weight")
  fp8 (HF fine-grained)  weight F8_E4M3 [N, K], weight_scale_inv [ceil(N/B), ceil(K/B)]
                         (B x B blocks from weight_block_size): w = e4m3 * scale_inv
  compressed-tensors     weight F8_E4M3 (type float) or I8 (type int, symmetric) [N, K],
                         weight_scale [1] (strategy tensor), [N, 1] (channel) or
                         [ceil(N/B), ceil(K/B)] (block): w = q * scale
  awq (GEMM, 4 bits)     qweight I32 [K, N/8], qzeros I32 [K/G, N/8], scales [K/G, N]; the
                         8 nibbles of a word (lowest first) hold columns 0,2,4,6,1,3,5,7
                         of its 8: w[n, k] = (q - z) * s of group k // G
  gptq (4 bits)          qweight I32 [K/8, N] (nibble j of word i: input row 8i + j),
                         qzeros I32 [K/G, N/8] (nibble j: column 8c + j), scales [K/G, N],
                         g_idx [K]; the v1 format (checkpoint_format "gptq", the default)
                         stores each zero point minus one, v2 ("gptq_v2") as it is

q/k/v and gate/up are concatenated along N, as for float weights: fp8 block scales join
when every part but the last fills whole blocks, else the parts are dequantized and
requantized together; per-tensor scales become per-channel ones. An int4 weight whose
zero points are all 8 loads as symmetric. Every inconsistency is a LoadError naming the
file and the field, raised before anything is allocated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.creation import load_numpy
from pygpukit.errors import LoadError
from pygpukit.ir.quant import INT4_SYMMETRIC_ZERO, QuantSpec, dequantize, pack_int4
from pygpukit.quant import QuantizedWeight, quantize_host

from .config import ConfigError, _Fields
from .loader import Checkpoint, TensorInfo, is_linear_name

METHODS = ("fp8", "compressed-tensors", "awq", "gptq")
CT_FORMATS = ("float-quantized", "naive-quantized", "int-quantized")
CT_STRATEGIES = ("tensor", "channel", "block")
GPTQ_FORMATS = ("gptq", "gptq_v2")
SCALE_DTYPES = ("F32", "F16", "BF16")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i]
FIELD = "quantization_config"

HostWeight = tuple[QuantSpec, np.ndarray, np.ndarray, np.ndarray | None]  # data, scale, zero


@dataclass(frozen=True)
class QuantConfig:
    """What config.json's quantization_config says, checked."""

    method: str  # one of METHODS
    format: str  # the pygpukit.ir.quant format it converts to: fp8, int8 or int4
    source: str  # config.json's path
    block: int = 0  # fp8 block scales: the square block's side
    strategy: str = ""  # compressed-tensors: tensor, channel or block
    group: int = 0  # int4: K elements per scale (0: the whole row, group_size -1)
    zero_offset: int = 0  # GPTQ v1 stores every zero point minus one

    def describe(self) -> str:
        if self.format == "int4":
            return f"{self.method}, group_size {self.group or 'K'}"
        return f"{self.method}, {self.format} {self.strategy or 'block'}"


def read_quant_config(d: dict[str, Any], source: str) -> QuantConfig | None:
    """The checked quantization_config of a config.json document, None without one."""
    raw = d.get(FIELD)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"must be an object, got {type(raw).__name__}", file=source, field=FIELD)
    f = _Fields(raw, source, FIELD + ".")
    method = f.get("quant_method")
    if method not in METHODS:
        raise f.fail("quant_method", f"{method!r} is not supported (supported: "
                    f"{', '.join(METHODS)})")  # fmt: skip
    if method == "fp8":
        return _fp8_config(f, source)
    if method == "compressed-tensors":
        return _ct_config(f, source)
    return _int4_config(f, method, source)


def _square_block(f: _Fields, key: str, value: Any) -> int:
    ok = isinstance(value, list) and len(value) == 2
    if not ok or value[0] != value[1]:
        raise f.fail(key, f"must be a square block [B, B], got {value!r}")
    return f.check_int(key, value[0], 1)


def _fp8_config(f: _Fields, source: str) -> QuantConfig:
    block = _square_block(f, "weight_block_size", f.get("weight_block_size", [128, 128]))
    return QuantConfig("fp8", "fp8", source, block=block, strategy="block")


def _ct_config(f: _Fields, source: str) -> QuantConfig:
    fmt = f.get("format")
    if fmt not in CT_FORMATS:
        raise f.fail("format", f"{fmt!r} is not supported (supported: {', '.join(CT_FORMATS)})")
    groups = f.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise f.fail("config_groups", f"must be a non-empty object, got {groups!r}")
    schemes = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise f.fail(f"config_groups.{name}.weights", f"must be an object, got {weights!r}")
        schemes.append((name, weights))
    if len({repr(sorted(w.items())) for _, w in schemes}) > 1:
        raise f.fail("config_groups", "groups with different weight schemes are not supported")
    name, w = schemes[0]
    g = _Fields(w, source, f"{FIELD}.config_groups.{name}.weights.")
    kind, bits = g.get("type"), g.get("num_bits")
    if (kind, bits) not in (("float", 8), ("int", 8)):
        raise g.fail("type", f"{kind} with {bits} bits is not supported (float or int, 8 bits)")
    strategy = g.get("strategy")
    if strategy not in CT_STRATEGIES or (kind == "int" and strategy == "block"):
        allowed = CT_STRATEGIES if kind == "float" else CT_STRATEGIES[:2]
        raise g.fail("strategy", f"{strategy!r} is not supported for {kind} weights "
                    f"(supported: {', '.join(allowed)})")  # fmt: skip
    if not g.flag("symmetric", True):
        raise g.fail("symmetric", "asymmetric weights (zero points) are not supported")
    block = 0
    if strategy == "block":
        block = _square_block(g, "block_structure", g.get("block_structure"))
    fmt_out = "fp8" if kind == "float" else "int8"
    return QuantConfig("compressed-tensors", fmt_out, source, block=block, strategy=strategy)


def _int4_config(f: _Fields, method: str, source: str) -> QuantConfig:
    bits_key = "bits" if "bits" in f.d or "w_bit" not in f.d else "w_bit"
    bits = f.get(bits_key)
    if bits != 4:
        raise f.fail(bits_key, f"{bits!r}: only 4-bit {method} weights are supported")
    group_key = "group_size" if "group_size" in f.d or "q_group_size" not in f.d else "q_group_size"
    group = f.get(group_key)
    if group != -1:
        group = f.check_int(group_key, group, 2)
        if group % 2:
            raise f.fail(group_key, f"{group} must be even (two 4-bit values a byte)")
    if method == "awq":
        version = f.get("version", "gemm")
        if not isinstance(version, str) or version.lower() != "gemm":
            raise f.fail("version", f"{version!r}: only AWQ's GEMM packing is supported")
        if not f.flag("zero_point", True):
            raise f.fail("zero_point", "false: AWQ's GEMM packing stores zero points")
        return QuantConfig("awq", "int4", source, group=max(group, 0))
    key = "checkpoint_format" if "checkpoint_format" in f.d or "format" not in f.d else "format"
    fmt = f.get(key, "gptq")
    if fmt not in GPTQ_FORMATS:
        raise f.fail(key, f"{fmt!r} is not supported (supported: {', '.join(GPTQ_FORMATS)})")
    f.flag("desc_act", False)  # checked; what counts is g_idx, checked per weight
    f.flag("sym", True)
    return QuantConfig("gptq", "int4", source, group=max(group, 0),
                       zero_offset=1 if fmt == "gptq" else 0)  # fmt: skip


def _unpack_words(words: np.ndarray) -> np.ndarray:
    """int32 [R, C] -> the 4-bit values uint8 [R, C, 8], lowest nibble first."""
    u = np.ascontiguousarray(words).view(np.uint32)
    shifts = np.arange(8, dtype=np.uint32) * 4
    return ((u[..., None] >> shifts) & 0xF).astype(np.uint8)


def awq_columns(words: np.ndarray) -> np.ndarray:
    """AWQ's int32 [R, N/8] (columns packed in AWQ_ORDER) -> uint8 [R, N] in column order."""
    nib = _unpack_words(words)
    out = np.empty_like(nib)
    out[:, :, list(AWQ_ORDER)] = nib
    return out.reshape(words.shape[0], -1)


def gptq_rows(words: np.ndarray) -> np.ndarray:
    """GPTQ's qweight int32 [K/8, N] (8 input rows a word) -> uint8 [K, N]."""
    nib = _unpack_words(words)  # [K/8, N, 8]
    return nib.transpose(0, 2, 1).reshape(-1, words.shape[1])


def int4_from_awq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group: int
) -> HostWeight:
    """AWQ GEMM tensors -> the int4 layout (data [N, K/2], scale and zero [N, K/G])."""
    q = awq_columns(qweight)  # [K, N]
    z = awq_columns(qzeros)  # [K/G, N]
    return _int4(q, z, scales, group)


def int4_from_gptq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group: int, zero_offset: int
) -> HostWeight:
    """GPTQ tensors -> the int4 layout; zero_offset 1 for the v1 format's stored zeros."""
    q = gptq_rows(qweight)  # [K, N]
    z = _unpack_words(qzeros).reshape(qzeros.shape[0], -1) + np.uint8(zero_offset)
    return _int4(q, z, scales, group)


def _int4(q: np.ndarray, z: np.ndarray, scales: np.ndarray, group: int) -> HostWeight:
    zero = np.ascontiguousarray(z.T)
    sym = bool((zero == INT4_SYMMETRIC_ZERO).all())
    spec = QuantSpec("int4", group=group, has_zero=not sym)
    scale = np.ascontiguousarray(scales.T, dtype=np.float32)
    return spec, pack_int4(np.ascontiguousarray(q.T)), scale, None if sym else zero


def concat_parts(parts: Sequence[HostWeight], ns: Sequence[int], k: int) -> HostWeight:
    """Quantized weights [n_i, K] of one format joined along N (q/k/v, gate/up)."""
    if len(parts) == 1:
        return parts[0]
    spec = parts[0][0]
    data = np.concatenate([p[1] for p in parts])
    if spec.format == "int8":
        return spec, data, np.concatenate([p[2] for p in parts]), None
    if spec.format == "int4":
        zeros = [p[3] if p[3] is not None else np.full(p[2].shape, INT4_SYMMETRIC_ZERO, np.uint8)
                 for p in parts]  # fmt: skip
        has_zero = any(p[3] is not None for p in parts)
        out = QuantSpec("int4", group=spec.group, has_zero=has_zero)
        return out, data, np.concatenate([p[2] for p in parts]), (
            np.concatenate(zeros) if has_zero else None)  # fmt: skip
    if not spec.block:  # per-tensor or per-channel: per-channel once joined
        scale = np.concatenate(
            [np.broadcast_to(p[2], (n,)) for p, n in zip(parts, ns, strict=True)]
        )
        return QuantSpec("fp8"), data, scale.astype(np.float32), None
    b = spec.block
    if all(n % b == 0 for n in ns[:-1]):
        return spec, data, np.concatenate([p[2] for p in parts]), None
    # A part ends inside a block: its scales cannot be shared with the next part's rows.
    w = np.concatenate([dequantize(p[0], p[1], p[2], None, k) for p in parts])
    return quantize_host(w, "fp8", block=b)


class PrequantizedLinears:
    """A loader.LinearSource for a checkpoint with a quantization_config."""

    tied_head = False  # a tied head is the embedding: it stays float

    def __init__(self, qc: QuantConfig) -> None:
        self.qc = qc

    # -- which tensors ---------------------------------------------------------------
    def _base(self, name: str) -> str:
        return name[: -len(".weight")]

    def _names(self, name: str) -> list[str]:
        b = self._base(name)
        if self.qc.method == "fp8":
            return [b + ".weight", b + ".weight_scale_inv"]
        if self.qc.method == "compressed-tensors":
            return [b + ".weight", b + ".weight_scale"]
        extra = [b + ".g_idx"] if self.qc.method == "gptq" else []
        return [b + ".qweight", b + ".qzeros", b + ".scales", *extra]

    def owns(self, ckpt: Checkpoint, name: str) -> bool:
        if not is_linear_name(name):
            return False
        if self.qc.method in ("awq", "gptq"):
            return self._base(name) + ".qweight" in ckpt
        return name in ckpt and ckpt.info(name).stored in ("F8_E4M3", "I8")

    def nbytes(self, ckpt: Checkpoint, name: str) -> int:
        return sum(ckpt.info(n).nbytes for n in self._names(name) if n in ckpt)

    # -- checks ----------------------------------------------------------------------
    def _tensor(
        self, ckpt: Checkpoint, name: str, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]
    ) -> TensorInfo:
        t = ckpt.info(name)
        if t.shape not in [tuple(s) for s in shapes]:
            want = " or ".join(str(list(s)) for s in shapes)
            raise LoadError(
                f"has shape {list(t.shape)}, but {self.qc.source} ({FIELD}: "
                f"{self.qc.describe()}) needs {want}",
                file=t.file,
                field=f"tensor {name!r}",
            )
        if t.stored not in dtypes:
            raise LoadError(
                f"dtype {t.stored}: {self.qc.method} needs {' or '.join(dtypes)}",
                file=t.file,
                field=f"tensor {name!r}",
            )
        return t

    def _finite(self, ckpt: Checkpoint, name: str) -> None:
        s = ckpt.numpy(name)
        if not np.isfinite(s.astype(np.float32)).all():
            t = ckpt.info(name)
            raise LoadError("holds a NaN or infinite scale", file=t.file, field=f"tensor {name!r}")

    def _group(self, name: str, k: int) -> int:
        g = self.qc.group or k
        if k % g:
            raise LoadError(f"{g} does not divide K={k} of {self._base(name)!r}",
                            file=self.qc.source, field=f"{FIELD}.group_size")  # fmt: skip
        if k % 8 and self.qc.method == "gptq" or k % 2:
            raise LoadError(f"K={k} of {self._base(name)!r} is not a multiple of 8 (the "
                            f"values of a 32-bit word)", file=self.qc.source,
                            field=f"{FIELD}.bits")  # fmt: skip
        return g

    def check(self, ckpt: Checkpoint, name: str, shape: tuple[int, int], source: str) -> None:
        n, k = shape
        qc, names = self.qc, self._names(name)
        if qc.format in ("fp8", "int8"):
            self._tensor(ckpt, names[0], [(n, k)], ["F8_E4M3" if qc.format == "fp8" else "I8"])
            self._tensor(ckpt, names[1], self._scale_shapes(n, k), SCALE_DTYPES)
            self._finite(ckpt, names[1])
            return
        g = self._group(name, k)
        if n % 8:
            raise LoadError(f"N={n} of {self._base(name)!r} is not a multiple of 8 (the "
                            f"values of a 32-bit word)", file=qc.source,
                            field=f"{FIELD}.bits")  # fmt: skip
        qshape = (k, n // 8) if qc.method == "awq" else (k // 8, n)
        self._tensor(ckpt, names[0], [qshape], ["I32"])
        self._tensor(ckpt, names[1], [(k // g, n // 8)], ["I32"])
        self._tensor(ckpt, names[2], [(k // g, n)], SCALE_DTYPES)
        self._finite(ckpt, names[2])
        if qc.method == "gptq":
            self._check_g_idx(ckpt, names[3], k, g)

    def _scale_shapes(self, n: int, k: int) -> list[tuple[int, ...]]:
        if self.qc.block:
            b = self.qc.block
            return [(math.ceil(n / b), math.ceil(k / b))]
        if self.qc.strategy == "tensor":
            return [(1,), (), (1, 1)]
        return [(n, 1), (n,)]

    def _check_g_idx(self, ckpt: Checkpoint, name: str, k: int, g: int) -> None:
        if name not in ckpt:
            return  # no g_idx: the trivial order
        t = self._tensor(ckpt, name, [(k,)], ["I32", "I64"])
        if not np.array_equal(ckpt.numpy(name), np.arange(k) // g):
            raise LoadError(
                "is not k // group_size: act-order (desc_act) checkpoints, whose input rows "
                "are grouped out of order, are not supported",
                file=t.file,
                field=f"tensor {name!r}",
            )

    # -- conversion ------------------------------------------------------------------
    def host(self, ckpt: Checkpoint, name: str, n: int, k: int) -> HostWeight:
        """One checked weight `name` [n, k] in the pygpukit.ir.quant layout, on the host."""
        qc, names = self.qc, self._names(name)
        if qc.format in ("fp8", "int8"):
            q = ckpt.numpy(names[0])
            scale = ckpt.numpy(names[1]).astype(np.float32)
            if qc.block:
                return QuantSpec("fp8", block=qc.block), q.view(np.uint8), scale, None
            if qc.format == "int8":
                return QuantSpec("int8"), q, np.broadcast_to(scale.reshape(-1), (n,)), None
            per_tensor = qc.strategy == "tensor"
            return (
                QuantSpec("fp8"),
                q.view(np.uint8),
                scale.reshape(() if per_tensor else (n,)),
                None,
            )
        qweight, qzeros = ckpt.numpy(names[0]), ckpt.numpy(names[1])
        scales = ckpt.numpy(names[2]).astype(np.float32)
        g = self.qc.group or k
        if qc.method == "awq":
            return int4_from_awq(qweight, qzeros, scales, g)
        return int4_from_gptq(qweight, qzeros, scales, g, qc.zero_offset)

    def load(
        self, ckpt: Checkpoint, names: Sequence[str], shapes: Sequence[tuple[int, int]]
    ) -> QuantizedWeight:
        k = shapes[0][1]
        parts = [self.host(ckpt, nm, n, k) for nm, (n, _) in zip(names, shapes, strict=True)]
        spec, data, scale, zero = concat_parts(parts, [n for n, _ in shapes], k)
        n = sum(s[0] for s in shapes)
        # np.copy, not ascontiguousarray: that makes a per-tensor scale [] into [1].
        arrays = [load_numpy(np.copy(a, order="C")) for a in (data, scale)]
        zarr = None if zero is None else load_numpy(np.copy(zero, order="C"))
        try:
            w = QuantizedWeight(spec, (n, k), arrays[0], arrays[1], zarr)
        except BaseException:
            for a in (*arrays, zarr):
                if a is not None:
                    a.free()
            raise
        for a in (w.data, w.scale, w.zero):
            if a is not None:
                a.readonly = True
        return w


__all__ = [
    "METHODS", "PrequantizedLinears", "QuantConfig", "awq_columns", "concat_parts",
    "gptq_rows", "int4_from_awq", "int4_from_gptq", "read_quant_config",
]  # fmt: skip
