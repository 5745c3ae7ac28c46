"""Launcher for paged_decode.cuh: split-K attention through per-row block tables, on
tensor cores for the serving step's decode rows (bf16 / f16, one query a row), else on
CUDA cores."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from .. import toolchain
from ..codegen.prelude import ERR_INDEX
from . import attention, loader
from ._common import cdiv

DTYPES = attention.DTYPES
HEAD_DIMS = attention.HEAD_DIMS
THREADS = 256  # PGK_DT in attention_decode.cuh
TILE = 64  # PGK_TK: keys per tile
MMA_WARPS = 4  # PGK_MW in attention_decode.cuh: warps of a tensor-core block
MMA_TILE = 32  # PGK_MTK: keys of a warp's tile
MAX_MMA_STAGES = 3  # cp.async stages a warp of the tensor-core body streams through
MAX_Z = 65535  # grid.z: rows x queries


def supports(dtype: str, head_dim: int, heads: int, kv_heads: int, rows: int, n_q: int) -> bool:
    """Whether the kernel takes this shape (else the simple paged kernel runs)."""
    return (dtype in DTYPES and head_dim in HEAD_DIMS and kv_heads > 0
            and heads % kv_heads == 0 and 0 < rows * n_q <= MAX_Z)  # fmt: skip


def uses_mma(dtype: str, n_q: int) -> bool:
    """Whether the launch runs the tensor-core body (pgk_paged_decode_mma): bf16 / f16
    with one query a row, the serving step's decode rows (q rows 4-byte aligned, which
    attend checks at launch; else the CUDA-core body takes it with the same splits)."""
    return dtype in loader.HALF_DTYPES and n_q == 1


def splits_for(rows: int, heads: int, kv_heads: int, n_q: int, max_keys: int,
               sm_count: int, dtype: str) -> int:  # fmt: skip
    """Splits of each row's keys, so the blocks fill the SMs about once: several only for
    one query per row (a decode step), at most one tile of the longest context each.

    Tensor-core body: as attention.decode_splits, one block per SM rounded down (the grid
    stays within one wave) and at most one 32-key tile per warp of a split; the batch-64
    TinyLlama step (256 blocks) runs one split, 20 us a layer on an H200 at 512 keys a row
    (the CUDA-core body's one split: 35 us; docs/kernels.md). CUDA-core body: more splits
    measured slower on an H200 (scripts/graph_profile.py --serve, TinyLlama shape, 512 keys
    a row): aiming at six blocks per SM gave batch 64 four splits instead of one, and its
    attention went from 35 us a layer to 44 us plus a 20 us merge; the one split is
    latency-bound (480 GB/s of keys and values), which is why the tensor-core body exists."""
    if n_q != 1:
        return 1
    g = attention.decode_group(heads, kv_heads)
    blocks = rows * kv_heads * ((heads // kv_heads) // g)
    if uses_mma(dtype, n_q):
        want, cap = sm_count // blocks, cdiv(max_keys, MMA_TILE * MMA_WARPS)
    else:
        want, cap = cdiv(sm_count, blocks), cdiv(max_keys, TILE)
    return max(1, min(want, cap, attention.MAX_SPLITS))


def mma_stages(head_dim: int, blocks: int, tiles: int) -> int:
    """cp.async stages per warp of the tensor-core body: one per tile a warp takes (tiles),
    up to MAX_MMA_STAGES, as many as still fit the blocks on the SMs in one wave, else
    one. The batch-64 TinyLlama step (256 blocks, 512-key rows: four tiles a warp) takes
    three (two blocks of 108 KB an SM: three quarters of a row's keys in flight at once):
    13.4 us a layer against two stages' 15.5 on an H200 (rows of 128-640 keys: 13.2
    against 14.5; 22 layers' pools in a CUDA graph); a 128-wide head's 256 blocks one (a
    wave of three blocks an SM instead of two waves of one). Two splits (512 blocks, two
    waves) took 26 us. Prefetching the block's K / V lines into L2 before the wait (its
    length and table read as a guess) was slower: 14.6 us with three stages, 18.0 at
    128-640 keys. So was filling the stages themselves before the wait, as the dense
    kernel's kv_early does (length, table and piece check read through L2 as a guess and
    checked after the wait, the row's newest key left out and read after it; the serving
    model promising that paged_write stores only that key): 17.9-19.4 us a layer against
    14.0 (H200, batch 64, correct in every case), and the larger body alone (85 KB of code
    against 78, its early part never taken) 15.0-16.4 us. The tile loads' full unroll is
    worth keeping: four or two chunks a lane at a time instead of eight (53 / 41 KB of code)
    took 13.7-14.2 / 14.5 us against 13.6-14.0."""
    sms = toolchain.sm_count()
    smem_sm = int(toolchain.device_info().get("max_shared_per_sm", 228 * 1024))
    per_sm = cdiv(max(blocks, 1), sms)
    for st in range(min(max(tiles, 1), MAX_MMA_STAGES), 1, -1):
        need = attention._decode_mma_smem(head_dim, st)
        if need <= loader.max_shared_optin() and per_sm * (need + 1024) <= smem_sm:
            return st
    return 1


def row_grid(rows: int, decode_rows: int | None) -> int:
    """Block rows of a tensor-core launch with prompt pieces and one split: decode_rows
    (at least one) where fewer than rows, else a block row a row (pgk_paged_decode_mma's
    row loop). The 1024-token serving step of 64 decode rows had launched 4096 blocks, 3840
    of them finding a piece's row and leaving (six waves beside the piece kernel; Nsight
    Compute, H200). With 96 block rows and one cp.async stage (attend: the piece kernel
    runs beside it), and the piece kernel's longest blocks first, the engine's mixed steps
    (64 decode rows, H200, three rounds) took 2.58 ms at 512 tokens against 2.87 and 4.29
    at 1024 against 4.52; two stages held the shared memory the piece kernel's blocks
    waited for (2.70 / 4.32)."""
    return rows if decode_rows is None else max(1, min(rows, decode_rows))


def mma_tiles(max_keys: int, splits: int) -> int:
    """PGK_MTK-key tiles the busiest warp of a split streams (a split's keys, rounded up
    to whole tiles, dealt over PGK_MW warps)."""
    return cdiv(cdiv(max(max_keys, 1), splits), MMA_TILE * MMA_WARPS)


def workspace_floats(rows: int, heads: int, splits: int, head_dim: int) -> int:
    """Float workspace the splits' partials and (max, sum) pairs take (0 with one split)."""
    return attention.decode_workspace_bytes(rows, heads, splits, head_dim) // 4


