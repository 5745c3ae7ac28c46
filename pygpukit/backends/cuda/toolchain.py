"""Where the CUDA pieces live and how kernels get compiled.

NVRTC and the CUDA headers come from pip wheels first (nvidia-cuda-nvrtc and
nvidia-cuda-runtime), then $CUDA_HOME, then the system. Kernels compile straight to
CUBIN for the device's exact SM: PTX from an NVRTC newer than the driver would not load.
"""

from __future__ import annotations

import ctypes.util
import functools
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pygpukit import _native, settings
from pygpukit.errors import GPUKitError
from pygpukit.progress import slow_step

MIN_SM = 80

# (wheel sub-path of the library, system soname), newest CUDA first.
_NVRTC_WHEEL_LIBS = ["cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"]
_NVRTC_SONAMES = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
_INCLUDE_WHEEL_DIRS = ["cu13/include", "cuda_runtime/include"]
_CUBLASLT_WHEEL_LIBS = ["cu13/lib/libcublasLt.so.13", "cublas/lib/libcublasLt.so.12"]
_CUBLASLT_SONAMES = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]


def nvidia_wheel_dirs() -> list[Path]:
    """The directories of the `nvidia` namespace package that pip wheels install into."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def cuda_home() -> Path | None:
    """$CUDA_HOME, else $CUDA_PATH, else /usr/local/cuda when it exists."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value:
            return Path(value)
    default = Path("/usr/local/cuda")
    return default if default.is_dir() else None


def _wheel_files(subpaths: Sequence[str]) -> list[str]:
    return [str(d / s) for s in subpaths for d in nvidia_wheel_dirs() if (d / s).exists()]


def _cuda_home_libs(stem: str) -> list[str]:
    home = cuda_home()
    if home is None:
        return []
    found: list[str] = []
    for libdir in (home / "lib64", home / "lib", home / "targets/x86_64-linux/lib"):
        found += sorted((str(p) for p in libdir.glob(f"{stem}.so*")), reverse=True)
    return found


def nvrtc_candidates() -> list[str]:
    """Paths and sonames to try, in order: pip wheel, $CUDA_HOME, system."""
    found = _wheel_files(_NVRTC_WHEEL_LIBS) + _cuda_home_libs("libnvrtc") + _NVRTC_SONAMES
    return list(dict.fromkeys(found))


def include_dirs() -> list[str]:
    """Directories holding cuda_fp16.h / cuda_bf16.h: runtime wheel, then $CUDA_HOME."""
    dirs = [d for d in _wheel_files(_INCLUDE_WHEEL_DIRS) if Path(d, "cuda_fp16.h").exists()]
    home = cuda_home()
    if home is not None and (home / "include" / "cuda_fp16.h").exists():
        dirs.append(str(home / "include"))
    return list(dict.fromkeys(dirs))


def cublaslt_path() -> str | None:
    """Where cuBLASLt would be loaded from, or None; only locates, never loads."""
    for path in _wheel_files(_CUBLASLT_WHEEL_LIBS) + _cuda_home_libs("libcublasLt"):
        return path
    return ctypes.util.find_library("cublasLt")


def cublaslt_candidates() -> list[str]:
    """Paths and sonames to try for cuBLASLt, in order: pip wheel (nvidia-cublas),
    $CUDA_HOME, system. PYGPUKIT_CUBLASLT=0 gives none (the NVRTC GEMM serves)."""
    if not settings.cublaslt():
        return []
    found = _wheel_files(_CUBLASLT_WHEEL_LIBS) + _cuda_home_libs("libcublasLt") + _CUBLASLT_SONAMES
    return list(dict.fromkeys(found))


def load_cublaslt() -> str:
    """Load cuBLASLt once; returns its path. CUDAError (call 'load libcublasLt') lists
    every candidate tried when none loads."""
    if _native.cublaslt_loaded():
        return _native.cublaslt_path()
    return _native.cublaslt_load(cublaslt_candidates())


