"""Loads the NVRTC kernel templates (native/kernels/*.cuh) as CUBIN for the current device.

A template is compiled from: the `#define`s the launcher asks for, then common.cuh inlined
in place of its `#include`, then the family file. Inlining (rather than an include path)
puts every byte that reaches NVRTC into the source, so the toolchain's disk cache, keyed
by the source text, can never serve a stale CUBIN after common.cuh changes.

Compiled Modules and their Functions are cached per (family, defines, arch).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pygpukit import settings
from pygpukit.errors import CompileError, DTypeError

_PKG_DIR = Path(__file__).resolve().parents[3]  # .../pygpukit

# Element types: C type for PGK_T, accumulation type, item size.
_DTYPES: dict[str, tuple[str, str, int]] = {
    "float32": ("float", "float", 4),
    "float64": ("double", "double", 8),
    "float16": ("__half", "float", 2),
    "bfloat16": ("__nv_bfloat16", "float", 2),
    "int8": ("signed char", "int", 1),
    "uint8": ("unsigned char", "unsigned", 1),
    "int32": ("int", "long long", 4),
    "int64": ("long long", "long long", 8),
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
HALF_DTYPES = ("float16", "bfloat16")


def kernel_dir() -> Path:
    """Where the .cuh templates live: the source tree, else the installed copy."""
    env = settings.kernel_dir()
    candidates = [Path(env)] if env else []
    candidates += [_PKG_DIR.parent / "native" / "kernels", _PKG_DIR / "native_kernels"]
    for c in candidates:
        if (c / "common.cuh").is_file():
            return c
    raise CompileError(
        "kernel templates not found; looked in " + ", ".join(str(c) for c in candidates)
    )


def check_dtype(dtype: str, allowed: tuple[str, ...], op: str) -> None:
    if dtype not in allowed:
        raise DTypeError(f"{op}: dtype {dtype!r} not supported (supported: {', '.join(allowed)})")


def itemsize(dtype: str) -> int:
    try:
        return _DTYPES[dtype][2]
    except KeyError:
        raise DTypeError(f"unknown dtype {dtype!r}") from None


def type_defines(dtype: str, prefix: str = "PGK_T") -> dict[str, object]:
    """PGK_T (or another macro) and, for the element macro, the matching PGK_ACC."""
    try:
        ctype, acc, _ = _DTYPES[dtype]
    except KeyError:
        raise DTypeError(f"unknown dtype {dtype!r}") from None
    if prefix == "PGK_T":
        return {"PGK_T": ctype, "PGK_ACC": acc}
    return {prefix: ctype}


def ctype(dtype: str) -> str:
    return _DTYPES[dtype][0]


def vec_width(dtype: str, *ints: int, ptrs: tuple[int, ...] = ()) -> int:
    """16-byte vector width in elements if every pointer is 16-byte aligned and every int
    (row lengths, strides in elements) is a multiple of it; else 1."""
    v = 16 // itemsize(dtype)
    if all(p % 16 == 0 for p in ptrs) and all(i % v == 0 for i in ints):
        return v
    return 1


@functools.cache
def _read(name: str) -> str:
    return (kernel_dir() / name).read_text(encoding="ascii")


def kernel_source(family: str, defines: Mapping[str, object]) -> str:
    """The exact source NVRTC compiles for a family with these defines."""
    lines = [f"#define {k} {v}" for k, v in sorted(defines.items())]
    body = _read(f"{family}.cuh").replace('#include "common.cuh"', _read("common.cuh"))
    return "\n".join(lines) + "\n" + body


def compile_source(source: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """CUBIN through the team's toolchain (disk-cached, CompileError on failure)."""
    from pygpukit.backends.cuda.toolchain import compile_kernel

    return compile_kernel(source, arch, list(options), "pgk_kernel.cu")


def compile_family(family: str, defines: Mapping[str, object], arch: str) -> bytes:
    return compile_source(kernel_source(family, defines), arch, ("-std=c++17",))


@functools.lru_cache(maxsize=1)
def device_info() -> dict[str, Any]:
    import pygpukit._native as _native

    return dict(_native.device_info(None))


def pdl_enabled() -> bool:
    """Whether our kernels launch as programmatic dependents (SM 9.0+). Every template and
    generated kernel opens with griddepcontrol.wait, so it may start while the kernel
    before it finishes (launch latency and, in the GEMV, the first weight loads overlap
    that kernel's tail). PYGPUKIT_PDL=0 turns it off, e.g. to measure its effect."""
    return _pdl(settings.pdl())


@functools.lru_cache(maxsize=2)
def _pdl(setting: bool) -> bool:
    return setting and int(device_info()["compute_capability"][0]) >= 9


def device_arch() -> str:
    major, minor = device_info()["compute_capability"]
    return f"sm_{major}{minor}"


def max_shared_optin() -> int:
    return int(device_info()["max_shared_per_block_optin"])


def sm_count() -> int:
    return int(device_info()["sm_count"])


_lock = threading.Lock()
_modules: dict[tuple[str, tuple[tuple[str, str], ...], str], Any] = {}
_functions: dict[tuple[Any, ...], Any] = {}


def get_function(
    family: str, name: str, defines: Mapping[str, object], arch: str | None = None
) -> Any:
    """The `name` kernel of `family` compiled with `defines` for `arch` (default: device)."""
    arch = arch or device_arch()
    dkey = tuple(sorted((k, str(v)) for k, v in defines.items()))
    fkey = (family, dkey, arch, name)
    fn = _functions.get(fkey)
    if fn is not None:
        return fn
    with _lock:
        mkey = (family, dkey, arch)
        mod = _modules.get(mkey)
        if mod is None:
            import pygpukit._native as _native

            mod = _native.Module(compile_family(family, defines, arch))
            _modules[mkey] = mod
        fn = mod.get_function(name)
        _functions[fkey] = fn
    return fn


def set_dynamic_smem(fn: Any, nbytes: int) -> None:
    """Raises a Function's dynamic shared-memory limit once per new maximum. Needed when
    dynamic plus static shared memory passes 48 KB, so below 48 KB of dynamic memory too
    (the GEMV's 45 KB of stages beside its 5 KB reduction failed to launch)."""
    if nbytes > 0:
        key = ("smem", id(fn))
        if _functions.get(key, 0) < nbytes:
            fn.set_max_dynamic_shared_memory(nbytes)
            _functions[key] = nbytes
