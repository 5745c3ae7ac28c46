"""sdpa with a sequence-major output (passes/sdpa_seq_major.py) on the GPU: the flash
kernels (bf16 / f16, head dims 64 and 128: mma.sync, and wgmma on SM 9.0) and the
CUDA-core kernel (float32) store each row through the output strides, a head dim the
fused kernels lack (32: the padded path) runs heads-major into scratch and is swapped;
against the float64 reference, lazily and compiled, with device kv_len / kv_start."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from attention_ref import sdpa_ref
from helpers import rand

import pygpukit as gpk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


def _merged(q: Any, k: Any, v: Any, kv_len: Any, kv_start: Any) -> Any:
    o = gpk.nn.scaled_dot_product_attention(q, k, v, is_causal=True, kv_len=kv_len,
                                            kv_start=kv_start)  # fmt: skip
    b, _, t, _ = q.shape
    return o.swapaxes(1, 2).reshape(b, t, -1)


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
@pytest.mark.parametrize(
    "dtype,d",
    [
        ("bfloat16", 64),
        ("bfloat16", 128),
        ("float16", 64),
        ("float32", 64),
        ("bfloat16", 32),
    ],  # fmt: skip
)
def test_seq_major_output_matches_reference(dtype: str, d: int, compiled: bool) -> None:
    rng = np.random.default_rng()
    b, h, kv, t, s = 2, 8, 2, 77, 96
    q, k, v = (rand(rng, shape, dtype, low=-1.0, high=1.0)
               for shape in ((b, h, t, d), (b, kv, s, d), (b, kv, s, d)))  # fmt: skip
    kv_len = np.array(t + 5, np.int64)
    kv_start = rng.integers(0, 4, b).astype(np.int64)
    f = gpk.compile(_merged) if compiled else _merged
    args = [gpk.from_numpy(a) for a in (q, k, v, kv_len, kv_start)]
    out = np.asarray(f(*args).to_numpy(), np.float64)
    ref = sdpa_ref(q, k, v, causal=True, kv_len=kv_len, kv_start=kv_start)
    ref = ref.swapaxes(1, 2).reshape(b, t, h * d)
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