def load_nvrtc() -> str:
    """Load NVRTC once (CompileError when none of the candidates loads); returns its path."""
    if _native.nvrtc_loaded():
        return _native.nvrtc_path()
    return _native.nvrtc_load(nvrtc_candidates())


def nvrtc_version() -> tuple[int, int]:
    load_nvrtc()
    major, minor = _native.nvrtc_version()
    return int(major), int(minor)


def lean_options() -> tuple[str, ...]:
    """NVRTC options for PyGPUkit's own kernels (templates and generated ones) that make
    them compile faster without changing their code: `--minimal` (NVRTC 12.4+) leaves out
    the texture, device-runtime and runtime-API declarations, which none of them use (the
    SASS of every template variant is the same with it; a user's kernel, pygpukit.jit,
    may use them, so it never gets it)."""
    return ("--minimal",) if nvrtc_version() >= (12, 4) else ()


def header_pch_options() -> tuple[str, ...]:
    """NVRTC options that let programs opening with the same #include lines share the
    headers' parse through NVRTC's in-process precompiled header (`--pch`, NVRTC 12.8+;
    none before): the generated kernels' prelude (codegen/prelude.py). Of a generated
    kernel's 45-55 ms on the development host (NVRTC 13.5) the front end took 18 ms, 11
    of them cuda_fp16.h and cuda_bf16.h; with the PCH 8-10 ms after the first program
    (which makes it: 13 ms more), and the 12 generated kernels of the TinyLlama prefill
    chunk and decode step took 518-546 ms one after another instead of 628-725; every
    CUBIN byte-identical. Not for the templates: their defines precede the headers, so
    each would make a PCH of its own, and making one costs more than it saves once."""
    return ("--pch",) if nvrtc_version() >= (12, 8) else ()


def quick_options() -> tuple[str, ...] | None:
    """The NVRTC option of a quick, less optimised build (two-tier compiles:
    compile_ahead.FastTier): --Ofast-compile=mid (NVRTC 12.9+; None before). On the H200's
    host (NVRTC 13.0) it compiled the slow template modules 1.8 to 2.9x faster; `max` was
    little faster and its code far slower (the decode step 97.6 ms against 0.87), `min`
    only 1.3 to 1.6x faster."""
    return ("--Ofast-compile=mid",) if nvrtc_version() >= (12, 9) else None


@functools.lru_cache(maxsize=8)
def device_info(device: int | None = None) -> dict[str, Any]:
    """The driver's properties of a device (default: the current one), read once: they do
    not change while the process runs."""
    return dict(_native.device_info(device))


def device_arch(device: int | None = None) -> str:
    """The exact architecture of a device, e.g. 'sm_90'."""
    major, minor = device_info(device)["compute_capability"]
    return f"sm_{major}{minor}"


def sm_count(device: int | None = None) -> int:
    """Streaming multiprocessors of a device."""
    return int(device_info(device)["sm_count"])


@functools.lru_cache(maxsize=1)
def _include_dirs_cached() -> tuple[str, ...]:
    return tuple(include_dirs())


def compile_kernel(
    source: str,
    arch: str,
    options: Sequence[str] = (),
    name: str = "kernel.cu",
    dependencies: Sequence[str] = (),
) -> bytes:
    """Compile CUDA C++ to CUBIN for `arch` (e.g. 'sm_90') through the kernel cache.

    `dependencies` are strings hashed into the cache key besides the source and options: the
    digests of the headers the source includes (header_deps.header_dependencies).
    Raises CompileError with the NVRTC log and the offending source lines.
    """
    load_nvrtc()
    configure_kernel_cache()
    with slow_step(f"compiling {name} for {arch}"):  # a disk-cache hit is quick and silent
        cubin = _native.compile_cubin(
            source,
            arch,
            list(options),
            list(_include_dirs_cached()),
            name,
            dependencies=list(dependencies),
        )
    return bytes(cubin)


