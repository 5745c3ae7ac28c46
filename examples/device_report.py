"""What this machine offers PyGPUkit: the original project's device queries, and a custom
CUDA kernel through gpk.jit where a GPU is present (its result checked against NumPy)."""

from __future__ import annotations

import numpy as np

import pygpukit as gpk

SCALE = """
extern "C" __global__
void scale(float* x, float factor, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] *= factor;
}
"""


def main() -> bool:
    """Print the queries; run the jit kernel when CUDA is usable. Returns whether it ran."""
    print(f"CUDA available: {gpk.is_cuda_available()}")
    print(f"NVRTC available: {gpk.is_nvrtc_available()} ({gpk.get_nvrtc_path()})")
    kernel = gpk.jit(SCALE, func="scale")
    print(f"kernel: {kernel}")
    if not gpk.is_cuda_available() or gpk.backend_name() != "cuda":
        print(f"backend {gpk.backend_name()}: the kernel needs a CUDA GPU, not run")
        return False
    print(f"SM version: {gpk.get_sm_version()}")
    xn = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    x = gpk.asarray(xn)
    kernel(x, factor=0.5, n=x.size)
    assert np.array_equal(x.to_numpy(), xn * np.float32(0.5))
    print("scale kernel: matches NumPy")
    return True


if __name__ == "__main__":
    main()
