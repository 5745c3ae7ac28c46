"""A transformer-style block written with NumPy-like ops, run lazily (fused) and compiled,
checked against float64 NumPy. Runs on the CPU backend when there is no GPU."""

from __future__ import annotations

import numpy as np

import pygpukit as gpk


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The block in float64 NumPy (GELU, tanh form; then RMS normalisation)."""
    h = x @ w.T + b
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)


def block(x: gpk.GPUArray, w: gpk.GPUArray, b: gpk.GPUArray) -> gpk.GPUArray:
    """Linear + bias + GELU (one GEMM with its epilogue), then RMS normalisation."""
    h = gpk.nn.gelu(x @ w.T + b, approximate="tanh")
    return h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6)


compiled_block = gpk.compile(block)  # traced once per signature, then replayed


def main() -> float:
    """Run the block both ways; returns the largest difference from the reference."""
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((8, 64)).astype(np.float32)
    wn = (rng.standard_normal((128, 64)) / 8).astype(np.float32)
    bn = rng.standard_normal(128).astype(np.float32)
    x, w, b = gpk.asarray(xn), gpk.asarray(wn), gpk.asarray(bn)
    want = reference(xn.astype(np.float64), wn.astype(np.float64), bn.astype(np.float64))
    lazy = block(x, w, b)  # recorded, fused and run at to_numpy()
    compiled = compiled_block(x, w, b)
    err = max(float(np.abs(r.to_numpy() - want).max()) for r in (lazy, compiled))
    print(f"backend {gpk.backend_name()}: max |error| vs float64 NumPy = {err:.2e}")
    return err


if __name__ == "__main__":
    main()
