"""Generated source -> loaded Function, cached in memory per (source, arch).

The CUBIN itself is cached on disk by the C++ layer (keyed by source and options), so a
new process pays the module load, not NVRTC.
"""

from __future__ import annotations

import threading
from typing import Any

from pygpukit import _native

from .codegen import KernelSource
from .toolchain import compile_kernel, device_arch

_lock = threading.Lock()
_functions: dict[tuple[str, str], Any] = {}
_modules: list[Any] = []  # Functions need their Module alive
stats = {"compiled": 0, "hits": 0}


def function(src: KernelSource, arch: str | None = None) -> Any:
    arch = arch or device_arch()
    key = (src.text, arch)
    fn = _functions.get(key)
    if fn is not None:
        stats["hits"] += 1
        return fn
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            mod = _native.Module(compile_kernel(src.text, arch, ("-std=c++17",), src.name + ".cu"))
            fn = mod.get_function(src.name)
            _modules.append(mod)
            _functions[key] = fn
            stats["compiled"] += 1
    return fn
