"""PyGPUkit: a small, fast GPU runtime for Python.

import pygpukit as gpk
x = gpk.random.normal((4, 8))
y = gpk.nn.gelu(x @ x.T)      # recorded lazily, fused and run on realize
print(y)
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors, nn, random
from .array import GPUArray, broadcast_to, expand_dims, matmul, take
from .compile import compile, scalar  # noqa: A004 - gpk.compile shadows the builtin here
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
from .errors import (
    AdmissionRejected,
    CompileError,
    CUDAError,
    DTypeError,
    FreedArrayError,
    GPUKitError,
    OutOfMemoryError,
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
from .scheduler import Scheduler, Task
from .streams import Event, Stream, synchronize


def backend_name() -> str:
    """'cpu' (NumPy) or 'cuda': the backend this process runs on."""
    from .backends import get_backend

    return get_backend().name


def set_tf32(enabled: bool) -> None:
    """Let float32 matmuls round inputs to TF32 on the tensor cores (CUDA, cuBLASLt).
    Default off: float32 stays float32. Read at each call, so cached plans follow it."""
    from .backends.cuda import cublaslt

    cublaslt.set_tf32(enabled)


def tf32_enabled() -> bool:
    from .backends.cuda import cublaslt

    return cublaslt.tf32_enabled()


def pool_stats() -> dict[str, object]:
    from .backends import get_backend

    return get_backend().pool_stats()


from . import llm  # noqa: E402 - last: gpk.llm is written on the API above
