"""Every setting of PyGPUkit: the environment variable, the Python call that sets it for
this process, its default and what it does. This module is the only reader of them.

| Variable                    | Python                     | Default   | Meaning                   |
|-----------------------------|----------------------------|-----------|---------------------------|
| PYGPUKIT_BACKEND            | gpk.set_backend            | auto      | cpu (NumPy) or cuda (1)   |
| PYGPUKIT_EAGER              | gpk.set_eager              | 0         | run each op at once (2)   |
| PYGPUKIT_DEBUG              | gpk.set_debug              | 0         | profile lazy realizes (3) |
| PYGPUKIT_SKIP_PASSES        | gpk.set_skip_passes        | (none)    | passes left out           |
| PYGPUKIT_VALIDATE_PASSES    | (environment only)         | (12)      | check graphs after passes |
| PYGPUKIT_PDL                | gpk.set_pdl                | 1         | PDL launches, SM 9.0+ (4) |
| PYGPUKIT_CACHE_DIR          | gpk.set_cache_dir          | (5)       | kernel cache directory    |
| PYGPUKIT_CACHE_MAX_BYTES    | gpk.set_cache_max_bytes    | 268435456 | its size bound (LRU)      |
| PYGPUKIT_COMPILE_CACHE_SIZE | gpk.set_compile_cache_size | 64        | traces kept per fn (10)   |
| PYGPUKIT_CUBLASLT           | (environment only)         | 1         | 0: no cuBLASLt (6)        |
| PYGPUKIT_FP8_GEMM           | (environment only)         | 1         | FP8 tensor cores (13)     |
| PYGPUKIT_POISON             | (environment only)         | 0         | fill new CUDA memory (7)  |
| PYGPUKIT_KERNEL_DIR         | (environment only)         | (8)       | kernel template directory |
| PYGPUKIT_CPU_DEVICES        | (environment only)         | 1         | simulated devices (11)    |
| PYGPUKIT_CPU_DEVICE_MEMORY  | (environment only)         | (none)    | each one's quota (11)     |
| PGK_GIT_COMMIT              | (environment only)         | git       | commit in bench results   |
| PYGPUKIT_RUST_PREBUILT      | CMake -D (build time)      | (none)    | prebuilt _rust (9)        |

1. Auto is cuda when an SM80+ GPU is usable, else cpu. Read once, when the first array
   needs a backend; gpk.set_backend after that raises SettingError.
2. As inside `with gpk.eager():`, wherever no such block says otherwise.
3. The per-kernel table of `pygpukit graph profile`, on stderr (host timers on the CPU).
4. Programmatic dependent launch: each kernel may start while the one before it
   finishes, then waits on it.
5. $XDG_CACHE_HOME/pygpukit/kernels, else ~/.cache/pygpukit/kernels.
6. The NVRTC GEMM serves instead. Read when cuBLASLt would first load.
7. With 0xFF bytes: NaN in every float dtype, -1 in every integer one: exposes reads of
   unwritten memory. Read when the CUDA backend starts.
8. The templates that ship with the package. The directory must hold common.cuh.
   Read when the first template loads.
9. `-DPYGPUKIT_RUST_PREBUILT=path` (or scikit-build's cmake.define): install that _rust
   library instead of running cargo. Not read at run time.
10. Signatures (traces) a @gpk.compile function keeps, least recently used evicted first
   with their buffers and captured graphs; `gpk.compile(fn, cache_size=n)` sets one
   function's. Read when a function's cache fills.
11. The CPU backend's devices (`gpk.Device("cpu:1")`, `gpk.device_count()`), each with
   its own pool, and that pool's quota in bytes (none: unbounded): multi-device code,
   its mixing errors, copies and per-device admission run without a GPU. Read when a
   device is first counted or used.
12. Whether the pass pipeline validates the graph after every pass (about a third of its
   time): on when PYGPUKIT_DEBUG is, else off; the test suite turns it on. Read at the
   first pipeline run and kept, as DEBUG.
13. A linear with FP8 weights (block or per-row scales; 9 rows of x or more) or int4
   weights of group 128 (17 or more: prefill, batched decode) multiplies on the FP8 tensor
   cores through cuBLASLt, x quantized to e4m3 per 128 columns or per row as vLLM and
   transformers do (SM 9.0, cuBLASLt 12.9+); 0: the quantized GEMV up to 16 rows, then
   the weight dequantized into x's dtype, x as it is. Read when such a linear is planned.

Flags take 1/0 (also true/false, yes/no, on/off); an empty variable is the default.
Values are read from the environment when they are used, so a change to os.environ made
before that point takes effect; the four consulted for every op or realize (EAGER, DEBUG,
SKIP_PASSES, VALIDATE_PASSES) are read at their first use and kept (`settings.reload()`
reads them again). A `set_*` call overrides the environment for this process and
`set_*(None)` hands the setting back to it. A value a setting cannot take raises
SettingError (a ValueError) naming the variable.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from pygpukit.errors import SettingError

BACKEND = "PYGPUKIT_BACKEND"
EAGER = "PYGPUKIT_EAGER"
DEBUG = "PYGPUKIT_DEBUG"
SKIP_PASSES = "PYGPUKIT_SKIP_PASSES"
VALIDATE_PASSES = "PYGPUKIT_VALIDATE_PASSES"
PDL = "PYGPUKIT_PDL"
CACHE_DIR = "PYGPUKIT_CACHE_DIR"
CACHE_MAX_BYTES = "PYGPUKIT_CACHE_MAX_BYTES"
COMPILE_CACHE_SIZE = "PYGPUKIT_COMPILE_CACHE_SIZE"
CUBLASLT = "PYGPUKIT_CUBLASLT"
FP8_GEMM = "PYGPUKIT_FP8_GEMM"
POISON = "PYGPUKIT_POISON"
KERNEL_DIR = "PYGPUKIT_KERNEL_DIR"
GIT_COMMIT = "PGK_GIT_COMMIT"
CPU_DEVICES = "PYGPUKIT_CPU_DEVICES"
CPU_DEVICE_MEMORY = "PYGPUKIT_CPU_DEVICE_MEMORY"

DEFAULT_CACHE_MAX_BYTES = 256 << 20
DEFAULT_COMPILE_CACHE_SIZE = 64
BACKENDS = ("cpu", "cuda")

# Values set from Python, by variable name; they win over the environment.
_overrides: dict[str, object] = {}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def _flag(name: str, default: bool) -> bool:
    if name in _overrides:
        return bool(_overrides[name])
    raw = _raw(name)
    if not raw:
        return default
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def _set(name: str, value: object) -> None:
    if value is None:
        _overrides.pop(name, None)
    else:
        _overrides[name] = value
    EAGER_NOW[0] = None  # eager() computes it again
    CHANGES[0] += 1


def _check_flag(setter: str, enabled: bool | None) -> bool | None:
    if enabled is not None and not isinstance(enabled, bool):
        raise SettingError(f"{setter}: expected True, False or None, got {enabled!r}")
    return enabled


# -- backend ----------------------------------------------------------------------------


def backend() -> str:
    """'cpu' or 'cuda' when one was asked for (gpk.set_backend or PYGPUKIT_BACKEND), else ''
    (auto: cuda when usable)."""
    if BACKEND in _overrides:
        return str(_overrides[BACKEND])
    raw = _raw(BACKEND)
    want = raw.lower()
    if want not in ("",) + BACKENDS:
        raise SettingError(f"{BACKEND}={raw!r}: expected 'cpu' or 'cuda'")
    return want


def set_backend(name: str | None) -> None:
    """Run this process on `name`: 'cpu' (NumPy) or 'cuda'; None goes back to
    PYGPUKIT_BACKEND (or auto). Call it before the first array is made: a different backend
    already in use raises SettingError."""
    if name is not None:
        if not isinstance(name, str) or name.strip().lower() not in BACKENDS:
            raise SettingError(f"set_backend: expected 'cpu' or 'cuda', got {name!r}")
        name = name.strip().lower()
    active = _active_backend()
    if active is not None and name != active:
        raise SettingError(
            f"set_backend({name!r}): the {active} backend is already in use; a process runs on "
            "one backend, so call set_backend before the first array is made"
        )
    _set(BACKEND, name)


def prefer_backend(name: str) -> None:
    """Run on `name` unless a backend was asked for or one already runs: for commands that
    need no GPU (tracing, the tiny model) but should follow an explicit choice."""
    if not backend() and _active_backend() is None:
        set_backend(name)


def _active_backend() -> str | None:
    # sys.modules, not an import: a backends module nobody imported has chosen nothing.
    backends = sys.modules.get("pygpukit.backends")
    return None if backends is None else backends.active_backend_name()


# -- execution --------------------------------------------------------------------------


# Settings consulted on every recorded op or realize (EAGER, DEBUG, SKIP_PASSES,
# VALIDATE_PASSES): their environment value is read once, at first use, and kept here;
# reload() reads them again.
_kept: dict[str, object] = {}


def _kept_value(name: str, read: Callable[[], object]) -> object:
    if name in _overrides:
        return _overrides[name]
    if name not in _kept:
        _kept[name] = read()
    return _kept[name]


def reload() -> None:
    """Read the environment again for the settings kept from their first read
    (PYGPUKIT_EAGER, PYGPUKIT_DEBUG, PYGPUKIT_SKIP_PASSES, PYGPUKIT_VALIDATE_PASSES): after
    this process changed
    os.environ."""
    _kept.clear()
    EAGER_NOW[0] = None
    CHANGES[0] += 1


# Bumped by every set_* call and reload(): the native eager hits (eager_ops.NATIVE) drop
# their entries when it moved (their keys hold the skipped passes, and debug() is off).
CHANGES = [0]

# eager()'s answer, kept until a set_* call or reload() (None: not computed since): the
# lazy recording path (array.binary) reads it inline on every recorded op, with no call.
EAGER_NOW: list[bool | None] = [None]


def eager() -> bool:
    """Whether ops run at once where no `gpk.eager()` block says otherwise (PYGPUKIT_EAGER,
    read at the first op; gpk.set_eager changes it later)."""
    now = EAGER_NOW[0]
    if now is None:
        if EAGER in _overrides:
            now = bool(_overrides[EAGER])
        else:
            kept = _kept.get(EAGER)
            if kept is None:
                kept = _kept[EAGER] = _flag(EAGER, False)
            now = bool(kept)
        EAGER_NOW[0] = now
    return now


def set_eager(enabled: bool | None) -> None:
    """Run every op at once (True) or record lazily (False) by default in this process;
    `with gpk.eager(...)` blocks still decide inside them. None: PYGPUKIT_EAGER again."""
    _set(EAGER, _check_flag("set_eager", enabled))


def debug() -> bool:
    """Whether every lazy realize prints its profile table on stderr (PYGPUKIT_DEBUG, read
    at the first realize; gpk.set_debug changes it later)."""
    if DEBUG in _overrides:  # read on every eager op: no helper call, no closure
        return bool(_overrides[DEBUG])
    kept = _kept.get(DEBUG)
    if kept is None:
        kept = _kept[DEBUG] = _flag(DEBUG, False)
    return bool(kept)


def set_debug(enabled: bool | None) -> None:
    """Print the profile table of every lazy realize (True). None: PYGPUKIT_DEBUG again."""
    _set(DEBUG, _check_flag("set_debug", enabled))


def validate_passes() -> bool:
    """Whether the pass pipeline checks the graph after every pass
    (PYGPUKIT_VALIDATE_PASSES; by default on exactly when debug() is)."""
    kept = _kept_value(
        VALIDATE_PASSES, lambda: _flag(VALIDATE_PASSES, False) if _raw(VALIDATE_PASSES) else None
    )
    return debug() if kept is None else bool(kept)


def skip_passes() -> frozenset[str]:
    """The pass names left out of the pipeline (PYGPUKIT_SKIP_PASSES, comma-separated).
    Unknown names are the pipeline's to reject: it knows the passes."""
    names = _overrides.get(SKIP_PASSES)
    if names is None:
        names = _kept.get(SKIP_PASSES)
        if names is None:
            raw = _raw(SKIP_PASSES).split(",")
            names = _kept[SKIP_PASSES] = tuple(s.strip() for s in raw if s.strip())
    # Part of every eager key and realize key: one frozenset per distinct tuple of names.
    frozen = _FROZEN.get(names)
    if frozen is None:
        if len(_FROZEN) > 64:
            _FROZEN.clear()
        frozen = _FROZEN[names] = frozenset(cast(tuple[str, ...], names))
    return frozen