def _defines(dtype: str, head_dim: int, g: int, stages: int, mma: bool, rope: bool = False,
             append: bool = False, slot64: bool = False,
             kv_early: bool = False) -> dict[str, object]:  # fmt: skip
    key = "PGK_MSTAGES" if mma else "PGK_STAGES"
    d: dict[str, object] = {**loader.type_defines(dtype), "PGK_D": head_dim, "PGK_G": g,
                            key: stages, "PGK_ERR_INDEX": ERR_INDEX}  # fmt: skip
    if rope:
        d["PGK_QROPE"] = 1
    if append:
        d["PGK_PAPPEND"] = 1
        if slot64:
            d["PGK_PSLOT"] = "long long"
        if kv_early:
            d["PGK_KVEARLY"] = 1
    return d


def mma_fits(dtype: str, n_q: int, q: int, q_strides: tuple[int, ...]) -> bool:
    """Whether attend runs the tensor-core body on these q operands (uses_mma, q rows in
    4-byte pairs): the body that can rotate q as it reads it (attend's rope)."""
    return uses_mma(dtype, n_q) and q % 4 == 0 and all(x % 2 == 0 for x in q_strides[:2])


def rope_fits(cos: int, sin: int, row_stride: int) -> bool:
    """Whether rope tables (cos, sin, row stride in elements; unit inner stride) suit the
    kernels' pair loads: 4-byte aligned rows."""
    return cos % 4 == 0 and sin % 4 == 0 and row_stride % 2 == 0


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
    pool_block_stride: int | None = None,
    rope: tuple[int, int, int] | None = None,
    append: tuple[int, int, int, int] | None = None,
    append_slot64: bool = False,
    decode_rows: int | None = None,
    kv_early: bool = False,
    stream: Any = None,
) -> None:
    """out[b, h, i] = softmax(scale q[b, h, i] . k[j], j <= lens[b] - n_q + i) @ v[j], keys
    read through table[b] (int32) from pools [n_blocks, kv_heads, block_size, head_dim]
    whose blocks are pool_block_stride elements apart (default kv_heads * block_size *
    head_dim: contiguous pools; the key and value halves of one pool: twice that).

    q strides (row, head, query) in elements, head_dim contiguous; out [rows, heads, n_q,
    head_dim] contiguous; splits from splits_for (one unless n_q == 1), with several a
    16-byte aligned workspace of workspace_floats floats. pieces (one query per row): the
    rows of prompt pieces are left to paged_prefill.attend, launched right after this.
    rope (cos, sin, row stride): q[b] is attended rotated (half-split, as the rope op) by
    table row b of cos / sin [rows, head_dim / 2] (q's dtype, unit inner stride,
    rope_fits); the tensor-core body only (mma_fits). append (new_kv, its row stride in
    elements, slots, their stride; with rope, one query a row, the tensor-core body, no
    pieces): each row's new key, rotated by its tables, and value (new_kv [rows, 2
    kv_heads, head_dim], head_dim contiguous: keys, then values) are stored at slot
    slots[b] (int32, or int64 with append_slot64; negative: none) of the pools first, as
    paged_write would, and attended with the rest. decode_rows (with pieces, one split, the
    tensor-core body): how many rows can be other than prompt pieces (the serving step's
    decode rows and the prompts it finishes in one token); the grid then has that many
    block rows, each taking every decode_rows-th row (row_grid). A hint: any row that is
    not a piece is still attended, by the block row it falls to. kv_early (with append, a
    captured step whose pools no other launch of the graph writes): each block fills its
    first stages before the programmatic-launch wait, over the length and table entries
    read as a guess and checked after it."""
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
    p_sb = kv_heads * block_size * head_dim if pool_block_stride is None else pool_block_stride
    if p_sb < kv_heads * block_size * head_dim:
        raise ShapeError(f"paged_decode: pool blocks {p_sb} elements apart overlap (a block "
                         f"holds {kv_heads * block_size * head_dim})")  # fmt: skip
    g = attention.decode_group(heads, kv_heads)
    group = heads // kv_heads
    ml = workspace + 4 * rows * heads * splits * head_dim if splits > 1 else 0
    # The tensor-core body reads q in 4-byte pairs.
    mma = mma_fits(dtype, n_q, q, q_strides)
    z = row_grid(rows, decode_rows) if pieces and mma and splits == 1 else rows * n_q
    grid = (splits, kv_heads * (group // g), z)
    if rope is not None and not (mma and rope_fits(*rope)):
        raise ShapeError(f"paged_decode: rotating q needs the tensor-core body (bf16 / f16, "
                         f"one query a row, 4-byte aligned q and tables), got {dtype} with "
                         f"{n_q} queries a row")  # fmt: skip
    if append is not None and (rope is None or pieces):
        raise ShapeError("paged_decode: storing the new rows (append) needs rope tables and "
                         "no prompt pieces")  # fmt: skip
    cs, sn, cs_s = rope if rope is not None else (0, 0, 0)
    if mma:
        tiles = mma_tiles(max_blocks * block_size, splits)
        # A step that expects pieces (decode_rows given): one stage beside the piece kernel,
        # which runs alongside it (inputs_early); more held the shared memory the piece
        # kernel's blocks wait for (row_grid).
        hinted = pieces and decode_rows is not None
        st = 1 if hinted else mma_stages(head_dim, grid[0] * grid[1] * grid[2], tiles)
        smem = attention._decode_mma_smem(head_dim, st)
        name, threads = "pgk_paged_decode_mma", MMA_WARPS * 32
        args: tuple[Any, ...] = (q, k_pool, v_pool, table, lens, workspace, ml, out, heads,
                                 group, kv_heads, block_size, n_blocks, max_blocks, p_sb,
                                 float(scale), *q_strides[:2], *table_strides, lens_stride,
                                 err, tag, int(pieces), cs, sn, cs_s,
                                 *(append or (0, 0, 0, 0)), rows)  # fmt: skip
    else:
        budget = loader.max_shared_optin()
        st = 4
        while st > 1 and attention._decode_smem(dtype, g, head_dim, st) > budget:
            st -= 1
        smem = attention._decode_smem(dtype, g, head_dim, st)
        name, threads = "pgk_paged_decode", THREADS
        args = (q, k_pool, v_pool, table, lens, workspace, ml, out, heads, group, n_q, kv_heads,
                block_size, n_blocks, max_blocks, p_sb, float(scale), *q_strides,
                *table_strides, lens_stride, err, tag, int(pieces))  # fmt: skip
    defines = _defines(dtype, head_dim, g, st, mma, rope is not None, append is not None,
                       append_slot64, kv_early)  # fmt: skip
    fn = loader.get_kernel("paged_decode", name, defines)
    fn.set_dynamic_smem(smem)
    fn.launch(grid, (threads,), args, smem, stream)
    if splits > 1:
        merge = loader.get_kernel(
            "attention_decode",
            "pgk_attn_decode_reduce",
            _defines(dtype, head_dim, g, st, mma, rope is not None),
        )
        merge.launch((heads, rows), (attention._R_THREADS,),
                     (workspace, ml, out, heads, splits, heads * head_dim, head_dim), 0,
                     stream)  # fmt: skip
