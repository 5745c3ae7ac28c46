"""Launchers for attention_prefill.cuh and attention_decode.cuh."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import cdiv, positive

DTYPES = ("float32", "float16", "bfloat16")
HEAD_DIMS = (64, 128)

# attention_prefill.cuh geometry
_P_WARPS, _P_ROWS, _P_KEYS = 4, 8, 32
# attention_decode.cuh geometry: CUDA-core kernel, tensor-core kernel
_D_THREADS, _D_TILE = 256, 64
_M_WARPS, _M_TILE = 4, 32


def _check(op: str, dtype: str, heads: int, kv_heads: int, head_dim: int) -> None:
    loader.check_dtype(dtype, DTYPES, op)
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"{op}: head_dim must be 64 or 128, got {head_dim}")
    if kv_heads <= 0 or heads % kv_heads:
        raise ShapeError(f"{op}: kv_heads={kv_heads} must divide heads={heads}")


def prefill(
    q: int,
    k: int,
    v: int,
    o: int,
    batch: int,
    heads: int,
    kv_heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    dtype: str,
    *,
    scale: float | None = None,
    causal: bool = True,
    q_strides: tuple[int, int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int, int] | None = None,
    stream: Any = None,
) -> None:
    """O = softmax(scale Q K^T, causal mask aligned bottom-right) V.

    Q, O [B, H, Sq, D]; K, V [B, KVH, Sk, D]; strides (batch, head, seq) in elements,
    default contiguous; scale defaults to 1/sqrt(D).
    """
    _check("attention_prefill", dtype, heads, kv_heads, head_dim)
    positive("attention_prefill", batch=batch, seq_q=seq_q, seq_k=seq_k)
    d = head_dim
    qs = q_strides or (heads * seq_q * d, seq_q * d, d)
    ks = k_strides or (kv_heads * seq_k * d, seq_k * d, d)
    vs = v_strides or (kv_heads * seq_k * d, seq_k * d, d)
    os_ = o_strides or (heads * seq_q * d, seq_q * d, d)
    sc = float(scale) if scale is not None else d**-0.5
    if batch * heads > 65535:
        raise ShapeError("attention_prefill: batch * heads exceeds 65535")
    if batch == 0 or seq_q == 0:
        return
    defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_ROWS": _P_ROWS}
    fn = loader.get_function("attention_prefill", "pgk_attention_prefill", defines)
    aq = _P_WARPS * _P_ROWS
    smem = 4 * (aq * d + _P_KEYS * (d + 1) + _P_KEYS * d)
    loader.set_dynamic_smem(fn, smem)
    fn.launch(
        (cdiv(seq_q, aq), batch * heads),
        (_P_WARPS * 32,),
        "PPPPiiiifi" + "q" * 12,
        (q, k, v, o, heads, kv_heads, seq_q, seq_k, sc, int(causal), *qs, *ks, *vs, *os_),
        smem,
        stream,
    )


def decode_group(heads: int, kv_heads: int) -> int:
    """Query heads one decode block serves (PGK_G): the whole GQA group up to 16."""
    g = heads // kv_heads
    if g <= 16:
        return g
    for cand in (16, 8, 4, 2, 1):
        if g % cand == 0:
            return cand
    return 1


def _use_mma(dtype: str) -> bool:
    return dtype in loader.HALF_DTYPES


def decode_splits(
    batch: int, heads: int, kv_heads: int, max_seq: int, dtype: str = "bfloat16"
) -> int:
    """Splits of the context per kv head, so the blocks fill the SMs about once.

    The tensor-core path (bf16/f16) runs one block per SM; rounding down keeps the grid
    at or under one full wave (160 blocks on 132 SMs would take two waves' time)."""
    blocks = batch * kv_heads * ((heads // kv_heads) // decode_group(heads, kv_heads))
    sms = loader.sm_count()
    tile = _M_TILE if _use_mma(dtype) else _D_TILE
    want = max(1, sms // blocks) if _use_mma(dtype) else cdiv(sms, blocks)
    return max(1, min(cdiv(max_seq, tile), want))


def decode_workspace_bytes(batch: int, heads: int, splits: int, head_dim: int) -> int:
    """Float workspace for the partial outputs and (max, sum) pairs of every split."""
    return 4 * batch * heads * splits * (head_dim + 2)


def _decode_smem(dtype: str, g: int, d: int, stages: int) -> int:
    size = loader.itemsize(dtype)
    vec = 16 // size
    header = (g * d + g * _D_TILE + g) * 4
    header = cdiv(header, 16) * 16
    stage = _D_TILE * ((d + vec) + d) * size
    streams = _D_THREADS // (d // vec)
    red = streams * g * d * 4
    return header + max(stages * stage, red)


def _decode_mma_smem(d: int, stages: int) -> int:
    stage = _M_WARPS * stages * 2 * _M_TILE * (d + 8) * 2
    merge = _M_WARPS * (16 * d + 32) * 4
    return max(stage, merge)


def decode(
    q: int,
    k_cache: int,
    v_cache: int,
    ctx_len: int,
    o: int,
    workspace: int,
    batch: int,
    heads: int,
    kv_heads: int,
    max_seq: int,
    head_dim: int,
    dtype: str,
    *,
    splits: int,
    scale: float | None = None,
    q_strides: tuple[int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int] | None = None,
    stream: Any = None,
) -> None:
    """One decode step: o[b, h] = softmax(scale q[b, h] K^T) V over keys [0, *ctx_len).

    q, o: [B, H, D] (strides batch, head); caches [B, KVH, max_seq, D] (strides batch, head,
    seq). ctx_len: device pointer to an int32 (<= max_seq), read by the kernels, so a
    captured graph replays for every step. workspace: decode_workspace_bytes(...) bytes;
    splits: decode_splits(...) (fixed for a captured graph).
    """
    _check("attention_decode", dtype, heads, kv_heads, head_dim)
    positive("attention_decode", batch=batch, max_seq=max_seq, splits=splits)
    if splits < 1:
        raise ShapeError("attention_decode: splits must be >= 1")
    d = head_dim
    vec = 16 // loader.itemsize(dtype)
    qst = q_strides or (heads * d, d)
    kst = k_strides or (kv_heads * max_seq * d, max_seq * d, d)
    vst = v_strides or (kv_heads * max_seq * d, max_seq * d, d)
    ost = o_strides or (heads * d, d)
    if any(s % vec for s in (*kst, *vst)) or k_cache % 16 or v_cache % 16:
        raise ShapeError("attention_decode: K/V caches need 16-byte aligned rows")
    if batch == 0:
        return
    g = decode_group(heads, kv_heads)
    group = heads // kv_heads
    budget = loader.max_shared_optin()
    sc = float(scale) if scale is not None else d**-0.5
    ml = workspace + 4 * batch * heads * splits * d
    grid = (splits, kv_heads * (group // g), batch)
    args = (q, k_cache, v_cache, ctx_len, workspace, ml, heads, group, sc, *qst, *kst, *vst)
    fmt = "PPPPPPiif" + "q" * 8
    if _use_mma(dtype):
        if any(s % 2 for s in qst) or q % 4:
            raise ShapeError("attention_decode: q rows must be 4-byte aligned")
        stages = 2 if _decode_mma_smem(d, 2) <= budget else 1
        smem = _decode_mma_smem(d, stages)
        defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_G": g, "PGK_MSTAGES": stages}
        split_fn = loader.get_function("attention_decode", "pgk_attn_decode_mma", defines)
        threads = _M_WARPS * 32
    else:
        stages = 4
        while stages > 1 and _decode_smem(dtype, g, d, stages) > budget:
            stages -= 1
        smem = _decode_smem(dtype, g, d, stages)
        defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_G": g, "PGK_STAGES": stages}
        split_fn = loader.get_function("attention_decode", "pgk_attn_decode_split", defines)
        threads = _D_THREADS
    if smem > budget:
        raise ShapeError(
            f"attention_decode: needs {smem} bytes of shared memory, the device has {budget}"
        )
    reduce_fn = loader.get_function("attention_decode", "pgk_attn_decode_reduce", defines)
    loader.set_dynamic_smem(split_fn, smem)
    split_fn.launch(grid, (threads,), fmt, args, smem, stream)
    reduce_fn.launch(
        (heads, batch), (d,), "PPPiiqq", (workspace, ml, o, heads, splits, *ost), 0, stream
    )
