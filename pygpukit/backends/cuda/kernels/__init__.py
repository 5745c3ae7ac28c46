"""Launchers for the NVRTC kernel templates in native/kernels/.

Each function takes device pointers (ints), shapes, a dtype name and an optional stream,
picks the template variant and launch geometry, and launches. See loader.py for how the
templates are found and compiled.
"""

from . import (
    activation,
    argmax_topk,
    attention,
    embedding,
    gemm_mma,
    gemv,
    layer_norm,
    loader,
    matmul_simple,
    rms_norm,
    rope,
    softmax,
)

__all__ = [
    "activation",
    "argmax_topk",
    "attention",
    "embedding",
    "gemm_mma",
    "gemv",
    "layer_norm",
    "loader",
    "matmul_simple",
    "rms_norm",
    "rope",
    "softmax",
]
