"""Launchers for attention_prefill.cuh, attention_flash.cuh, attention_decode.cuh and
attention_lengths.cuh."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pygpukit.errors import ShapeError

from .. import toolchain
from ..codegen.prelude import ERR_INDEX, ERR_KV_LEN, ERR_KV_START
from . import loader
from ._common import cdiv, positive

DTYPES = ("float32", "float16", "bfloat16")
APPEND_DTYPES = ("float16", "bfloat16")  # the tensor-core decode kernel's append mode
HEAD_DIMS = (64, 128)

# attention_prefill.cuh geometry
_P_WARPS, _P_ROWS, _P_KEYS = 4, 8, 32
# attention_decode.cuh geometry: CUDA-core kernel, tensor-core kernel
_D_THREADS, _D_TILE = 256, 64
_M_WARPS, _M_TILE = 4, 32
_R_THREADS = 256  # the merge kernel (PGK_RT)


@dataclass(frozen=True)
class Append:
    """Decode attention's append mode (attention_decode.cuh, PGK_APPEND): new key/value rows
    [B, KV, D] at k_new / v_new (batch, head strides in elements), the position as a device
    int32 or int64 (read through its low word) and the rope table row (cos, sin: D/2 elements
    of cs_dtype) when rope is "half" or "interleaved". A bad position is reported through
    decode's error word."""

    k_new: int
    v_new: int
    k_strides: tuple[int, int]
    v_strides: tuple[int, int]
    pos: int
    rope: str = "none"
    cos: int = 0
    sin: int = 0
    cs_dtype: str = "float32"

    def defines(self) -> dict[str, Any]:
        layouts = {"none": 0, "half": 1, "interleaved": 2}
        if self.rope not in layouts:
            raise ShapeError(f"attention_decode: rope must be one of {list(layouts)}")
        out: dict[str, Any] = {"PGK_APPEND": 1, "PGK_ROPE": layouts[self.rope]}
        if self.rope != "none":
            out["PGK_CS"] = loader.ctype(self.cs_dtype)
        return out


def _check(op: str, dtype: str, heads: int, kv_heads: int, head_dim: int) -> None:
    loader.check_dtype(dtype, DTYPES, op)
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"{op}: head_dim must be 64 or 128, got {head_dim}")
    if kv_heads <= 0 or heads % kv_heads:
        raise ShapeError(f"{op}: kv_heads={kv_heads} must divide heads={heads}")


@dataclass(frozen=True)
class Masks:
    """Prefill attention's masks beyond causal: kv_len (device pointer to a 0-d int32 /
    int64, 0 = none: keys at or past it hidden, the causal diagonal aligned so the last
    query sits at key kv_len - 1), kv_start (device pointer to [B] int32 / int64 first
    visible keys, element stride kv_start_stride, 0 = none), window (> 0: query i sees only
    keys j > i + kv_len - seq_q - window; 0 = none), and the error word and tag a kv_len or
    kv_start outside [0, seq_k] is reported with (err 0: not reported, only clamped)."""

    kv_len: int = 0
    kv_len_dtype: str = "int32"
    kv_start: int = 0
    kv_start_stride: int = 1
    kv_start_dtype: str = "int32"
    window: int = 0
    err: int = 0
    tag: int = 0

    def args(self, op: str, seq_q: int, seq_k: int) -> tuple[Any, ...]:
        """(window, kv_len, kv_start, kvs_stride, kv_wide) as the kernels take them."""
        for name, dt in (("kv_len", self.kv_len_dtype), ("kv_start", self.kv_start_dtype)):
            if dt not in ("int32", "int64"):
                raise ShapeError(f"{op}: {name} must be int32 or int64, got {dt}")
        if self.window < 0:
            raise ShapeError(f"{op}: window must be positive (0 = none), got {self.window}")
        # A window wider than any query-key distance hides nothing; keep it an int32.
        window = min(self.window, seq_q + seq_k + 1)
        wide = int(self.kv_len_dtype == "int64") | 2 * int(self.kv_start_dtype == "int64")
        return (window, self.kv_len, self.kv_start, self.kv_start_stride, wide)


NO_MASKS = Masks()


