"""PyGPUkit: a small, fast GPU runtime for Python.

import pygpukit as gpk
x = gpk.random.normal((4, 8))
y = gpk.nn.gelu(x @ x.T)      # recorded lazily, fused and run on realize
print(y)
"""

from __future__ import annotations

__version__ = "0.1.0"

import builtins as _builtins
import importlib as _importlib
import typing as _typing

from . import errors, nn, random, settings
from .array import GPUArray, broadcast_to, dynamic_slice, expand_dims, matmul, take
from .compile import compile, scalar, wait_for_compiles  # noqa: A004 - gpk.compile shadows the builtin here
from .creation import (
    arange,
    array,
    asarray,
    empty,
    from_numpy,
    full,
    ones,
    ones_like,
    zeros,
    zeros_like,
)
from .device import Device, copy_to, current_device, device_count
from .errors import (
    AdmissionRejected,
    CompileError,
    CUDAError,
    DeviceMismatchError,
    DTypeError,
    FreedArrayError,
    GPUKitError,
    OutOfMemoryError,
    SettingError,
    ShapeError,
    TraceError,
)
from .errors import IndexError_ as IndexError  # noqa: A001 - gpk.IndexError subclasses the builtin
from .interop import from_dlpack
from .ir.dtypes import DType, bfloat16, float16, float32, float64, int8, int16, int32, int64, uint8
from .ir.dtypes import bool_ as bool  # noqa: A001 - gpk.bool, like numpy's np.bool
from .jit import jit
from .mode import eager, is_eager
from .ops import *  # noqa: F403
from .ops import realize
from .settings import (
    set_backend,
    set_cache_dir,
    set_cache_max_bytes,
    set_compile_cache_size,
    set_debug,
    set_eager,
    set_pdl,
    set_skip_passes,
)
from .streams import Event, Stream, synchronize

if _typing.TYPE_CHECKING:
    from . import distributed, llm
    from .device_query import (
        get_nvrtc_path,
        get_sm_version,
        is_cuda_available,
        is_nvrtc_available,
        validate_compute_capability,
    )
    from .scheduler import Scheduler, Task

# Imported on first use (PEP 562), so `import pygpukit` stays light: name -> (module,
# attribute or None for the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "Scheduler": ("pygpukit.scheduler", "Scheduler"),
    "Task": ("pygpukit.scheduler", "Task"),
    "llm": ("pygpukit.llm", None),
    "distributed": ("pygpukit.distributed", None),
    # The original project's device queries.
    "is_cuda_available": ("pygpukit.device_query", "is_cuda_available"),
    "is_nvrtc_available": ("pygpukit.device_query", "is_nvrtc_available"),
    "get_nvrtc_path": ("pygpukit.device_query", "get_nvrtc_path"),
    "get_sm_version": ("pygpukit.device_query", "get_sm_version"),
    "validate_compute_capability": ("pygpukit.device_query", "validate_compute_capability"),
}


def __getattr__(name: str) -> _typing.Any:
    """gpk.Scheduler, gpk.Task, gpk.llm and the device queries: imported when first
    asked for."""
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'pygpukit' has no attribute {name!r}")
    module = _importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted(set(globals()) | set(_LAZY))


def backend_name() -> str:
    """'cpu' (NumPy) or 'cuda': the backend this process runs on."""
    from .backends import get_backend

    return get_backend().name


def set_tf32(enabled: _builtins.bool) -> None:
    """Let float32 matmuls round inputs to TF32 on the tensor cores (CUDA, cuBLASLt).
    Default off: float32 stays float32. Read at each call, so cached plans follow it."""
    from .backends.cuda import cublaslt

    cublaslt.set_tf32(enabled)


def tf32_enabled() -> _builtins.bool:
    """Whether float32 matmuls may round inputs to TF32 (see set_tf32)."""
    from .backends.cuda import cublaslt

    return cublaslt.tf32_enabled()


def pool_stats() -> dict[str, object]:
    """The Rust pool's counters for the running backend's memory."""
    from .backends import get_backend

    return get_backend().pool_stats()
