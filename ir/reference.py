"""NumPy formulas that several references share: the elementwise ops of ir/elementwise.py
and the NumPy backend's fused kernels (GEMM epilogues, SwiGLU).

Each computes in its input's float dtype (float64 included); the CUDA prelude's helpers
(pgk_sigmoid, pgk_gelu_*) follow the same formulas.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, exact to double precision (math.erf per element)."""
    return _erf(x).astype(x.dtype, copy=False) if x.size else x.copy()


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); exp overflowing to inf gives the exact limit 0."""
    with np.errstate(over="ignore"):
        out: np.ndarray = 1.0 / (1.0 + np.exp(-x))
    return out


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU: the exact erf form, or torch's tanh approximation with approximate='tanh'."""
    out: np.ndarray
    if approximate == "tanh":
        c = np.asarray(math.sqrt(2.0 / math.pi), x.dtype)
        out = 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x**3)))
    else:
        out = 0.5 * x * (1.0 + erf(x / np.asarray(math.sqrt(2.0), x.dtype)))
    return out