def _prefill_common(op: str, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int,
                    head_dim: int, dtype: str, scale: float | None,
                    strides: tuple[tuple[int, int, int] | None, ...]
                    ) -> tuple[float, tuple[tuple[int, int, int], ...]]:  # fmt: skip
    _check(op, dtype, heads, kv_heads, head_dim)
    positive(op, batch=batch, seq_q=seq_q, seq_k=seq_k)
    if batch * heads > 65535:
        raise ShapeError(f"{op}: batch * heads exceeds 65535")
    if max(seq_q, seq_k) >= 2**30:
        raise ShapeError(f"{op}: seq_q={seq_q} / seq_k={seq_k} exceed the int32 range")
    d = head_dim
    qs, ks, vs, os_ = strides
    full = (
        qs or (heads * seq_q * d, seq_q * d, d),
        ks or (kv_heads * seq_k * d, seq_k * d, d),
        vs or (kv_heads * seq_k * d, seq_k * d, d),
        os_ or (heads * seq_q * d, seq_q * d, d),
    )
    return (float(scale) if scale is not None else d**-0.5), full


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
    masks: Masks = NO_MASKS,
    q_strides: tuple[int, int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int, int] | None = None,
    stream: Any = None,
) -> None:
    """O = softmax(scale Q K^T, causal mask aligned bottom-right, `masks`) V on CUDA cores
    (attention_prefill.cuh; every dtype, the path float32 takes).

    Q, O [B, H, Sq, D]; K, V [B, KVH, Sk, D]; strides (batch, head, seq) in elements,
    default contiguous; scale defaults to 1/sqrt(D).
    """
    op = "attention_prefill"
    given = (q_strides, k_strides, v_strides, o_strides)
    sc, (qs, ks, vs, os_) = _prefill_common(op, batch, heads, kv_heads, seq_q, seq_k,
                                            head_dim, dtype, scale, given)  # fmt: skip
    mask_args = masks.args(op, seq_q, seq_k)
    if batch * heads == 0 or seq_q == 0:
        return
    d = head_dim
    # (the kernel's only error: a bad length, reported as kv_len's code or kv_start's)
    defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_ROWS": _P_ROWS,
               "PGK_ERR_INDEX": ERR_KV_LEN}  # fmt: skip
    fn = loader.get_kernel("attention_prefill", "pgk_attention_prefill", defines)
    aq = _P_WARPS * _P_ROWS
    smem = 4 * (aq * d + _P_KEYS * (d + 1) + _P_KEYS * d)
    fn.set_dynamic_smem(smem)
    args = (q, k, v, o, heads, kv_heads, seq_q, seq_k, sc, int(causal), *mask_args, *qs, *ks,
            *vs, *os_, masks.err, masks.tag)  # fmt: skip
    fn.launch((cdiv(seq_q, aq), batch * heads), (_P_WARPS * 32,), args, smem, stream)


class FlashGeometry(NamedTuple):
    """attention_flash.cuh's block shape: warps (PGK_FW), m16 row tiles a warp (PGK_FR),
    keys a tile (PGK_FN), cp.async stages (PGK_FSTAGES), Q fragments in registers (1) or
    re-read from shared memory (0) (PGK_FQR), and the blocks an SM the register
    allocation leaves room for (PGK_FMINB, __launch_bounds__)."""

    warps: int
    row_tiles: int
    keys: int = 64
    stages: int = 2
    q_regs: int = 1
    min_blocks: int = 1

    @property
    def rows(self) -> int:
        """Query rows a block."""
        return 16 * self.warps * self.row_tiles


# attention_flash.cuh: the geometry by head dim, and the small-grid one (64 rows a block)
# where the default grid would not give every SM a block. Measured on an H200 (causal
# bf16, bench/results/h200-sdpa.json and docs/kernels.md): D64 B1 H32 T2048 4 x 2 with Q in
# registers 72.8 us against 4 x 1 77.9; D128 4 x 2 over 32-key tiles with Q in shared
# memory 136.4 us against 4 x 1 140.9 (4 x 2 with Q in registers spills: 185.7).
FLASH_DTYPES = ("float16", "bfloat16")
FLASH_GEOMETRY = {64: FlashGeometry(4, 2), 128: FlashGeometry(4, 2, keys=32, q_regs=0)}
FLASH_SMALL = FlashGeometry(4, 1)
# The others the benchmark sweeps (and the compile checks cover).
FLASH_SWEEP = (FlashGeometry(4, 1), FlashGeometry(4, 1, min_blocks=4), FlashGeometry(4, 2),
               FlashGeometry(4, 2, q_regs=0), FlashGeometry(8, 1, q_regs=0, min_blocks=2),
               FlashGeometry(4, 2, keys=32, q_regs=0))  # fmt: skip


