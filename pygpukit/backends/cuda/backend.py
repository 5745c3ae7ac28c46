"""The CUDA backend: Schedules run as generated and tuned kernels on device memory owned by
the Rust pool. Values are strided views (DeviceValue); launches are asynchronous on one
stream, and the device error word is checked whenever the backend synchronises."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit import _native, settings
from pygpukit.executor import run_schedule
from pygpukit.ir import DType, dtypes
from pygpukit.memory import Storage, enable_eviction, pinned
from pygpukit.passes import Schedule

from ..base import Backend
from . import cublaslt, device_pool, ew, toolchain, transfers
from .context import Launch, StepContext, contiguous
from .dispatch import NativeDispatch, align
from .errorword import WORDS, ErrorWord
from .host_transfer import HostTransfer
from .layout import is_contiguous
from .plan import plan_for
from .planned import CudaPlannedHooks
from .value import DeviceValue

POISON_BYTE = 0xFF  # NaN in every float dtype, -1 in every integer one
# Uploads up to this size (a decode step's positions, token ids, sampling parameters) go
# at high priority: the step waits for them, while bulk copies can wait a chunk.
SMALL_UPLOAD_BYTES = 4096
Progress = Callable[[int], None]  # called with the bytes copied since the last call
# Bulk loads (from_numpy_groups) of at least this many bytes are staged on several threads
# (transfers.upload_staged); below it the pinned buffers would cost more than they save.
STAGED_UPLOAD_BYTES = 64 << 20


class CudaBackend(CudaPlannedHooks, Backend):
    name = "cuda"

    def __init__(self, arena_bytes: int = 256 << 20, quota_bytes: int | None = None) -> None:
        self.pool = device_pool.make_pool(arena_bytes, quota_bytes)
        self.stream: Any = None  # the legacy default stream: ordered with torch/CuPy defaults
        self.sm_count = toolchain.sm_count()
        self.poison = settings.poison()
        enable_eviction(self.pool, device_pool.copy_out, device_pool.copy_in)
        err = device_pool.allocate(self.pool, WORDS * 8, "error word")
        err.pin()  # kernels are planned with its address: it never moves
        self._err = ErrorWord(err)
        self._exec_plans: dict[Any, Any] = {}  # a compiled program's: (id(step), layouts)
        self._collected: weakref.WeakSet[Any] = weakref.WeakSet()  # CudaPlannedHooks's
        # Cached schedules replayed by the Rust controller (None: off); not used while new
        # outputs must be poisoned (the general path's alloc() fills them).
        self.native: NativeDispatch | None = NativeDispatch(self)
        cublaslt.warm_in_background()

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str,
              launch: Launch | None = None) -> DeviceValue:  # fmt: skip
        """A new contiguous block; inside a CUDA graph recording (launch.keep) one the
        graph keeps, spare again once the value dies (Launch.recorded_block)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if launch is not None and launch.keep is not None:
            pool = self.pool
            storage: Storage = launch.recorded_block(
                nbytes, lambda n: device_pool.allocate(pool, n, what)
            )
        else:
            storage = device_pool.allocate(self.pool, nbytes, what)
        if self.poison and nbytes:
            stream = self.stream if launch is None else launch.stream
            _native.memset(storage.addr, POISON_BYTE, nbytes, stream)
        return DeviceValue(storage, shape, contiguous(shape), 0, dtype)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> DeviceValue:
        return self.alloc(tuple(shape), dtype, "empty")

    def from_numpy(self, array: np.ndarray, priority: str | None = None) -> DeviceValue:
        """A device copy of `array`, uploaded by the transfer engine: ordered before the
        work queued on the backend's stream from now on, without waiting for the DMA.
        Priority: high up to SMALL_UPLOAD_BYTES, else normal, unless given."""
        d = dtypes.as_dtype(array.dtype)
        v = self.alloc(tuple(array.shape), d, "from_numpy")
        if array.size:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            if priority is None:
                priority = "high" if raw.nbytes <= SMALL_UPLOAD_BYTES else "normal"
            transfers.upload(v.ptr, raw, self.stream, priority)
        return v

    def from_numpy_bulk(self, array: np.ndarray) -> DeviceValue:
        """from_numpy at low priority (model loading): urgent copies go first."""
        return self.from_numpy(array, "low")

    def from_numpy_rows(self, parts: Sequence[np.ndarray]) -> DeviceValue:
        """The parts concatenated along axis 0 in one new block: each part uploaded into
        its rows at low priority (no device concatenation, no wait)."""
        rows = sum(p.shape[0] for p in parts)
        v = self.alloc((rows, *parts[0].shape[1:]), dtypes.as_dtype(parts[0].dtype),
                       "from_numpy")  # fmt: skip
        at = v.ptr
        for p in parts:
            if p.size:
                raw = np.ascontiguousarray(p).reshape(-1).view(np.uint8)
                transfers.upload(at, raw, self.stream, "low")
            at += p.nbytes
        return v

    def from_numpy_groups(self, groups: Sequence[Sequence[np.ndarray]],
                          progress: Progress | None = None) -> list[DeviceValue]:  # fmt: skip
        """Each group's parts concatenated along axis 0 in one new block; all the copies
        staged on several threads at once (transfers.upload_staged) once they reach
        STAGED_UPLOAD_BYTES, else queued one by one at low priority. Returns once the
        host sources have been read: they may be closed."""
        values, jobs = [], []
        for parts in groups:
            rows = sum(p.shape[0] for p in parts) if parts[0].ndim else 1
            shape = (rows, *parts[0].shape[1:]) if parts[0].ndim else ()
            v = self.alloc(shape, dtypes.as_dtype(parts[0].dtype), "from_numpy")
            values.append(v)
            at = v.ptr
            for p in parts:
                if p.size:
                    jobs.append((at, np.ascontiguousarray(p).reshape(-1).view(np.uint8)))
                at += p.nbytes
        if sum(raw.nbytes for _, raw in jobs) >= STAGED_UPLOAD_BYTES:
            transfers.upload_staged(jobs, self.stream, progress)
            return values
        for at, raw in jobs:
            transfers.upload(at, raw, self.stream, "low")
            if progress is not None:
                progress(raw.nbytes)
        return values

    def to_numpy(self, value: DeviceValue) -> np.ndarray:
        src = value
        if not is_contiguous(value.shape, value.strides):
            src = self._copy_contiguous(value)
        out = np.empty(value.size * value.dtype.itemsize, np.uint8)
        if value.size:
            transfers.download(out, src.ptr, self.stream).wait()
        self.synchronize()
        return out.view(value.dtype.np).reshape(value.shape)

    def to_numpy_async(self, value: DeviceValue) -> HostTransfer:
        src = value
        if not is_contiguous(value.shape, value.strides):
            src = self._copy_contiguous(value)
        return HostTransfer(self, src)

    def _copy_contiguous(self, v: DeviceValue) -> DeviceValue:
        launch = ew.make(StepContext(self), ("in", 0), [v], v.shape, contiguous(v.shape), v.dtype,
                         256)  # fmt: skip
        with pinned((v.storage,)):  # allocating the copy must not evict its source
            out = self.alloc(v.shape, v.dtype, "copy")
            launch(out.ptr, [v.ptr])
        return out

    def storage(self, value: DeviceValue) -> Storage:
        return value.storage

    def strides(self, value: DeviceValue) -> tuple[int, ...]:
        return tuple(s * value.dtype.itemsize for s in value.strides)

    def layout_key(self, value: DeviceValue) -> Any:
        # Plans fold strides in, and vector kernels need 16-byte aligned pointers. align()
        # reads the address without touching the block (a pool call every op): eviction
        # moves a block only to another 256-byte aligned one.
        return (value.strides, align(value))

    def pool_stats(self) -> dict[str, Any]:
        return dict(self.pool.stats())

    # -- context for planners -------------------------------------------------------------
    @property
    def err_addr(self) -> int:
        return self._err.addr

    def tag(self, op: str, inputs: list[tuple[tuple[int, ...], Any]], loc: Any) -> int:
        return self._err.tag(op, inputs, loc)

    def synchronize(self) -> None:
        _native.synchronize()
        self._err.check()

    # -- execution ------------------------------------------------------------------------
    def run(self, schedule: Schedule, inputs: Sequence[Any]) -> list[Any]:
        """Backend.run: through the dispatch controller when the schedule's launches for
        these input layouts are recorded (or recordable now), else run_schedule."""
        native = self.native
        if native is not None and not self.poison:
            out = native.run(schedule, inputs)
            if out is not None:
                return out
        return run_schedule(self, schedule, inputs)

    def eager_replay(self, schedule: Schedule, inputs: Sequence[Any]) -> Any:
        """Backend.eager_replay: the controller's recorded plan of the schedule for these
        inputs' layouts (dispatch.EagerReplay); None while there is none, or while the
        controller is off or bypassed."""
        native = self.native
        if native is None or self.poison:
            return None
        return native.eager_replay(schedule, inputs)

    def new_launch(self, schedule: Schedule, inputs: Sequence[DeviceValue]) -> Launch:
        """Launches on the current stream; each step of `schedule` is planned once for its
        inputs' layouts (cached with the schedule)."""
        key = tuple(self.layout_key(v) for v in inputs)
        return Launch(self.stream, plans=plan_for(schedule, key))
