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


def row_config(cols: int, vec: int) -> tuple[int, int]:
    """(threads, items) for the one-block-per-row kernels.

    items > 0: each thread holds `items` vectors of the row in registers (one read of the
    input); items is a power of two so few variants get compiled. items == 0: the looping
    variant for rows too long for registers.
    """
    nvec = cdiv(cols, vec)
    threads = min(256, max(32, round_up(nvec, 32)))
    items = pow2_at_least(cdiv(nvec, threads))
    if items > 8:
        threads = min(1024, round_up(cdiv(nvec, 16), 32))
        items = pow2_at_least(cdiv(nvec, threads))
    if items > 16:
        return 512, 0
    return threads, items


def positive(op: str, **dims: int) -> None:
    for name, v in dims.items():
        if v < 0:
            raise ShapeError(f"{op}: {name} must be >= 0, got {v}")


def int32_range(op: str, **dims: int) -> None:
    for name, v in dims.items():
        if v >= 2**31:
            raise ShapeError(f"{op}: {name}={v} exceeds the int32 range of this kernel")
