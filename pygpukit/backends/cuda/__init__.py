"""The CUDA backend: driver, NVRTC and launches through pygpukit._native."""