def flash_geometry(batch: int, heads: int, seq_q: int, head_dim: int) -> FlashGeometry:
    """The block geometry for a launch: FLASH_GEOMETRY's, or FLASH_SMALL when that grid
    would not give every SM a block."""
    geo = FLASH_GEOMETRY[head_dim]
    if batch * heads * cdiv(seq_q, geo.rows) < toolchain.sm_count():
        return FLASH_SMALL
    return geo


def flash_smem(head_dim: int, geometry: FlashGeometry) -> int:
    """Dynamic shared memory of attention_flash.cuh: the stages of a K and a V tile, rows
    padded by 16 bytes, plus the resident Q tile when Q is not kept in registers."""
    row = (head_dim + 8) * 2
    q_tile = 0 if geometry.q_regs else geometry.rows * row
    return geometry.stages * 2 * geometry.keys * row + q_tile


def flash_defines(dtype: str, head_dim: int, geometry: FlashGeometry) -> dict[str, Any]:
    """The template defines of one attention_flash.cuh variant."""
    g = geometry
    return {**loader.type_defines(dtype), "PGK_D": head_dim, "PGK_FW": g.warps,
            "PGK_FR": g.row_tiles, "PGK_FN": g.keys, "PGK_FSTAGES": g.stages,
            "PGK_FQR": g.q_regs, "PGK_FMINB": g.min_blocks,
            # the kernel's only error: a bad length, as kv_len's code or kv_start's
            "PGK_ERR_INDEX": ERR_KV_LEN}  # fmt: skip


def flash_fits(ptrs: tuple[int, ...], strides: tuple[tuple[int, int, int], ...], o: int,
               o_strides: tuple[int, int, int]) -> bool:  # fmt: skip
    """Whether attention_flash.cuh takes these operands: q, k, v rows 16-byte aligned (a
    cp.async moves 8 elements), o rows 4-byte aligned (pairs are stored)."""
    return (
        all(p % 16 == 0 for p in ptrs) and all(x % 8 == 0 for st in strides for x in st)
        and o % 4 == 0 and all(x % 2 == 0 for x in o_strides)
    )  # fmt: skip


def flash(
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
    masks: Masks = NO_MASKS,
    q_strides: tuple[int, int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int, int] | None = None,
    geometry: tuple[int, ...] | None = None,
    stream: Any = None,
) -> None:
    """prefill() on tensor cores (attention_flash.cuh, bf16 / f16): the same operands,
    masks and results. q, k, v need 16-byte aligned rows, o 4-byte aligned ones
    (flash_fits). geometry: a FlashGeometry (or its leading fields as a tuple), default
    flash_geometry(...)."""
    op = "attention_flash"
    loader.check_dtype(dtype, FLASH_DTYPES, op)
    given = (q_strides, k_strides, v_strides, o_strides)
    sc, (qs, ks, vs, os_) = _prefill_common(op, batch, heads, kv_heads, seq_q, seq_k,
                                            head_dim, dtype, scale, given)  # fmt: skip
    if not flash_fits((q, k, v), (qs, ks, vs), o, os_):
        raise ShapeError(f"{op}: q, k, v need 16-byte aligned rows and o 4-byte aligned ones")
    mask_args = masks.args(op, seq_q, seq_k)
    if batch * heads == 0 or seq_q == 0:
        return
    geo = FlashGeometry(*geometry) if geometry else flash_geometry(batch, heads, seq_q, head_dim)
    q_blocks = cdiv(seq_q, geo.rows)
    if q_blocks * batch * heads >= 2**31:
        raise ShapeError(f"{op}: {q_blocks * batch * heads} blocks exceed the grid")
    smem = flash_smem(head_dim, geo)
    if smem > loader.max_shared_optin():
        raise ShapeError(f"{op}: geometry {tuple(geo)} needs {smem} bytes of shared memory, "
                         f"the device has {loader.max_shared_optin()}")  # fmt: skip
    fn = loader.get_kernel("attention_flash", "pgk_attention_flash",
                           flash_defines(dtype, head_dim, geo))  # fmt: skip
    fn.set_dynamic_smem(smem)
    args = (q, k, v, o, heads, kv_heads, seq_q, seq_k, sc, int(causal), *mask_args, *qs, *ks,
            *vs, *os_, masks.err, masks.tag)  # fmt: skip
    # 1-D grid, heads fastest (the kernel derives the query block and the head).
    fn.launch((q_blocks * batch * heads,), (geo.warps * 32,), args, smem, stream)


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


