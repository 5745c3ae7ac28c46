"""Per-op host overhead of the CUDA backend: eager ops and cached lazy replays (us/op).
scripts/device_test.sh runs it first and keeps its line in $OUT/overhead.txt.

    python scripts/cuda_overhead.py
"""

from __future__ import annotations

import time

import numpy as np

import pygpukit as gpk


def main() -> None:
    x = gpk.asarray(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32))
    with gpk.eager():
        for _ in range(50):
            y = x + 1.0
        gpk.synchronize()
        t0 = time.perf_counter()
        n = 2000
        for _ in range(n):
            y = x + 1.0
        gpk.synchronize()
        eager_us = (time.perf_counter() - t0) / n * 1e6
    for _ in range(20):
        y = ((x * 2.0 + 1.0) * x).sum(-1)
        y.realize()
    t0 = time.perf_counter()
    for _ in range(n):
        y = ((x * 2.0 + 1.0) * x).sum(-1)
        y.realize()
    gpk.synchronize()
    lazy_us = (time.perf_counter() - t0) / n * 1e6
    print(f"eager add: {eager_us:.1f} us/op; lazy 4-op chain, cached schedule: {lazy_us:.1f} us")


if __name__ == "__main__":
    main()
