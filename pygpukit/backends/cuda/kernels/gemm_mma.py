"""Launcher for gemm_mma.cuh: tensor-core C = act(A @ B^T + bias), bf16/f16, SM80+."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = loader.HALF_DTYPES
ACTIVATIONS = {"none": 0, "gelu_tanh": 1, "gelu_erf": 2, "silu": 3}
TILE = 128


def supported(m: int, n: int, k: int, a: int, b: int, lda: int, ldb: int) -> bool:
    """Whether the operands meet the cp.async layout rules (else use matmul_simple)."""
    return k % 8 == 0 and lda % 8 == 0 and ldb % 8 == 0 and a % 16 == 0 and b % 16 == 0


def gemm(
    a: int,
    b: int,
    c: int,
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    bias: int = 0,
    activation: str = "none",
    lda: int | None = None,
    ldb: int | None = None,
    ldc: int | None = None,
    batch: int = 1,
    a_batch_stride: int = 0,
    b_batch_stride: int = 0,
    c_batch_stride: int | None = None,
    stream: Any = None,
) -> None:
    """C[z] = act(A[z] @ B[z]^T + bias) with A [M, K], B [N, K], C [M, N] (strides in
    elements; a batch stride of 0 broadcasts). K and the leading dimensions of A and B must
    be multiples of 8 and A, B 16-byte aligned."""
    loader.check_dtype(dtype, DTYPES, "gemm_mma")
    if activation not in ACTIVATIONS:
        raise ShapeError(f"gemm_mma: unknown activation {activation!r}")
    positive("gemm_mma", m=m, n=n, k=k, batch=batch)
    int32_range("gemm_mma", m=m, n=n, k=k)
    lda_ = k if lda is None else lda
    ldb_ = k if ldb is None else ldb
    ldc_ = n if ldc is None else ldc
    cbs = m * ldc_ if c_batch_stride is None else c_batch_stride
    if not supported(m, n, k, a, b, lda_, ldb_) or a_batch_stride % 8 or b_batch_stride % 8:
        raise ShapeError(
            f"gemm_mma: needs K, lda, ldb and batch strides multiple of 8 and 16-byte aligned "
            f"A/B (K={k}, lda={lda_}, ldb={ldb_}); use matmul_simple"
        )
    if batch > 65535:
        raise ShapeError(f"gemm_mma: batch {batch} exceeds 65535")
    if m == 0 or n == 0 or batch == 0:
        return
    defines = {**loader.type_defines(dtype), "PGK_ACT": ACTIVATIONS[activation]}
    fn = loader.get_kernel("gemm_mma", "pgk_gemm_mma", defines)
    fn.launch(
        (cdiv(n, TILE), cdiv(m, TILE), batch),
        (256,),
        (a, b, bias, c, m, n, k, lda_, ldb_, ldc_, a_batch_stride, b_batch_stride, cbs),
        0,
        stream,
    )
