"""Waiting for the kernel builds that finish in the background.

A first call with a cold kernel cache serves its slowest kernel modules from a quick,
less optimised NVRTC build while their optimised build compiles on background threads
(two tiers: pygpukit/backends/cuda/compile_ahead.py); each optimised build replaces its
quick one on the next launch. Timing steady-state speed right after a cold first call
would time the quick builds: wait here first."""

from __future__ import annotations

import sys


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until every optimised kernel build started in the background so far has
    landed (replacing its quick build); True if they all did within `timeout` seconds.
    Returns True at once when none is under way or the CUDA backend was never used."""
    compile_ahead = sys.modules.get("pygpukit.backends.cuda.compile_ahead")
    if compile_ahead is None:  # nothing compiled through the CUDA backend in this process
        return True
    return bool(compile_ahead.wait_for_upgrades(timeout))


__all__ = ["wait_for_compiles"]