_FROZEN: dict[object, frozenset[str]] = {}


def set_skip_passes(names: Iterable[str] | None) -> None:
    """Leave these passes (by name, e.g. ['fuse_kv_append']) out of the pipeline, to measure
    what one is worth. An empty list runs them all; None: PYGPUKIT_SKIP_PASSES again."""
    if names is None:
        _set(SKIP_PASSES, None)
        return
    if isinstance(names, str):
        raise SettingError(f"set_skip_passes: expected a list of pass names, got {names!r}")
    listed = tuple(names)
    if not all(isinstance(n, str) and n.strip() for n in listed):
        raise SettingError(f"set_skip_passes: expected pass names, got {list(listed)!r}")
    _set(SKIP_PASSES, tuple(n.strip() for n in listed))


@contextlib.contextmanager
def also_skipping(names: Iterable[str]) -> Iterator[None]:
    """Leave these passes out as well, inside the block (`pygpukit graph dump --skip`)."""
    saved = _overrides.get(SKIP_PASSES)
    set_skip_passes(dict.fromkeys([*sorted(skip_passes()), *names]))
    try:
        yield
    finally:
        _set(SKIP_PASSES, saved)


def skip_passes_source() -> str:
    """Where skip_passes() came from, for error messages."""
    return "gpk.set_skip_passes" if SKIP_PASSES in _overrides else SKIP_PASSES


