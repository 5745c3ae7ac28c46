"""Launcher of attention_flash_sm90.cuh: the Hopper (SM 9.0) flash-attention prefill, wgmma
with Q / K / V tiles brought in by the bulk tensor copy engine through tensor maps made here
(the device pointers are known at launch: a captured graph keeps the maps it was captured
with, as it keeps the pointers)."""

from __future__ import annotations

from typing import Any

from pygpukit import _native
from pygpukit.errors import ShapeError

from .. import toolchain
from . import attention, loader
from ._common import cdiv

FAMILY = "attention_flash_sm90"
KERNEL = "pgk_attention_flash_sm90"
ROWS = 128  # query rows a block (two consumer warpgroups of 64)
KEYS = 128  # keys a tile (PGK_HN)
STAGES = {64: 2, 128: 2}  # K / V stages by head dim (PGK_HSTAGES)
THREADS = 384  # a producer and two consumer warpgroups
_AB = {"bfloat16": "bf16", "float16": "f16"}


def defines(dtype: str, head_dim: int) -> dict[str, Any]:
    """The template defines of one variant."""
    loader.check_dtype(dtype, attention.FLASH_DTYPES, "attention_flash_sm90")
    return {**loader.type_defines(dtype), "PGK_D": head_dim, "PGK_HAB": _AB[dtype],
            "PGK_HN": KEYS, "PGK_HSTAGES": STAGES[head_dim],
            # the kernel's only error: a bad length, as kv_len's code or kv_start's
            "PGK_ERR_INDEX": attention.ERR_KV_LEN}  # fmt: skip


def smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory: Q rows, the K / V stages, 1 KB to align them to the swizzle."""
    return 2 * head_dim * (ROWS + 2 * KEYS * STAGES[head_dim]) + 1024


def available() -> bool:
    """Whether this kernel can run here: an SM 9.0 device (its CUBIN is sm_90a)."""
    return tuple(toolchain.device_info()["compute_capability"]) == (9, 0)


def chosen(head_dim: int) -> bool:
    """Whether the planner takes this kernel over attention_flash.cuh (where both fit):
    on an SM 9.0 device, for the head dims it measured faster (docs/kernels.md)."""
    return head_dim in PREFERRED_HEAD_DIMS and available()


# Head dims where this kernel beat attention_flash.cuh on an H200 (bench sdpa rows, causal
# bf16 B1 H32/KV4 T2048): D128 109.8 us against 136.4; at D64 it lost (78.0 against 72.3,
# B4 T512 35.8 against 29.5): see docs/kernels.md.
PREFERRED_HEAD_DIMS = (128,)


def fits(ptrs: tuple[int, ...], strides: tuple[tuple[int, int, int], ...], o: int,
         o_strides: tuple[int, int, int]) -> bool:  # fmt: skip
    """Whether the kernel takes these operands: attention.flash_fits (tensor maps need
    16-byte aligned bases and strides, which its 16-byte rows give)."""
    return attention.flash_fits(ptrs, strides, o, o_strides)


def _tensor_map(ptr: int, dtype: str, seq: int, heads: int, batch: int,
                strides: tuple[int, int, int], rows: int, head_dim: int) -> bytes:  # fmt: skip
    """A [batch, heads, seq, D] tensor as a 4-d tensor map of 64-column x `rows` boxes in the
    128-byte swizzle. A dim of size one gets a packed stride (its stride is never used)."""
    sb, sh, ss = strides
    ss = ss if seq > 1 else head_dim
    sh = sh if heads > 1 else ss * seq
    sb = sb if batch > 1 else sh * heads
    return _native.tensor_map_tiled(dtype, ptr, [head_dim, seq, heads, batch],
                                    [2 * ss, 2 * sh, 2 * sb], [64, rows, 1, 1])  # fmt: skip


def flash_sm90(
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
    masks: attention.Masks = attention.NO_MASKS,
    q_strides: tuple[int, int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int, int] | None = None,
    kv_batch: int | None = None,
    stream: Any = None,
) -> None:
    """attention.flash() on Hopper's wgmma and bulk tensor copies (SM 9.0 only: available()):
    the same operands, masks and results. kv_batch: the batch extent of K / V (1: one K / V
    shared by every batch row, their batch stride unused), default batch."""
    op = "attention_flash_sm90"
    loader.check_dtype(dtype, attention.FLASH_DTYPES, op)
    given = (q_strides, k_strides, v_strides, o_strides)
    sc, (qs, ks, vs, os_) = attention._prefill_common(op, batch, heads, kv_heads, seq_q, seq_k,
                                                      head_dim, dtype, scale, given)  # fmt: skip
    if not fits((q, k, v), (qs, ks, vs), o, os_):
        raise ShapeError(f"{op}: q, k, v need 16-byte aligned rows and o 4-byte aligned ones")
    kvb = batch if kv_batch is None else kv_batch
    if kvb not in (1, batch):
        raise ShapeError(f"{op}: kv_batch must be 1 or batch={batch}, got {kvb}")
    mask_args = masks.args(op, seq_q, seq_k)
    if batch * heads == 0 or seq_q == 0:
        return
    blocks = cdiv(seq_q, ROWS) * batch * heads
    if blocks >= 2**31:
        raise ShapeError(f"{op}: {blocks} blocks exceed the grid")
    smem = smem_bytes(head_dim)
    if smem > loader.max_shared_optin():
        raise ShapeError(f"{op}: needs {smem} bytes of shared memory, the device has "
                         f"{loader.max_shared_optin()}")  # fmt: skip
    maps = (
        _tensor_map(q, dtype, seq_q, heads, batch, qs, 64, head_dim),
        _tensor_map(k, dtype, seq_k, kv_heads, kvb, ks, KEYS, head_dim),
        _tensor_map(v, dtype, seq_k, kv_heads, kvb, vs, KEYS, head_dim),
    )
    fn = loader.get_kernel(FAMILY, KERNEL, defines(dtype, head_dim))
    fn.set_dynamic_smem(smem)
    args = (*maps, v, *vs, o, heads, kv_heads, kvb, seq_q, seq_k, sc, int(causal), *mask_args, *os_,
            masks.err, masks.tag)  # fmt: skip
    # 1-D grid, heads fastest (the kernel derives the query block and the head).
    fn.launch((blocks,), (THREADS,), args, smem, stream)
