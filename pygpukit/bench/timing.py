"""Timing and run metadata shared by the benchmark modules.

kernels.time_graph (calls captured in one CUDA graph) serves code that torch can capture;
time_loop serves code that cannot be captured from torch's side, such as PyGPUkit through
its GPUArray API (it launches on the legacy default stream): `calls` back-to-back calls
between two device events, so the host runs ahead and the device time is what is measured
whenever one call's host work is shorter than its device work.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pygpukit import settings

from .kernels import _sets_for, time_graph

Fn = Callable[[int], Any]  # one call on input set i

__all__ = ["Fn", "metadata", "sets_for", "time_graph", "time_loop"]


def sets_for(nbytes: int) -> int:
    """Input sets to rotate through so they span ~3x L2 (1 when one set is larger)."""
    return _sets_for(nbytes)


def time_loop(fn: Fn, n_sets: int, calls: int = 10, reps: int = 15, warmup: int = 3) -> float:
    """Median microseconds per call over `reps` timings of `calls` calls (rotating input
    sets), device events on the current (legacy default) stream around each timing."""
    import torch

    import pygpukit as gpk

    for i in range(max(warmup, n_sets)):  # compiles, plans, autotunes, loads modules
        fn(i % n_sets)
    gpk.wait_for_compiles()  # a cold kernel cache's quick builds replaced by optimised ones
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(calls):
            fn(i % n_sets)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(times)


def git_commit() -> str | None:
    """$PGK_GIT_COMMIT (set where the tree travels without .git), else git rev-parse."""
    env = settings.git_commit()
    if env:
        return env
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def metadata() -> dict[str, Any]:
    """Device, driver, library versions and the commit, for the JSON."""
    import torch

    meta: dict[str, Any] = {"git_commit": git_commit(), "python": platform.python_version(),
                            "torch": torch.__version__}  # fmt: skip
    try:
        p = torch.cuda.get_device_properties(0)
        meta.update(device=torch.cuda.get_device_name(0), sm=f"{p.major}.{p.minor}",
                    sm_count=p.multi_processor_count, l2_bytes=p.L2_cache_size,
                    memory_bytes=p.total_memory, torch_cuda=torch.version.cuda)  # fmt: skip
    except Exception as e:  # no device: still write what is known
        meta["device_error"] = repr(e)
    try:
        from pygpukit import _native

        v = _native.driver_version()
        meta["driver_cuda_version"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        meta["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        meta["driver"] = None
    try:
        import cupy

        meta["cupy"] = cupy.__version__
    except Exception:
        meta["cupy"] = None
    try:
        from pygpukit import _native
        from pygpukit.backends.cuda import cublaslt

        reason = cublaslt.cublaslt_unavailable_reason()
        meta["cublaslt"] = (
            {"path": _native.cublaslt_path(), "version": _native.cublaslt_version()}
            if not reason else {"unavailable": reason}
        )  # fmt: skip
    except Exception as e:
        meta["cublaslt"] = {"unavailable": repr(e)}
    return meta