# -- CUDA -------------------------------------------------------------------------------


def pdl() -> bool:
    """Whether kernels launch as programmatic dependents on SM 9.0+ (PYGPUKIT_PDL)."""
    return _flag(PDL, True)


def set_pdl(enabled: bool | None) -> None:
    """Launch kernels as programmatic dependents on SM 9.0+ (True, the default) or not.
    None: PYGPUKIT_PDL again."""
    _set(PDL, _check_flag("set_pdl", enabled))


def cublaslt() -> bool:
    """Whether cuBLASLt may be loaded (PYGPUKIT_CUBLASLT=0 says no)."""
    return _flag(CUBLASLT, True)


def fp8_gemm() -> bool:
    """Whether linears with FP8 or int4 g128 weights may take the FP8 tensor cores,
    quantizing x (PYGPUKIT_FP8_GEMM=0 says no)."""
    return _flag(FP8_GEMM, True)


def poison() -> bool:
    """Whether new CUDA allocations are filled with 0xFF (PYGPUKIT_POISON)."""
    return _flag(POISON, False)


def kernel_dir() -> str | None:
    """The kernel template directory asked for (PYGPUKIT_KERNEL_DIR), or None."""
    return _raw(KERNEL_DIR) or None


def cache_dir() -> str | None:
    """The kernel cache directory asked for (gpk.set_cache_dir or PYGPUKIT_CACHE_DIR), or None
    for the default ($XDG_CACHE_HOME/pygpukit/kernels, else ~/.cache/pygpukit/kernels)."""
    if CACHE_DIR in _overrides:
        return str(_overrides[CACHE_DIR])
    return _raw(CACHE_DIR) or None


