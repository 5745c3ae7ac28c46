"""Generated source -> loaded Function, cached in memory per (source, arch).

The CUBIN itself is cached on disk by the C++ layer (keyed by source and options), so a
new process pays the module load, not NVRTC.
"""

from __future__ import annotations

import threading
from typing import Any

from pygpukit import _native
from pygpukit.backends.devices import current

from . import compile_ahead
from .codegen import KernelSource
from .toolchain import compile_kernel, device_arch, header_pch_options, lean_options

_lock = threading.Lock()
# Keyed by the thread's device too (None: the primary one): a module is loaded into one
# device's context, and its functions launch only there.
_functions: dict[GenKey, Any] = {}
_modules: list[Any] = []  # Functions need their Module alive
stats = {"compiled": 0, "hits": 0}
# Generated kernels round every multiply and add as NumPy does: contracting a * b + c
# into one fma rounds once, which moved linspace's start + step * i below an integer
# (truncated to the wrong int) and off the float64 reference by an ulp elsewhere.
GENERATED_OPTIONS = ("-std=c++17", "--fmad=false")
GenKey = tuple[str, str, int | None]  # (source, arch, device)


def generated_options() -> tuple[str, ...]:
    """The NVRTC options every generated kernel compiles with (their common prelude's
    headers parsed once per process: header_pch_options)."""
    return (*GENERATED_OPTIONS, *lean_options(), *header_pch_options())


def function(src: KernelSource, arch: str | None = None) -> Any:
    arch = arch or device_arch()
    key = (src.text, arch, current.ordinal)
    fn = _functions.get(key)
    if fn is not None:
        stats["hits"] += 1
        return fn
    if compile_ahead.is_collecting():
        compile_ahead.ask(_request(src, arch, key))
        return compile_ahead.DEFERRED
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            cubin = compile_kernel(src.text, arch, generated_options(), src.name + ".cu")
            fn = _load(src, key, cubin)
    return fn


def _load(src: KernelSource, key: GenKey, cubin: bytes) -> Any:
    """The kernel of `cubin`, kept for key (the first one loaded wins); _lock held."""
    fn = _functions.get(key)
    if fn is None:
        mod = _native.Module(cubin)
        fn = mod.get_function(src.name)
        _modules.append(mod)
        _functions[key] = fn
        stats["compiled"] += 1
    return fn


def _request(src: KernelSource, arch: str, key: GenKey) -> compile_ahead.Request:
    """A compile of a generated kernel for compile_ahead."""

    options = generated_options()

    def install(cubin: bytes) -> None:
        with _lock:
            _load(src, key, cubin)

    prelude, body = _split(src.text)
    return compile_ahead.Request(("generated", key), f"{src.name} (generated) for {arch}",
                                 lambda: compile_kernel(src.text, arch, options,
                                                        src.name + ".cu"),
                                 install,
                                 batch=None if body is None else (prelude, arch, options),
                                 batch_part=body, batch_compile=_compile_batch)  # fmt: skip


_KERNEL = 'extern "C" __global__'


def _split(text: str) -> tuple[str, str | None]:
    """(prelude, body) of a generated kernel's source: the text before its first
    `extern "C" __global__` (the helpers every generated kernel opens with) and the rest,
    or body None where the rest holds a preprocessor line (a macro it defined would reach
    the kernels after it in a batch)."""
    at = text.find(_KERNEL)
    if at < 0:
        return text, None
    body = text[at:]
    return text[:at], None if "\n#" in body else body


def _compile_batch(requests: list[compile_ahead.Request]) -> bytes:
    """One CUBIN holding the kernels of generated requests of one batch (same prelude,
    arch and options): the prelude once, then each kernel."""
    prelude, arch, options = requests[0].batch
    name = requests[0].name.split()[0] + f"_and_{len(requests) - 1}.cu"
    return compile_kernel(prelude + "\n".join(r.batch_part for r in requests), arch,
                          options, name)  # fmt: skip
