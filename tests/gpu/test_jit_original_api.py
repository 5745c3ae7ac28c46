"""The original project's jit snippet on a GPU: func=, keyword arguments and a 1-D launch
sized from the first array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

SRC = """
extern "C" __global__
void scale(float* x, float factor, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] *= factor;
}
"""


def test_jit_scale_by_keyword(cuda: Any) -> None:
    assert gp.is_cuda_available() and gp.is_nvrtc_available()
    assert gp.get_sm_version() >= 80
    gp.validate_compute_capability()
    xn = np.random.default_rng().standard_normal((37, 129)).astype(np.float32)
    x = gp.from_numpy(xn)
    kernel = gp.jit(SRC, func="scale")
    kernel(x, factor=0.5, n=x.size)
    np.testing.assert_array_equal(x.to_numpy(), xn.astype(np.float64) * 0.5)
    kernel(x, 4.0, x.size, block=(64,))
    np.testing.assert_array_equal(x.to_numpy(), xn.astype(np.float64) * 2.0)
    with pytest.raises(gp.DTypeError, match="points to float32"):
        kernel(x.astype(gp.float16), factor=0.5, n=x.size)
