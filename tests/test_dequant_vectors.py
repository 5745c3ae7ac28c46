"""dequant.vector_bytes: the widest load of W the vector kernel takes for a weight at given
addresses, and dequant.row_divider: the multiply that stands for the kernel's division of a
vector index by the vectors a row (no GPU: the rules alone; tests/gpu/test_dequant.py runs
each width)."""

from __future__ import annotations

import numpy as np
import pytest

from pygpukit.backends.cuda.kernels import dequant
from pygpukit.ir.quant import QuantSpec

A = 1 << 24  # a 16-byte aligned address


@pytest.mark.parametrize(
    ("spec", "k", "dtype", "w", "out", "want"),
    [
        (QuantSpec("int8"), 4096, "bfloat16", A, A, 8),  # 16 bytes out
        (QuantSpec("int8"), 4096, "float32", A, A, 4),  # 16 bytes out
        (QuantSpec("int8"), 1000, "bfloat16", A, A, 8),
        (QuantSpec("fp8"), 516, "float16", A, A, 4),  # K % 8 == 4
        (QuantSpec("fp8"), 77, "bfloat16", A, A, 0),  # odd K
        (QuantSpec("fp8", block=128), 4096, "bfloat16", A + 4, A, 4),  # W off the grid
        (QuantSpec("int8"), 4096, "bfloat16", A, A + 8, 4),  # out 8-byte aligned
        (QuantSpec("int8"), 4096, "bfloat16", A, A + 4, 0),
        (QuantSpec("int4", group=128), 4096, "bfloat16", A, A, 4),  # 8 elements
        (QuantSpec("int4", group=128), 4096, "float32", A, A, 4),  # 32 bytes out: narrowest
        (QuantSpec("int4", group=8, has_zero=True), 4096, "float16", A, A, 4),
        (QuantSpec("int4", group=4), 4096, "bfloat16", A, A, 0),  # group under 8
    ],
)
def test_widest_vector_the_layout_allows(spec, k, dtype, w, out, want):
    assert dequant.vector_bytes(spec, k, dtype, w, out) == want


D = [1, 2, 3, 7, 128, 344, 512, 1376, 2752, 4095, (1 << 30) + 1, (1 << 31) - 1]


@pytest.mark.parametrize("d", D)
def test_row_divider_divides_every_vector_index(d):
    """(i * magic) >> (31 + shift) is i // d at the ends of the int32 range, around every
    multiple of d near them, and at random i (Python integers: exact)."""
    rng = np.random.default_rng(d)
    magic, shift = dequant.row_divider(d)
    assert 0 < magic < 1 << 32
    near = [m * d + e for m in (1, 2, 3, ((1 << 31) - 1) // d) for e in (-1, 0, 1)]
    ends = list(range(0, 4096)) + list(range((1 << 31) - 4096, 1 << 31))
    picks = [int(x) for x in rng.integers(0, 1 << 31, 20000)]
    for i in (x for x in near + ends + picks if 0 <= x < 1 << 31):
        assert (i * magic) >> (31 + shift) == i // d, i