def set_cache_dir(path: str | os.PathLike[str] | None) -> None:
    """Keep compiled kernels in `path` (created with mode 0700 on first use). None:
    PYGPUKIT_CACHE_DIR again, or the default."""
    if path is not None:
        path = os.fspath(path)
        if not isinstance(path, str) or not path:
            raise SettingError(f"set_cache_dir: expected a directory path, got {path!r}")
    _set(CACHE_DIR, path)


def cache_max_bytes() -> int:
    """The size bound of the kernel cache directory (PYGPUKIT_CACHE_MAX_BYTES)."""
    n = _overrides.get(CACHE_MAX_BYTES)
    if isinstance(n, int):
        return n
    raw = _raw(CACHE_MAX_BYTES)
    if not raw:
        return DEFAULT_CACHE_MAX_BYTES
    if not raw.isdigit():
        raise SettingError(f"{CACHE_MAX_BYTES}={raw!r}: expected a number of bytes (0 or more)")
    return int(raw)


def set_cache_max_bytes(n: int | None) -> None:
    """Bound the kernel cache directory to `n` bytes (least recently used entries go first).
    None: PYGPUKIT_CACHE_MAX_BYTES again, or 256 MiB."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise SettingError(f"set_cache_max_bytes: expected a number of bytes >= 0, got {n!r}")
    _set(CACHE_MAX_BYTES, n)


def compile_cache_size() -> int:
    """Cache entries (signatures) a @gpk.compile function keeps when it names none
    (PYGPUKIT_COMPILE_CACHE_SIZE, default 64)."""
    n = _overrides.get(COMPILE_CACHE_SIZE)
    if isinstance(n, int):
        return n
    raw = _raw(COMPILE_CACHE_SIZE)
    if not raw:
        return DEFAULT_COMPILE_CACHE_SIZE
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(
            f"{COMPILE_CACHE_SIZE}={raw!r}: expected a number of entries (1 or more)"
        )
    return int(raw)


def set_compile_cache_size(n: int | None) -> None:
    """Keep `n` signatures per @gpk.compile function (least recently used evicted first).
    None: PYGPUKIT_COMPILE_CACHE_SIZE again, or 64."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise SettingError(f"set_compile_cache_size: expected a number of entries >= 1, got {n!r}")
    _set(COMPILE_CACHE_SIZE, n)


