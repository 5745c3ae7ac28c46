"""dequant.vector_bytes: the widest load of W the vector kernel takes for a weight at given
addresses (no GPU: the rule alone; tests/gpu/test_dequant.py runs each width)."""

from __future__ import annotations

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