def cached_kernel(
    source: str, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> bytes | None:
    """compile_kernel's CUBIN where the kernel cache (memory or disk) holds it, else None;
    compiles nothing."""
    load_nvrtc()
    configure_kernel_cache()
    cubin = _native.kernel_cache_lookup(source, arch, list(options),
                                        list(_include_dirs_cached()), name)  # fmt: skip
    return None if cubin is None else bytes(cubin)


def compile_quick(
    source: str, arch: str, options: Sequence[str] = (), name: str = "kernel.cu"
) -> bytes:
    """compile_kernel without the kernel cache (a quick build that only serves until its
    optimised one lands: never kept)."""
    load_nvrtc()
    with slow_step(f"compiling {name} for {arch} (quick)"):
        dirs = list(_include_dirs_cached())
        cubin = _native.compile_cubin(source, arch, list(options), dirs, name, use_cache=False)
    return bytes(cubin)


def configure_kernel_cache() -> None:
    """Hand the cache settings (directory, size bound) to the native kernel cache; done
    before each use of it, so a setting changed since takes effect."""
    _native.kernel_cache_configure(settings.cache_dir() or "", settings.cache_max_bytes())


def compare_nvrtc_driver(nvrtc: tuple[int, int], driver: int) -> tuple[bool, str]:
    """(fatal, message) for an NVRTC `(major, minor)` against cuDriverGetVersion's `driver`
    (e.g. 12040); message is '' when NVRTC is not newer. A newer major is fatal: the driver
    does not load CUBINs of a later CUDA major. A newer minor of the same major loads
    (CUDA minor version compatibility), so it is only reported."""
    d_major, d_minor = driver // 1000, (driver % 1000) // 10
    n_major, n_minor = nvrtc
    if (n_major, n_minor) <= (d_major, d_minor):
        return False, ""
    said = f"NVRTC {n_major}.{n_minor} is newer than the driver (CUDA {d_major}.{d_minor})"
    if n_major > d_major:
        extra = f'pip install "pygpukit[cuda{d_major}]"'
        return True, (f"{said}: the kernels it compiles would not load; install a driver for "
                      f"CUDA {n_major} or NVRTC {d_major} ({extra})")  # fmt: skip
    return False, f"{said}; it works through CUDA minor version compatibility"


def nvrtc_driver_check() -> tuple[bool, str]:
    """compare_nvrtc_driver for the loaded driver and NVRTC; (False, '') when either is
    missing (their absence is reported on its own)."""
    if _native.driver_unavailable_reason():
        return False, ""
    try:
        nvrtc = nvrtc_version()
    except GPUKitError:
        return False, ""
    return compare_nvrtc_driver(nvrtc, int(_native.driver_version()))


def cuda_usable() -> tuple[bool, str]:
    """Whether an SM80+ GPU, a working driver and an NVRTC whose kernels it loads are
    present, and if not, why."""
    reason = _native.driver_unavailable_reason()
    if reason:
        return False, reason
    major, minor = _native.device_info(None)["compute_capability"]
    if major * 10 + minor < MIN_SM:
        return False, f"device is sm_{major}{minor}; PyGPUkit needs sm_{MIN_SM} or newer"
    fatal, why = nvrtc_driver_check()
    if fatal:
        return False, why
    return True, ""


__all__ = [
    "MIN_SM",
    "cached_kernel",
    "compare_nvrtc_driver",
    "compile_kernel",
    "compile_quick",
    "configure_kernel_cache",
    "cublaslt_candidates",
    "cublaslt_path",
    "cuda_home",
    "cuda_usable",
    "device_arch",
    "device_info",
    "header_pch_options",
    "include_dirs",
    "load_cublaslt",
    "lean_options",
    "load_nvrtc",
    "nvidia_wheel_dirs",
    "nvrtc_candidates",
    "nvrtc_driver_check",
    "nvrtc_version",
    "quick_options",
    "sm_count",
]
