"""Bandwidth figures for decode: weight bytes read per second, and the copy roofline."""

from __future__ import annotations

import time

import numpy as np

import pygpukit as gpk


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> tuple[float, str]:
    """(bytes/s, how) of a large copy, counting bytes read plus bytes written.

    On the CUDA backend this is a device-to-device copy through the runtime; on the CPU
    backend it is a host memcpy (NumPy), the bandwidth the NumPy backend can reach.
    """
    if gpk.backend_name() == "cuda":
        n = nbytes // 4
        x = gpk.ones((n,), gpk.float32).realize()
        best = float("inf")
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            y = x.copy().realize()
            y[n - 1 :].to_numpy()  # waits for the copy
            best = min(best, time.perf_counter() - t0)
            y.free()
        x.free()
        return 2 * n * 4 / best, "device-to-device copy"
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best, "host memcpy (CPU backend)"
