"""Loads the NVRTC kernel templates (the *.cuh files beside this module) as CUBIN for the
current device, and launches them with the argument format their signatures declare.

A template is compiled from: the `#define`s the launcher asks for, then the family file
with common.cuh (and any other template it includes) inlined in place of its `#include`.
Inlining (rather than an include path) puts every byte that reaches NVRTC into the source,
so the toolchain's disk cache, keyed by the source text, can never serve a stale CUBIN
after common.cuh changes.

Compiled Modules are cached per (family, defines, kernel set, arch), where a template
guards its kernels so that a module holds only the one launched (module_defines); their
Functions per (family, defines, kernel, arch); launch formats per (family, kernel), parsed
from the template's `extern "C"` signature.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pygpukit import settings
from pygpukit.backends.devices import current
from pygpukit.errors import CompileError, DTypeError
from pygpukit.ir import dtypes

from .. import compile_ahead
from ..codegen.cdtypes import STORAGE
from ..signature import launch_format

# The templates ship as package data next to this module (source tree and wheel alike).
_TEMPLATE_DIR = Path(__file__).resolve().parent

# Accumulation type (PGK_ACC) of each element type the templates take; the C type of the
# element itself is codegen's (cdtypes.STORAGE).
_ACC: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "float16": "float",
    "bfloat16": "float",
    "int8": "int",
    "uint8": "unsigned",
    "int32": "long long",
    "int64": "long long",
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
HALF_DTYPES = ("float16", "bfloat16")


def _dir_override() -> str | None:
    """PYGPUKIT_KERNEL_DIR: read the templates from another directory (an edited copy)."""
    return settings.kernel_dir() or None


def kernel_dir() -> Path:
    """Where the .cuh templates live: PYGPUKIT_KERNEL_DIR, else beside this module."""
    override = _dir_override()
    d = Path(override) if override else _TEMPLATE_DIR
    if not (d / "common.cuh").is_file():
        raise CompileError(f"kernel templates not found: no common.cuh in {d}")
    return d


def check_dtype(dtype: str, allowed: tuple[str, ...], op: str) -> None:
    if dtype not in allowed:
        raise DTypeError(f"{op}: dtype {dtype!r} not supported (supported: {', '.join(allowed)})")


def itemsize(dtype: str) -> int:
    if dtype not in _ACC:
        raise DTypeError(f"unknown dtype {dtype!r}")
    return dtypes.as_dtype(dtype).itemsize


def type_defines(dtype: str, prefix: str = "PGK_T") -> dict[str, object]:
    """PGK_T (or another macro) and, for the element macro, the matching PGK_ACC."""
    if dtype not in _ACC:
        raise DTypeError(f"unknown dtype {dtype!r}")
    if prefix == "PGK_T":
        return {"PGK_T": STORAGE[dtype], "PGK_ACC": _ACC[dtype]}
    return {prefix: STORAGE[dtype]}


def ctype(dtype: str) -> str:
    """The C type of an element of `dtype` in a template."""
    if dtype not in _ACC:
        raise DTypeError(f"unknown dtype {dtype!r}")
    return STORAGE[dtype]


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


_INCLUDE = re.compile(r'^#include "(\w+\.cuh)"[ \t]*$', re.MULTILINE)


def _inline(text: str, seen: set[str]) -> str:
    """text with each `#include "x.cuh"` of a template replaced by that file, once (a
    family that builds on another's helpers, as gemv_quant on gemv, includes it)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _inline(_read(name), seen)

    return _INCLUDE.sub(one, text)


def kernel_source(family: str, defines: Mapping[str, object]) -> str:
    """The exact source NVRTC compiles for a family with these defines."""
    lines = [f"#define {k} {v}" for k, v in sorted(defines.items())]
    body = _inline(_read(f"{family}.cuh"), {f"{family}.cuh"})
    return "\n".join(lines) + "\n" + body


def compile_source(source: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """CUBIN through the team's toolchain (disk-cached, CompileError on failure)."""
    from ..toolchain import compile_kernel

    return compile_kernel(source, arch, list(options), "pgk_kernel.cu")


# NVRTC options of one family beyond every template's. The decode attention is the cold
# first decode call's critical path (one kernel compiled about 1.0 to 1.3 s on the H200's
# host, every other kernel of the step at most 0.55 s, in parallel); with ptxas at -O2
# rather than its default -O3 it compiles in 0.6 to 0.8 s to the same code (every CUBIN
# section but the note of ptxas's options is byte-identical, for each of its variants).
# The flash (prefill) attention is the cold first prefill call's: 4.5 s for the 1x1024
# chunk's variant on the H200's host (NVRTC 13.0: 2.1 s in NVVM, 2.4 s in ptxas), every
# other kernel of the chunk under 0.85 s. At ptxas -O2 its kernel code is the same (the
# .text of both geometries the TinyLlama prefill takes, NVRTC 13.0 and 13.5), at -O1 not
# (11% slower at 1x1024), and NVRTC's --Ofast-compile=min makes it 9x slower.
FAMILY_OPTIONS: dict[str, tuple[str, ...]] = {
    "attention_decode": ("-Xptxas", "-O2"),
    "attention_flash": ("-Xptxas", "-O2"),
}


# Families whose first call in a process with a cold kernel cache serves from a quick build
# (toolchain.quick_options) while their optimised build compiles in the background
# (compile_ahead.FastTier): the slowest modules of the cold first decode and prefill calls.
QUICK_FAMILIES = frozenset({"attention_decode", "attention_flash", "gemv"})


# Families compiled for an architecture-specific target rather than the device's own:
# wgmma and setmaxnreg exist only in sm_90a code, which loads on SM 9.0 devices alone (the
# planner launches such a family there only).
FAMILY_ARCH: dict[str, str] = {"attention_flash_sm90": "sm_90a"}


def family_arch(family: str, arch: str) -> str:
    """The target a family's template compiles for when `arch` is asked for."""
    return FAMILY_ARCH.get(family, arch)


def template_options(family: str = "") -> tuple[str, ...]:
    """The NVRTC options a family's template compiles with: every template's, and the
    family's own (FAMILY_OPTIONS)."""
    from .. import toolchain

    return ("-std=c++17", *toolchain.lean_options(), *FAMILY_OPTIONS.get(family, ()))


def compile_family(family: str, defines: Mapping[str, object], arch: str) -> bytes:
    """CUBIN of a family's template with `defines` (every kernel it declares, unless the
    defines name the ones to keep: module_defines)."""
    return compile_source(kernel_source(family, defines), family_arch(family, arch),
                          template_options(family))  # fmt: skip


def module_defines(family: str, name: str, defines: Mapping[str, object]) -> dict[str, object]:
    """The defines a module for kernel `name` of `family` is compiled with: `defines`, and
    where the template guards its kernels (`#if !defined(PGK_ONLY) ||
    defined(PGK_ONLY_<kernel>)`), PGK_ONLY and PGK_ONLY_<name>, so NVRTC compiles that
    kernel alone: each kernel of a family costs about as much to compile as its own
    module, and a step launches one (the decode attention's module, three kernels, took
    1.4 s). Kernels of one family asked for with the same defines are then separate
    modules, compiled in parallel."""
    if f"defined(PGK_ONLY_{name})" not in _read(f"{family}.cuh"):
        return dict(defines)
    return {**defines, "PGK_ONLY": 1, f"PGK_ONLY_{name}": 1}


def pdl_enabled() -> bool:
    """Whether our kernels launch as programmatic dependents (SM 9.0+). Every template and
    generated kernel opens with griddepcontrol.wait, so it may start while the kernel
    before it finishes (launch latency and, in the GEMV, the first weight loads overlap
    that kernel's tail). PYGPUKIT_PDL=0 turns it off, e.g. to measure its effect."""
    return _pdl(settings.pdl())


@functools.lru_cache(maxsize=2)
def _pdl(setting: bool) -> bool:
    from .. import toolchain

    return setting and int(toolchain.device_info()["compute_capability"][0]) >= 9


def max_shared_optin() -> int:
    """Dynamic shared memory one block may opt in to on the current device."""
    from .. import toolchain

    return int(toolchain.device_info()["max_shared_per_block_optin"])


# (family, defines with the kernel set (module_defines), arch, device): a module lives in
# one device's context (None: the primary device).
ModuleKey = tuple[str, tuple[tuple[str, str], ...], str, int | None]
_lock = threading.Lock()
_modules: dict[ModuleKey, Any] = {}
_functions: dict[tuple[Any, ...], Any] = {}
# Modules loaded from a quick build, and the Functions taken from each (two tiers): each
# is replaced by its optimised build's when that lands (_upgrade).
_provisional: dict[ModuleKey, list[Any]] = {}


def get_function(
    family: str, name: str, defines: Mapping[str, object], arch: str | None = None
) -> Any:
    """The `name` kernel of `family` compiled with `defines` for `arch` (default: device)."""
    if arch is None:
        from .. import toolchain

        arch = toolchain.device_arch()
    arch = family_arch(family, arch)
    dkey = tuple(sorted((k, str(v)) for k, v in defines.items()))
    device = current.ordinal
    fkey = (family, dkey, arch, name, device)
    fn = _functions.get(fkey)
    if fn is not None:
        return fn
    defines = module_defines(family, name, defines)
    # One module per (family, defines, kernel set): the kernel set is in the defines.
    mkey = (family, tuple(sorted((k, str(v)) for k, v in defines.items())), arch, device)
    if compile_ahead.is_collecting() and mkey not in _modules:
        compile_ahead.ask(_request(family, defines, arch, mkey))
        return compile_ahead.DEFERRED
    with _lock:
        mod = _modules.get(mkey)
        if mod is None:
            mod = _load(mkey, compile_family(family, defines, arch))
        fn = mod.get_function(name)
        taken = _provisional.get(mkey)
        if taken is not None:
            fn.mark_provisional()
            taken.append(fn)
        _functions[fkey] = fn
    return fn


def _load(mkey: ModuleKey, cubin: bytes) -> Any:
    """The module of `cubin`, kept for mkey (the first one loaded wins)."""
    import pygpukit._native as _native

    mod = _modules.get(mkey)
    if mod is None:
        mod = _modules[mkey] = _native.Module(cubin)
    return mod


def _request(family: str, defines: Mapping[str, object], arch: str,
             mkey: ModuleKey) -> compile_ahead.Request:  # fmt: skip
    """A compile of this family's module for compile_ahead (the source is read now: a
    setting read on the pool's threads could see another value)."""
    source = kernel_source(family, defines)
    options = template_options(family)
    shown = ", ".join(f"{k}={v}" for k, v in mkey[1])

    def install(cubin: bytes) -> None:
        with _lock:
            _load(mkey, cubin)

    return compile_ahead.Request(("template", mkey), f"{family} ({shown}) for {arch}",
                                 lambda: compile_source(source, arch, options),
                                 install, fast=_fast_tier(family, source, arch, options,
                                                          mkey))  # fmt: skip


def _fast_tier(family: str, source: str, arch: str, options: tuple[str, ...],
               mkey: ModuleKey) -> compile_ahead.FastTier | None:  # fmt: skip
    """The two-tier compile of a QUICK_FAMILIES module (None for the others, or where
    NVRTC has no quick level): the quick build takes the family's own options' place."""
    from .. import toolchain

    quick = toolchain.quick_options() if family in QUICK_FAMILIES else None
    if quick is None:
        return None
    quick_options = (*template_options(), *quick)

    def install(cubin: bytes) -> None:
        with _lock:
            if mkey not in _modules:
                _load(mkey, cubin)
                _provisional[mkey] = []

    return compile_ahead.FastTier(
        cached=lambda: toolchain.cached_kernel(source, arch, options, "pgk_kernel.cu"),
        compile=lambda: toolchain.compile_quick(source, arch, quick_options, "pgk_kernel.cu"),
        install=install,
        upgrade=lambda cubin: _upgrade(mkey, cubin),
    )


def _upgrade(mkey: ModuleKey, cubin: bytes) -> None:
    """Loads the optimised build of a provisional module in its place: each Function taken
    from it launches the optimised kernel from now on (as do the graphs capturing it)."""
    import pygpukit._native as _native
    from pygpukit.backends.devices import using

    device = mkey[3]
    with using(device) if device is not None else nullcontext():
        with _lock:
            taken = _provisional.pop(mkey, None)
            if taken is None:
                return
            mod = _modules[mkey] = _native.Module(cubin)
            for fn in taken:
                fn.replace_with(mod.get_function(fn.name))


def set_dynamic_smem(fn: Any, nbytes: int) -> None:
    """Raises a Function's dynamic shared-memory limit once per new maximum. Needed when
    dynamic plus static shared memory passes 48 KB, so below 48 KB of dynamic memory too
    (the GEMV's 45 KB of stages beside its 5 KB reduction failed to launch)."""
    if nbytes > 0:
        key = ("smem", id(fn))
        if _functions.get(key, 0) < nbytes:
            fn.set_max_dynamic_shared_memory(nbytes)
            _functions[key] = nbytes


@functools.cache
def kernel_format(family: str, name: str) -> str:
    """The launch argument format of kernel `name`, from its `extern "C"` signature in the
    family's template (the signatures use no macros in scalar types, so one format serves
    every variant)."""
    return launch_format(_read(f"{family}.cuh"), name, family)


class Kernel:
    """A compiled template kernel (the native Function) and its launch format."""

    __slots__ = ("fmt", "fn", "name")

    def __init__(self, name: str, fn: Any, fmt: str) -> None:
        self.name, self.fn, self.fmt = name, fn, fmt

    def launch(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
               smem: int = 0, stream: Any = None) -> None:  # fmt: skip
        """Launches with `args` in signature order, as a programmatic dependent where
        pdl_enabled()."""
        self.fn.launch(grid, block, self.fmt, args, smem, stream, pdl=pdl_enabled())

    def set_dynamic_smem(self, nbytes: int) -> None:
        """See set_dynamic_smem."""
        set_dynamic_smem(self.fn, nbytes)


def get_kernel(family: str, name: str, defines: Mapping[str, object],
               arch: str | None = None) -> Kernel:  # fmt: skip
    """get_function's kernel with the launch format its template declares."""
    return Kernel(name, get_function(family, name, defines, arch), kernel_format(family, name))
