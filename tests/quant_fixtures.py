"""Pre-quantized checkpoints written from a float fixture, each per its format's
specification (written here from the formats' descriptions, not with the loader's code):
HF fine-grained fp8, compressed-tensors fp8/int8, AWQ GEMM and GPTQ (v1 and v2).

make_quantized(src, dst, method, ...) writes dst with config.json's quantization_config and
returns the float64 weights [N, K] the quantized tensors stand for (by HF name), which is
what a correct loader must reproduce.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from typing import Any

import ml_dtypes
import numpy as np

from pygpukit.llm import ModelConfig
from pygpukit.llm.loader import Checkpoint, checkpoint_files

ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.int32): "I32",
             np.dtype(np.int8): "I8", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
             np.dtype(np.int64): "I64"}  # fmt: skip
LINEAR_ENDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # word nibble i <- column AWQ_PACK_ORDER[i]


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file written by hand (the library has no float8 for NumPy)."""
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _e4m3(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(ml_dtypes.float8_e4m3fn)


# -- each format from a float64 weight w [N, K]: (tensors by suffix, the weight they mean) --


def fp8_block(w: np.ndarray, b: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    n, k = w.shape
    nb, kb = -(-n // b), -(-k // b)
    s = np.zeros((nb, kb), np.float32)
    q = np.zeros((n, k), ml_dtypes.float8_e4m3fn)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * b : (i + 1) * b, j * b : (j + 1) * b]
            s[i, j] = np.abs(blk).max() / 448.0
            q[i * b : (i + 1) * b, j * b : (j + 1) * b] = _e4m3(blk / np.float64(s[i, j]))
    full = np.repeat(np.repeat(s.astype(np.float64), b, 0), b, 1)[:n, :k]
    return {"weight": q, "weight_scale_inv": s}, q.astype(np.float64) * full


def ct_fp8(w: np.ndarray, strategy: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if strategy == "tensor":
        s = np.array([np.abs(w).max() / 448.0], np.float32)
        per_row = np.full((w.shape[0], 1), s[0], np.float64)
    else:
        s = (np.abs(w).max(axis=1, keepdims=True) / 448.0).astype(np.float32)
        per_row = s.astype(np.float64)
    q = _e4m3(w / per_row)
    return {"weight": q, "weight_scale": s}, q.astype(np.float64) * per_row


def ct_int8(w: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    s = (np.abs(w).max(axis=1, keepdims=True) / 127.0).astype(np.float32)
    q = np.clip(np.round(w / s.astype(np.float64)), -127, 127).astype(np.int8)
    return {"weight": q, "weight_scale": s}, q.astype(np.float64) * s.astype(np.float64)


def _groups_asym(w: np.ndarray, g: int, zmin: int = 0) -> tuple[np.ndarray, ...]:
    """Asymmetric 4-bit per group along K: q, z [N, K/G] ints and fp16 scales [N, K/G]."""
    n, k = w.shape
    wg = w.reshape(n, k // g, g)
    lo, hi = wg.min(axis=2), wg.max(axis=2)
    s = ((hi - lo) / 15.0).astype(np.float16)
    s64 = s.astype(np.float64)
    z = np.clip(np.round(-lo / s64), zmin, 15)
    q = np.clip(np.round(wg / s64[..., None]) + z[..., None], 0, 15)
    return q.reshape(n, k).astype(np.int64), z.astype(np.int64), s


def _groups_sym(w: np.ndarray, g: int) -> tuple[np.ndarray, ...]:
    n, k = w.shape
    wg = w.reshape(n, k // g, g)
    s = (2 * np.abs(wg).max(axis=2) / 15.0).astype(np.float16)  # GPTQ: zero 8, [-8, 7]
    q = np.clip(np.round(wg / s.astype(np.float64)[..., None]) + 8, 0, 15)
    return q.reshape(n, k).astype(np.int64), np.full(s.shape, 8, np.int64), s


def _meaning(q: np.ndarray, z: np.ndarray, s: np.ndarray, g: int) -> np.ndarray:
    return (q - np.repeat(z, g, axis=1)) * np.repeat(s.astype(np.float64), g, axis=1)


def _words(nibbles: np.ndarray) -> np.ndarray:
    """[..., 8] values in [0, 15] -> int32 [...], element j in bits 4j..4j+3."""
    acc = np.zeros(nibbles.shape[:-1], np.uint64)
    for j in range(8):
        acc |= nibbles[..., j].astype(np.uint64) << np.uint64(4 * j)
    return acc.astype(np.uint32).view(np.int32)


def awq(w: np.ndarray, g: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    q, z, s = _groups_asym(w, g)
    qt, zt = q.T, z.T  # [K, N], [K/G, N]: AWQ stores the input axis first

    def pack(a: np.ndarray) -> np.ndarray:
        cols = a.reshape(a.shape[0], -1, 8)  # 8 consecutive output columns a word
        return _words(cols[:, :, AWQ_PACK_ORDER])

    tensors = {"qweight": pack(qt), "qzeros": pack(zt), "scales": np.ascontiguousarray(s.T)}
    return tensors, _meaning(q, z, s, g)


def gptq(w: np.ndarray, g: int, sym: bool, v1: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    q, z, s = _groups_sym(w, g) if sym else _groups_asym(w, g, zmin=1 if v1 else 0)
    k, n = q.shape[1], q.shape[0]
    qt = q.T  # [K, N]
    qweight = _words(qt.reshape(k // 8, 8, n).transpose(0, 2, 1))  # 8 input rows a word
    stored = z.T - (1 if v1 else 0)  # [K/G, N]; v1 keeps zero - 1
    qzeros = _words(stored.reshape(stored.shape[0], -1, 8))  # 8 output columns a word
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": np.ascontiguousarray(s.T),
               "g_idx": (np.arange(k) // g).astype(np.int32)}  # fmt: skip
    return tensors, _meaning(q, z, s, g)


def quant_config(method: str, **opt: Any) -> dict[str, Any]:
    """config.json's quantization_config as each tool writes it."""
    if method == "fp8":
        b = opt.get("block", 128)
        return {"quant_method": "fp8", "activation_scheme": "dynamic",
                "weight_block_size": [b, b], "modules_to_not_convert": ["lm_head"]}  # fmt: skip
    if method in ("ct-fp8", "ct-int8"):
        weights = {"num_bits": 8, "type": "float" if method == "ct-fp8" else "int",
                   "strategy": opt.get("strategy", "channel"), "symmetric": True,
                   "dynamic": False, "group_size": None, "block_structure": None}  # fmt: skip
        return {"quant_method": "compressed-tensors", "format": opt.get("format", (
                    "float-quantized" if method == "ct-fp8" else "int-quantized")),
                "quantization_status": "compressed", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": None}}}  # fmt: skip
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": opt["group"],
                "version": "gemm", "zero_point": True, "modules_to_not_convert": None}  # fmt: skip
    return {"quant_method": "gptq", "bits": 4, "group_size": opt["group"], "desc_act": False,
            "sym": opt.get("sym", True), "true_sequential": True, "lm_head": False,
            "checkpoint_format": "gptq" if opt.get("v1", True) else "gptq_v2"}  # fmt: skip


def _encode(
    method: str, w: np.ndarray, opt: dict[str, Any]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if method == "fp8":
        return fp8_block(w, opt.get("block", 128))
    if method == "ct-fp8":
        return ct_fp8(w, opt.get("strategy", "channel"))
    if method == "ct-int8":
        return ct_int8(w)
    if method == "awq":
        return awq(w, opt["group"])
    return gptq(w, opt["group"], opt.get("sym", True), opt.get("v1", True))


def make_quantized(src: str, dst: str, method: str, **opt: Any) -> dict[str, np.ndarray]:
    """Write dst: src's model with every layer linear quantized by `method` (fp8, ct-fp8,
    ct-int8, awq, gptq); the LM head and everything else stay float, as the tools leave
    them. Returns the float64 weight each quantized linear stands for, by HF name."""
    shutil.copytree(src, dst)
    files = checkpoint_files(dst)
    ck = Checkpoint(files)
    tensors = {n: np.array(ck.numpy(n)) for n in ck.tensors}
    ck.close()
    for f in files:
        os.remove(f)
    if os.path.exists(os.path.join(dst, "model.safetensors.index.json")):
        os.remove(os.path.join(dst, "model.safetensors.index.json"))
    out: dict[str, np.ndarray] = {}
    truth: dict[str, np.ndarray] = {}
    for name, a in tensors.items():
        base = name[: -len(".weight")]
        if (
            name.startswith("model.layers.")
            and base.endswith(LINEAR_ENDS)
            and name.endswith(".weight")
        ):
            parts, meaning = _encode(method, a.astype(np.float64), opt)
            out.update({f"{base}.{suffix}": t for suffix, t in parts.items()})
            truth[name] = meaning
        else:
            out[name] = a
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(dst, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quant_config(method, **opt)
    with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    return truth


def float_weights(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a float checkpoint, float64."""
    ck = Checkpoint(checkpoint_files(path))
    try:
        return {n: ck.numpy(n).astype(np.float64) for n in ck.tensors}
    finally:
        ck.close()


def config_of(path: str) -> ModelConfig:
    return ModelConfig.from_json(os.path.join(path, "config.json"))
