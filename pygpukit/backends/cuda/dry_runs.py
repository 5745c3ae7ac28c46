"""Programs whose kernels a dry run has already compiled into the kernel cache, kept on disk
beside it, so a later process skips that program's dry run.

A program's first call runs dry (planned.CudaReplay._compile_ahead) to learn which kernels
it needs and compile them in parallel; which kernels those are is known only by running
it. Where a process meets the same program again (same graph structure on the same
device), the kernels are on disk already and the dry run would only read them back: 78 ms
of the 22-layer decode step's warm first call on the H200. So after a dry run whose
compiles all succeeded, the program's fingerprint (a hash of its graph's structure key,
the device's compute capability and the NVRTC version) is kept as one empty file; a
first call whose fingerprint is there skips the dry run.

The mark is a hint for speed, never for results: a program it names wrongly (a kernel
since evicted from the cache, a key whose text holds an object's address and so never
matches) only compiles its missing kernels one after another in its first run, as before
dry runs existed. `pygpukit cache clear` removes the marks with the kernels.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any

from pygpukit import _native

from . import toolchain

DIR_NAME = "dry-runs"


def _dir() -> str | None:
    toolchain.configure_kernel_cache()
    d = _native.kernel_cache_dir()
    return os.path.join(d, DIR_NAME) if d else None


def fingerprint(program: Any) -> str | None:
    """The program's fingerprint (None where it has none that is stable across processes:
    no schedule, or a structure key whose text names an object by its address)."""
    graph = getattr(getattr(program, "schedule", None), "graph", None)
    if graph is None:
        return None
    text = repr(graph.key())
    if " at 0x" in text:
        return None
    cc = toolchain.device_info().get("compute_capability")
    seed = f"{cc}|{toolchain.nvrtc_version()}|"
    return hashlib.sha256((seed + text).encode()).hexdigest()[:40]


def known(fp: str | None) -> bool:
    """Whether a dry run of the program with this fingerprint compiled its kernels into
    this kernel cache."""
    d = _dir()
    return fp is not None and d is not None and os.path.exists(os.path.join(d, fp))


def note(fp: str | None) -> None:
    """Marks the fingerprint's kernels as compiled into the cache (an unwritable
    directory marks nothing)."""
    d = _dir()
    if fp is None or d is None:
        return
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, fp), "wb"):
            pass
    except OSError:
        pass


def forget() -> bool:
    """Removes every mark; whether there were any."""
    d = _dir()
    if d is None or not os.path.isdir(d):
        return False
    shutil.rmtree(d, ignore_errors=True)
    return True


__all__ = ["DIR_NAME", "fingerprint", "forget", "known", "note"]
