"""The CUDA elementwise builder's widened copies (ew.widened_copy), checked without a GPU:
the 8-byte-word layout it returns, applied to a byte buffer with NumPy strides, moves
exactly the bytes the element layout moves (a transposing reshape, a KV-cache store at a
dynamic row, a concat part), and layouts it must not widen are left alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pygpukit.backends.cuda import ew
from pygpukit.backends.cuda.context import contiguous
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import dtypes

BF16, F32, I64 = dtypes.bfloat16, dtypes.float32, dtypes.int64
CAST = ("cast", "bfloat16", ew.COPY)


class _Storage:
    addr = 1 << 20  # 16-byte aligned, as the pool's blocks


def _value(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: Any
           ) -> DeviceValue:  # fmt: skip
    return DeviceValue(_Storage(), shape, strides, offset, dtype)  # type: ignore[arg-type]


def _copy(src: np.ndarray, dst: np.ndarray, shape: tuple[int, ...], in_st: tuple[int, ...],
          in_off: int, out_st: tuple[int, ...], out_off: int, np_dtype: Any) -> None:  # fmt: skip
    """dst[layout] = src[layout] on the raw bytes, strides and offsets in elements."""
    s, d = src.view(np_dtype), dst.view(np_dtype)
    isz = s.itemsize
    a = np.lib.stride_tricks.as_strided(s[in_off:], shape, [st * isz for st in in_st])
    b = np.lib.stride_tricks.as_strided(d[out_off:], shape, [st * isz for st in out_st])
    b[...] = a


def _check(shape: tuple[int, ...], in_st: tuple[int, ...], in_off: int,
           out_st: tuple[int, ...], out_off: int = 0, dtype: Any = BF16,
           dyn: list[tuple[int, Any, int, int]] | None = None, start: int = 0,
           expr: Any = ew.COPY) -> None:  # fmt: skip
    rng = np.random.default_rng(len(shape) + in_off + start)
    nbytes = 1 << 20
    src = rng.integers(0, 256, nbytes, dtype=np.uint8)
    npd = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
    dyn = dyn or []
    wide = ew.widened_copy(expr, [_value(shape, in_st, in_off, dtype)], shape, out_st, dtype,
                           dyn)  # fmt: skip
    assert wide is not None
    wshape, wout, view, wdyn = wide
    assert view.dtype is I64 and wshape[-1] * 8 == shape[-1] * dtype.itemsize
    assert [d[:3] for d in wdyn] == [d[:3] for d in dyn]
    # A dynamic index moves the output by start rows of its stride (the kernel adds
    # start * stride to the operand's offset).
    narrow_off = out_off + sum(start * st for o, _, _, st in dyn if o == -1)
    wide_off = out_off * dtype.itemsize // 8 + sum(start * st for o, _, _, st in wdyn if o == -1)
    want, got = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    _copy(src, want, shape, in_st, in_off, out_st, narrow_off, npd)
    _copy(src, got, wshape, view.strides, view.offset, wout, wide_off, np.int64)
    assert want.any() and np.array_equal(got, want)


def test_transposing_reshape_moves_the_same_bytes() -> None:
    """sdpa's [B, H, T, D] output read as [B, T, H, D] into a contiguous slot."""
    b, h, t, d = 2, 8, 24, 64
    shape = (b, t, h, d)
    _check(shape, (h * t * d, d, t * d, 1), 0, contiguous(shape))
    _check(shape, (h * t * d, d, t * d, 1), 4, contiguous(shape))  # 8 bytes in


def test_cache_store_at_a_dynamic_row_moves_the_same_bytes() -> None:
    """k/v [B, KV, T, D] (a permuted view of the qkv GEMM's rows) stored into the cache
    [B, KV, S, D] at rows pos..pos+T-1, pos read on the device."""
    b, kv, t, d, s, qkv = 2, 4, 16, 64, 80, 2560
    shape = (b, kv, t, d)
    in_st = (t * qkv, d, qkv, 1)
    out_st = (kv * s * d, s * d, d, 1)
    dyn = [(-1, I64, s - t + 1, d)]
    for start in (0, 5, s - t):
        _check(shape, in_st, 2048 + 256, out_st, dyn=dyn, start=start, expr=CAST)


def test_concat_part_and_float32_rows() -> None:
    """A part written at an offset of a wider row (strided output), and float32 (2 per
    word)."""
    _check((6, 16), (16, 1), 0, (48, 1), out_off=16)
    _check((5, 6, 32), (6 * 32, 32, 1), 2, (6 * 64, 64, 1), out_off=32, dtype=F32)


@pytest.mark.parametrize(
    "case",
    [
        # inner dim not unit-stride on the input
        ((4, 8), (1, 4), 0, (8, 1), None),
        # inner dim not a whole number of words
        ((4, 6), (12, 1), 0, (6, 1), None),
        # an outer stride that is not a whole number of words
        ((4, 8), (9, 1), 0, (8, 1), None),
        # the input starts between words
        ((4, 8), (16, 1), 1, (8, 1), None),
        # a dynamic index on the innermost dim
        ((4, 8), (16, 1), 0, (8, 1), [(-1, I64, 4, 1)]),
        # a plain contiguous copy: the element kernel already moves 16 bytes per thread
        ((4, 8), (8, 1), 0, (8, 1), None),
    ],
)
def test_layouts_left_to_the_element_kernel(case: Any) -> None:
    shape, in_st, in_off, out_st, dyn = case
    x = _value(shape, in_st, in_off, BF16)
    assert ew.widened_copy(ew.COPY, [x], shape, out_st, BF16, dyn or []) is None


def test_only_plain_copies_widen() -> None:
    """A cast to another dtype, an expression, two inputs or 8-byte elements stay."""
    shape, in_st, out_st = (4, 8), (16, 1), (8, 1)
    x = _value(shape, in_st, 0, BF16)
    assert ew.widened_copy(("cast", "float32", ew.COPY), [x], shape, out_st, F32, []) is None
    assert ew.widened_copy(("neg", ew.COPY), [x], shape, out_st, BF16, []) is None
    assert ew.widened_copy(ew.COPY, [x, x], shape, out_st, BF16, []) is None
    y = _value(shape, in_st, 0, I64)
    assert ew.widened_copy(ew.COPY, [y], shape, out_st, I64, []) is None
    assert ew.widened_copy(CAST, [x], shape, out_st, BF16, []) is not None