# Splits the merge kernel takes at most (PGK_MAXSPLITS in attention_decode.cuh).
MAX_SPLITS = 256
# The most splits the last split block merges itself (one kernel); above it a separate
# merge kernel spreads the work over every query head. Measured on an H200: see
# docs/kernels.md.
LAST_BLOCK_MERGE_MAX_SPLITS = 0
# Tensor-core decode blocks per SM the split count aims at. Measured on an H200 (B1 and B8,
# ctx 8192): one block per SM with two cp.async stages per warp (139 KB) beat 2-3 blocks
# with one stage (B1 12.8 vs 13.9 us, B8 40.6 vs 42.8-44.2 us).
MMA_BLOCKS_PER_SM = 1


def decode_splits(
    batch: int,
    heads: int,
    kv_heads: int,
    max_seq: int,
    dtype: str = "bfloat16",
    *,
    blocks_per_sm: int | None = None,
) -> int:
    """Splits of the context per kv head, so the blocks fill the SMs about once.

    Tensor-core path (bf16/f16): `blocks_per_sm` blocks per SM (default MMA_BLOCKS_PER_SM),
    rounded down so the grid stays within one wave, and no more splits than give each warp
    one 32-key tile of the cache. CUDA-core path: about one block per SM."""
    blocks = batch * kv_heads * ((heads // kv_heads) // decode_group(heads, kv_heads))
    sms = toolchain.sm_count()
    if _use_mma(dtype):
        per_sm = blocks_per_sm or MMA_BLOCKS_PER_SM
        want = max(1, per_sm * sms // blocks)
        cap = cdiv(max_seq, _M_TILE * _M_WARPS)
    else:
        want = cdiv(sms, blocks)
        cap = cdiv(max_seq, _D_TILE)
    return max(1, min(cap, want, MAX_SPLITS))


def decode_stages(dtype: str, head_dim: int, blocks_per_sm: int | None = None) -> int:
    """cp.async stages per warp of the tensor-core kernel: two (overlap within a warp) when
    they still leave room for the blocks per SM the split count assumes, else one."""
    per_sm = blocks_per_sm or MMA_BLOCKS_PER_SM
    smem_sm = int(toolchain.device_info().get("max_shared_per_sm", 228 * 1024))
    for st in (2,):  # 3 measured no better than 2 on an H200 (B8: 40.8 vs 40.6 us)
        need = _decode_mma_smem(head_dim, st)
        if need <= loader.max_shared_optin() and per_sm * (need + 1024) <= smem_sm:
            return st
    return 1


def decode_workspace_bytes(batch: int, heads: int, splits: int, head_dim: int) -> int:
    """Float workspace for the partial outputs and (max, sum) pairs of every split (none
    with one split: the block writes the output itself)."""
    return 0 if splits == 1 else 4 * batch * heads * splits * (head_dim + 2)


def decode_last_block_merge(splits: int) -> bool:
    """Whether a launch with `splits` should merge in its last block (pass counters) rather
    than in the separate merge kernel (pass none)."""
    return 1 < splits <= LAST_BLOCK_MERGE_MAX_SPLITS


def decode_counters(batch: int, heads: int, kv_heads: int) -> int:
    """uint32 arrival counters a last-block-merge launch needs (one per block row of a kv
    head). Zero them once: every launch leaves them zeroed. Launches that may overlap need
    their own; consecutive launches on one stream may share them."""
    return batch * kv_heads * ((heads // kv_heads) // decode_group(heads, kv_heads))


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
    # The warps' states (PGK_MWS floats each), their weights per head and the heads' sums.
    merge = (_M_WARPS * (16 * (d + 4) + 32) + _M_WARPS * 16 + 16) * 4
    return max(stage, merge)


def _merge_slot(g: int, d: int, threads: int) -> int:
    """Bytes of one split's partial in the last block's merge ring (pgk_dec_merge)."""
    return cdiv(g * d // 4, threads) * threads * 16


def _merge_depth(g: int, d: int, threads: int, main_smem: int) -> int:
    """Splits in flight in the last block's merge (PGK_MP), 2 to 16: the ring takes up to
    half the shared memory the split pass holds (free by then), the rest is left for the
    per-split weights, so the merge rarely raises the block's footprint."""
    return max(2, min(16, (main_smem // 2) // _merge_slot(g, d, threads)))


def _merge_smem(g: int, d: int, threads: int, depth: int, splits: int) -> int:
    return depth * _merge_slot(g, d, threads) + 4 * (2 * g * splits + g)


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
    counters: int = 0,
    scale: float | None = None,
    q_strides: tuple[int, int] | None = None,
    k_strides: tuple[int, int, int] | None = None,
    v_strides: tuple[int, int, int] | None = None,
    o_strides: tuple[int, int] | None = None,
    kv_start: int = 0,
    kv_start_stride: int = 1,
    kv_start_dtype: str = "int32",
    stages: int | None = None,
    append: Append | None = None,
    kv_early: bool = False,
    err: int = 0,
    tag: int = 0,
    stream: Any = None,
) -> None:
    """One decode step in one kernel: o[b, h] = softmax(scale q[b, h] K^T) V over keys
    [kv_start[b], *ctx_len) of the cache.

    q, o: [B, H, D] (strides batch, head); caches [B, KVH, max_seq, D] (strides batch, head,
    seq). ctx_len: device pointer to an int32 or int64 (clamped to [0, max_seq]; 0 = the
    whole cache), read by the kernels, so a captured graph replays for every step.
    err / tag: the error word (0: none) where a ctx_len or kv_start outside [0, max_seq] (or,
    in append mode, a bad position) is recorded, with the step's tag.
    kv_start: optional device pointer to [B] int32/int64 first visible keys (left padding),
    element stride kv_start_stride. A query that sees no key gets zeros.
    splits: decode_splits(...) (fixed for a captured graph). With more than one, workspace
    (decode_workspace_bytes(...) bytes, 16-byte aligned) takes the splits' partials, merged
    by the last split block when counters (decode_counters(...) uint32, zeroed once) are
    given, else by a second kernel (see decode_last_block_merge). With one split neither is
    used. stages: cp.async stages per warp (default decode_stages(...)).
    append (bf16/f16 only): first store this step's key and value at row *pos of the caches,
    rotating the key and q by the table row (Append.rope "half" / "interleaved"), then
    attend (ir op sdpa_append).
    kv_early (tensor-core kernel): the cache rows read were all written before the kernel
    ahead of this launch started (a captured decode step: earlier steps' rows; this step's
    row comes from `append`), so each warp fills its stages before the programmatic-launch
    wait; ctx_len / kv_start are read early as a guess and checked after the wait.
    """
    _check("attention_decode", dtype, heads, kv_heads, head_dim)
    positive("attention_decode", batch=batch, max_seq=max_seq, splits=splits)
    if not 1 <= splits <= MAX_SPLITS:
        raise ShapeError(f"attention_decode: splits must be in [1, {MAX_SPLITS}], got {splits}")
    if splits > 1 and (not workspace or workspace % 16 or counters % 4):
        raise ShapeError(
            f"attention_decode: splits={splits} needs a 16-byte aligned workspace (and "
            f"4-byte aligned counters), got workspace={workspace:#x} counters={counters:#x}"
        )
    if kv_start_dtype not in ("int32", "int64"):
        raise ShapeError(f"attention_decode: kv_start must be int32 or int64, got {kv_start_dtype}")
    if max_seq >= 2**31:
        raise ShapeError(f"attention_decode: max_seq={max_seq} exceeds the int32 range")
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
    ml = workspace + 4 * batch * heads * splits * d if splits > 1 else 0
    # int64 scalars are read through their low 32-bit word (little-endian).
    kvs = kv_start_stride * (2 if kv_start_dtype == "int64" else 1)
    grid = (splits, kv_heads * (group // g), batch)
    args: tuple[Any, ...] = (q, k_cache, v_cache, ctx_len, workspace, ml, heads, group, sc,
                             *qst, *kst, *vst, kv_start, kvs, max_seq, o, *ost,
                             counters)  # fmt: skip
    if append is not None and not _use_mma(dtype):
        raise ShapeError(f"attention_decode: append takes bfloat16 or float16, got {dtype}")
    if _use_mma(dtype):
        if any(s % 2 for s in qst) or q % 4:
            raise ShapeError("attention_decode: q rows must be 4-byte aligned")
        st = stages or decode_stages(dtype, d)
        smem = _decode_mma_smem(d, st)
        defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_G": g, "PGK_MSTAGES": st}
        name, threads = "pgk_attn_decode_mma", _M_WARPS * 32
        ap = append or Append(0, 0, (0, 0), (0, 0), 0)
        if append is not None:
            defines.update(append.defines())
        args += (ap.k_new, ap.v_new, *ap.k_strides, *ap.v_strides, ap.pos, ap.cos, ap.sin,
                 err, tag, int(kv_early))  # fmt: skip
    else:
        st = 4
        while st > 1 and _decode_smem(dtype, g, d, st) > budget:
            st -= 1
        smem = _decode_smem(dtype, g, d, st)
        defines = {**loader.type_defines(dtype), "PGK_D": d, "PGK_G": g, "PGK_STAGES": st}
        name, threads = "pgk_attn_decode_split", _D_THREADS
        args += (err, tag)
    defines["PGK_ERR_INDEX"], defines["PGK_ERR_KV_LEN"] = ERR_INDEX, ERR_KV_LEN
    depth = _merge_depth(g, d, threads, smem)
    defines["PGK_MP"] = depth
    if splits > 1 and counters:
        smem = max(smem, _merge_smem(g, d, threads, depth, splits))
    if smem > budget:
        raise ShapeError(
            f"attention_decode: needs {smem} bytes of shared memory, the device has {budget}"
        )
    fn = loader.get_kernel("attention_decode", name, defines)
    fn.set_dynamic_smem(smem)
    fn.launch(grid, (threads,), args, smem, stream)
    if splits > 1 and not counters:
        reduce_fn = loader.get_kernel("attention_decode", "pgk_attn_decode_reduce", defines)
        reduce_fn.launch(
            (heads, batch), (_R_THREADS,), (workspace, ml, o, heads, splits, *ost), 0, stream
        )


# Every integer dtype a length may have, by its C type (int16 has no template storage type).
_LENGTH_CTYPES = {"int8": "signed char", "uint8": "unsigned char", "int16": "short",
                  "int32": "int", "int64": "long long"}  # fmt: skip
LENGTH_DTYPES = tuple(_LENGTH_CTYPES)


def length_ctype(dtype: str) -> str:
    """The C type of a length of this integer dtype in attention_lengths.cuh."""
    return _LENGTH_CTYPES[dtype]


def check_lengths(
    values: int, n: int, stride: int, extent: int, dtype: str, *, err: int, tag: int,
    start: bool = False, stream: Any = None,
) -> None:  # fmt: skip
    """Report (through the error word at err) any of the n device integers at values
    (element stride `stride`) outside [0, extent]: a kv_len or kv_start the unfused
    attention path would otherwise clamp; `start`: they are kv_start values, not kv_len."""
    loader.check_dtype(dtype, LENGTH_DTYPES, "attention lengths")
    if n <= 0:
        return
    defines = {"PGK_IDX": length_ctype(dtype)}
    fn = loader.get_kernel("attention_lengths", "pgk_attention_check_lengths", defines)
    code = ERR_KV_START if start else ERR_KV_LEN
    fn.launch((1,), (min(256, cdiv(n, 32) * 32),), (values, n, stride, extent, err, tag, code),
              0, stream)  # fmt: skip
