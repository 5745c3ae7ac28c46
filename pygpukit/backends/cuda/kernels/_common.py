"""Small helpers shared by the launchers."""

from __future__ import annotations

from pygpukit.errors import ShapeError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def row_config(
    cols: int, vec: int, acc_bytes: int = 4, threads: int | None = None
) -> tuple[int, int]:
    """(threads, items) for the one-block-per-row kernels.

    items > 0: each thread holds `items` vectors of the row in registers (one read of the
    input), at most 32 fp32 (16 fp64) values so the kernels' 512-thread launch bound keeps
    them out of local memory; items is a power of two so few variants get compiled.
    items == 0: the looping variant for longer rows. `threads` overrides the block size.
    """
    if threads is not None and (threads % 32 or not 32 <= threads <= 512):
        raise ShapeError(f"block_threads must be a multiple of 32 in [32, 512], got {threads}")
    nvec = cdiv(cols, vec)
    max_items = max(1, (32 if acc_bytes == 4 else 16) // vec)
    if threads is None:
        # Two vectors a thread up to 512 threads: on an H200 a 16384x8192 bf16 RMSNorm ran
        # 131 us at 512 threads x 2 vectors (3 blocks per SM, see rms_norm.cuh) vs 182 us
        # looping at 128 (softmax: 130 vs 193); longer rows then grow the vectors per thread.
        threads = min(512, max(32, round_up(cdiv(nvec, 2), 32)))
    items = pow2_at_least(cdiv(nvec, threads))
    if items > max_items:
        return min(threads, 512), 0
    return threads, items


def positive(op: str, **dims: int) -> None:
    for name, v in dims.items():
        if v < 0:
            raise ShapeError(f"{op}: {name} must be >= 0, got {v}")


def int32_range(op: str, **dims: int) -> None:
    for name, v in dims.items():
        if v >= 2**31:
            raise ShapeError(f"{op}: {name}={v} exceeds the int32 range of this kernel")
