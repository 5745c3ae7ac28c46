"""The CUDA backend: Schedules run as generated and tuned kernels on device memory owned by
the Rust pool. Values are strided views (DeviceValue); launches are asynchronous on one
stream, and the device error word is checked whenever the backend synchronises."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from pygpukit import _native, settings
from pygpukit.ir import DType, dtypes
from pygpukit.memory import Storage, enable_eviction, pin_all, pinned, unpin_all
from pygpukit.passes import Schedule, Step

from ..base import Backend
from . import device_pool, ew, toolchain
from .context import contiguous
from .errorword import WORDS, ErrorWord
from .host_transfer import HostTransfer, PinnedBuffers
from .layout import is_contiguous
from .plan import plan_for, plan_step
from .planned import CudaPlannedHooks
from .value import DeviceValue

POISON_BYTE = 0xFF  # NaN in every float dtype, -1 in every integer one


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
        self._step: Step | None = None
        self._out: DeviceValue | None = None  # the slot execute() hands the running step
        self._exec_plans: dict[Any, Any] = {}
        # While a compiled entry is captured: its scratch blocks, kept alive with its graph.
        self._capture_keep: list[Storage] | None = None
        self._capture_step: Step | None = None
        self.pinned_buffers = PinnedBuffers()  # for to_numpy_async

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        nbytes = math.prod(shape) * dtype.itemsize
        step = self._step
        where = f" at {step.loc}" if step is not None and step.loc else ""
        storage = device_pool.allocate(self.pool, nbytes, f"{what}{where}")
        if self._capture_keep is not None:
            self._capture_keep.append(storage)
        if self.poison and nbytes:
            _native.memset(storage.addr, POISON_BYTE, nbytes, self.stream)
        return DeviceValue(storage, shape, contiguous(shape), 0, dtype)

    def alloc_out(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        o = self._out
        if (
            o is not None
            and o.shape == shape
            and o.dtype == dtype
            and is_contiguous(o.shape, o.strides)
        ):
            self._out = None
            return o
        return self.alloc(shape, dtype, what)

    @contextmanager
    def scratch_only(self) -> Iterator[None]:
        saved, self._out = self._out, None
        try:
            yield
        finally:
            self._out = saved

    def empty(self, shape: tuple[int, ...], dtype: DType) -> DeviceValue:
        return self.alloc(tuple(shape), dtype, "empty")

    def from_numpy(self, array: np.ndarray) -> DeviceValue:
        d = dtypes.as_dtype(array.dtype)
        v = self.alloc(tuple(array.shape), d, "from_numpy")
        if array.size:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            _native.memcpy_htod_async(v.ptr, raw, self.stream)
        return v

    def to_numpy(self, value: DeviceValue) -> np.ndarray:
        src = value
        if not is_contiguous(value.shape, value.strides):
            src = self._copy_contiguous(value)
        out = np.empty(value.size * value.dtype.itemsize, np.uint8)
        if value.size:
            _native.memcpy_dtoh_async(out, src.ptr, self.stream)
        self.synchronize()
        return out.view(value.dtype.np).reshape(value.shape)

    def to_numpy_async(self, value: DeviceValue) -> HostTransfer:
        src = value
        if not is_contiguous(value.shape, value.strides):
            src = self._copy_contiguous(value)
        return HostTransfer(self, src)

    def _copy_contiguous(self, v: DeviceValue) -> DeviceValue:
        launch = ew.make(self, ("in", 0), [v], v.shape, contiguous(v.shape), v.dtype, 256)
        with pinned((v.storage,)):  # allocating the copy must not evict its source
            out = self.alloc(v.shape, v.dtype, "copy")
            launch(out.ptr, [v.ptr])
        return out

    def storage(self, value: DeviceValue) -> Storage:
        return value.storage

    def strides(self, value: DeviceValue) -> tuple[int, ...]:
        return tuple(s * value.dtype.itemsize for s in value.strides)

    def layout_key(self, value: DeviceValue) -> Any:
        # Plans fold strides in, and vector kernels need 16-byte aligned pointers.
        return (value.strides, value.ptr % 16)

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
    def run(self, schedule: Schedule, inputs: Sequence[DeviceValue]) -> list[DeviceValue]:
        key = tuple(self.layout_key(v) for v in inputs)
        plan = plan_for(schedule, key)
        runs = plan.runs
        env: list[DeviceValue | None] = [None] * schedule.n_slots
        for slot, v in zip(schedule.input_slots, inputs, strict=True):
            env[slot] = v
        try:
            for k, step in enumerate(schedule.steps):
                ins = [env[i] for i in step.ins]
                self._step = step
                run = runs[k]
                # Allocating the step's output must not evict (move) its inputs.
                held = pin_all(v.storage for v in ins)  # type: ignore[union-attr]
                try:
                    if run is None:
                        run = runs[k] = plan_step(self, step, ins)  # type: ignore[arg-type]
                    env[step.out] = run(ins)  # type: ignore[arg-type]
                finally:
                    unpin_all(held)
                for s in step.frees:
                    env[s] = None
        finally:
            self._step = None
        return [env[s] for s in schedule.output_slots]  # type: ignore[misc]
