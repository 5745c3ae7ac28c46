"""Launcher for paged_decode.cuh: split-K attention through per-row block tables."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from ..codegen.prelude import ERR_INDEX
from . import attention, loader
from ._common import cdiv

DTYPES = attention.DTYPES
HEAD_DIMS = attention.HEAD_DIMS
THREADS = 256  # PGK_DT in attention_decode.cuh
TILE = 64  # PGK_TK: keys per tile
MAX_Z = 65535  # grid.z: rows x queries


def supports(dtype: str, head_dim: int, heads: int, kv_heads: int, rows: int, n_q: int) -> bool:
    """Whether the kernel takes this shape (else the simple paged kernel runs)."""
    return (dtype in DTYPES and head_dim in HEAD_DIMS and kv_heads > 0
            and heads % kv_heads == 0 and 0 < rows * n_q <= MAX_Z)  # fmt: skip


def splits_for(rows: int, heads: int, kv_heads: int, n_q: int, max_keys: int,
               sm_count: int) -> int:  # fmt: skip
    """Splits of each row's keys, so the blocks fill the SMs about once: several only for
    one query per row (a decode step), at most one tile of the longest context each.

    More splits measured slower on an H200 (scripts/graph_profile.py --serve, TinyLlama
    shape, 512 keys a row): aiming at six blocks per SM gave batch 64 four splits instead
    of one, and its attention went from 35 us a layer to 44 us plus a 20 us merge (the
    decode step from 2.02 to 2.36 ms, batch 16 from 1.57 to 1.69 ms). The one split is
    latency-bound (480 GB/s of keys and values, 39% of the batch-64 step's kernel time):
    what it needs is a faster body (tensor cores, as pgk_attn_decode_mma), not more
    blocks."""
    if n_q != 1:
        return 1
    g = attention.decode_group(heads, kv_heads)
    blocks = rows * kv_heads * ((heads // kv_heads) // g)
    return max(1, min(cdiv(sm_count, blocks), cdiv(max_keys, TILE), attention.MAX_SPLITS))


def workspace_floats(rows: int, heads: int, splits: int, head_dim: int) -> int:
    """Float workspace the splits' partials and (max, sum) pairs take (0 with one split)."""
    return attention.decode_workspace_bytes(rows, heads, splits, head_dim) // 4


def _defines(dtype: str, head_dim: int, g: int, stages: int) -> dict[str, object]:
    return {**loader.type_defines(dtype), "PGK_D": head_dim, "PGK_G": g, "PGK_STAGES": stages,
            "PGK_ERR_INDEX": ERR_INDEX}  # fmt: skip


def attend(
    q: int,
    k_pool: int,
    v_pool: int,
    table: int,
    lens: int,
    out: int,
    workspace: int,
    *,
    rows: int,
    heads: int,
    kv_heads: int,
    n_q: int,
    head_dim: int,
    block_size: int,
    n_blocks: int,
    max_blocks: int,
    dtype: str,
    splits: int,
    scale: float,
    q_strides: tuple[int, int, int],
    table_strides: tuple[int, int],
    lens_stride: int,
    err: int,
    tag: int,
    pieces: bool = False,
    stream: Any = None,
) -> None:
    """out[b, h, i] = softmax(scale q[b, h, i] . k[j], j <= lens[b] - n_q + i) @ v[j], keys
    read through table[b] (int32) from pools [n_blocks, kv_heads, block_size, head_dim].

    q strides (row, head, query) in elements, head_dim contiguous; out [rows, heads, n_q,
    head_dim] contiguous; splits from splits_for (one unless n_q == 1), with several a
    16-byte aligned workspace of workspace_floats floats. pieces (one query per row): the
    rows of prompt pieces are left to paged_prefill.attend, launched right after this."""
    if not supports(dtype, head_dim, heads, kv_heads, rows, n_q):
        raise ShapeError(f"paged_decode: unsupported shape (dtype {dtype}, head_dim {head_dim}, "
                         f"heads {heads}/{kv_heads}, rows {rows} x {n_q} queries)")  # fmt: skip
    if splits > 1 and (n_q != 1 or not workspace or workspace % 16):
        raise ShapeError(f"paged_decode: {splits} splits need one query per row and a 16-byte "
                         f"aligned workspace")  # fmt: skip
    if pieces and n_q != 1:
        raise ShapeError(f"paged_decode: prompt pieces need one query per row, got {n_q}")
    if k_pool % 16 or v_pool % 16:
        raise ShapeError("paged_decode: the pools need 16-byte aligned rows")
    g = attention.decode_group(heads, kv_heads)
    group = heads // kv_heads
    budget = loader.max_shared_optin()
    st = 4
    while st > 1 and attention._decode_smem(dtype, g, head_dim, st) > budget:
        st -= 1
    smem = attention._decode_smem(dtype, g, head_dim, st)
    defines = _defines(dtype, head_dim, g, st)
    fn = loader.get_kernel("paged_decode", "pgk_paged_decode", defines)
    fn.set_dynamic_smem(smem)
    ml = workspace + 4 * rows * heads * splits * head_dim if splits > 1 else 0
    grid = (splits, kv_heads * (group // g), rows * n_q)
    fn.launch(grid, (THREADS,),
              (q, k_pool, v_pool, table, lens, workspace, ml, out, heads, group, n_q, kv_heads,
               block_size, n_blocks, max_blocks, float(scale), *q_strides, *table_strides,
               lens_stride, err, tag, int(pieces)), smem, stream)  # fmt: skip
    if splits > 1:
        merge = loader.get_kernel("attention_decode", "pgk_attn_decode_reduce", defines)
        merge.launch((heads, rows), (attention._R_THREADS,),
                     (workspace, ml, out, heads, splits, heads * head_dim, head_dim), 0,
                     stream)  # fmt: skip