def cpu_devices() -> int:
    """How many devices the CPU backend simulates (PYGPUKIT_CPU_DEVICES, default 1)."""
    raw = _raw(CPU_DEVICES)
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(f"{CPU_DEVICES}={raw!r}: expected a number of devices (1 or more)")
    return int(raw)


def cpu_device_memory() -> int | None:
    """The pool quota of each simulated CPU device in bytes (PYGPUKIT_CPU_DEVICE_MEMORY),
    or None: unbounded."""
    raw = _raw(CPU_DEVICE_MEMORY)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(f"{CPU_DEVICE_MEMORY}={raw!r}: expected a number of bytes (1 or more)")
    return int(raw)


def git_commit() -> str | None:
    """The commit bench results record when the tree has no .git (PGK_GIT_COMMIT), or None."""
    return _raw(GIT_COMMIT) or None


__all__ = [
    "BACKENDS", "DEFAULT_CACHE_MAX_BYTES", "DEFAULT_COMPILE_CACHE_SIZE", "backend", "cache_dir",
    "cache_max_bytes", "compile_cache_size", "cpu_device_memory", "cpu_devices", "cublaslt",
    "debug", "eager", "fp8_gemm", "git_commit",
    "kernel_dir", "pdl", "poison", "prefer_backend", "set_backend", "set_cache_dir",
    "set_cache_max_bytes", "set_compile_cache_size", "set_debug", "set_eager", "set_pdl",
    "set_skip_passes", "skip_passes", "skip_passes_source", "validate_passes",
]  # fmt: skip
