"""The CUDA side of the planned-execution hooks (see pygpukit/executor.py): compiled graphs
run inside one arena block, and each step writes into its planned slot.

A compiled entry's steps are recorded once into a CUDA Graph; a call then costs one graph
launch instead of one Python-issued launch per kernel. The graph is launched into the
backend's current stream (the legacy default stream, or a scheduler's stream), so it is
ordered after the uploads and input copies queued before the call and before the lazy ops
and to_numpy that read its results, with no events in between.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

from pygpukit import _native
from pygpukit.errors import OutOfMemoryError
from pygpukit.ir import DType
from pygpukit.memory import Storage, block, pin_all, unpin_all

from . import device_pool, ew
from .context import contiguous
from .layout import is_contiguous
from .plan import plan_step
from .value import DeviceValue

_warned_ops: set[str] = set()  # the fallback warning is given once per op
_contiguous: dict[tuple[int, ...], tuple[int, ...]] = {}  # shape -> its contiguous strides


class CudaReplay:
    """`replay()` has the effect of `run()`. The first replay runs it eagerly on the
    caller's stream (compiling kernels, building cuBLASLt plans and workspaces, so nothing
    inside the capture compiles, allocates from the driver or synchronises), then records
    it on a capture stream of its own (the legacy stream cannot be captured); later replays
    launch the instantiated graph. When capture fails (an op that synchronises), every
    replay re-issues the launches, after a one-time warning."""

    def __init__(self, backend: CudaPlannedHooks, run: Callable[[], None]) -> None:
        self._backend = backend
        self._run = run
        self._exec: Any = None
        self._keep: list[Storage] = []  # scratch the graph writes: must outlive it
        self.num_nodes = 0
        self.replays = 0  # graph launches
        self.eager_runs = 0  # run() called from Python (the first call, or the fallback)
        self.fallback: str | None = None  # why the launches are re-issued, if they are
        # Whether replay() runs the steps from Python, reading the executor's values list
        # (before the capture, or after it failed), rather than launching the graph.
        self.reads_values = True

    @property
    def captured(self) -> bool:
        return self._exec is not None

    def replay(self) -> None:
        b = self._backend
        if self._exec is not None:
            self._exec.launch(b.stream)
            self.replays += 1
            return
        self._run()
        self.eager_runs += 1
        if self.fallback is None:
            self._capture()

    def _capture(self) -> None:
        b = self._backend
        caller = b.stream
        stream = _native.Stream(0, True)
        keep: list[Storage] = []
        b._capture_keep = keep
        b._capture_step = None
        b.stream = stream  # every launch path reads the stream at launch time
        # Relaxed: a pool that must grow inside the capture may call cuMemAlloc, which the
        # stricter modes refuse; a sync on the capturing stream still fails (and falls back).
        stream.begin_capture("relaxed")
        try:
            try:
                self._run()
            finally:
                graph = stream.end_capture()
            exec_ = graph.instantiate()
        except Exception as e:  # noqa: BLE001 - any failure inside capture means: re-issue
            self._give_up(b._capture_step, e)
            return
        finally:
            b.stream = caller
            b._capture_keep = None
        self._keep = pin_all(keep)
        self._exec = exec_
        self.reads_values = False
        self.num_nodes = graph.num_nodes

    def _give_up(self, step: Any, e: Exception) -> None:
        op = getattr(step, "op", "writeback copy" if step is None else str(step))
        loc = getattr(step, "loc", None)
        where = f" at {loc}" if loc else ""
        self.fallback = f"{op}{where}: {type(e).__name__}: {e}"
        if op not in _warned_ops:
            _warned_ops.add(op)
            warnings.warn(
                f"compiled graph could not be captured as a CUDA Graph because of op "
                f"{op!r}{where} ({type(e).__name__}: {e}); its launches are re-issued "
                f"from Python on every call",
                RuntimeWarning,
                stacklevel=4,
            )

    def __del__(self) -> None:
        try:
            unpin_all(self._keep)
        except Exception:  # interpreter shutdown
            pass


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The contiguous element strides of `shape` (cached: asked on every call)."""
    strides = _contiguous.get(shape)
    if strides is None:
        strides = _contiguous[shape] = contiguous(shape)
    return strides


class CudaPlannedHooks:
    pool: Any
    stream: Any
    _out: DeviceValue | None
    _exec_plans: dict[Any, Any]
    _capture_keep: list[Storage] | None
    _capture_step: Any
    launches_issued = 0  # kernels queued from Python for compiled entries; replays add none

    @property
    def capturing(self) -> bool:
        """Whether launches are being recorded into a CUDA graph: every kernel before one of
        them on the stream is then one of the graph's own."""
        return self._capture_keep is not None

    def alloc_arena(self, nbytes: int) -> Storage:
        return device_pool.allocate(self.pool, max(nbytes, 1), "compiled graph arena")

    def value_at(self, arena: Storage, offset: int, shape: tuple[int, ...],
                 dtype: DType) -> DeviceValue:  # fmt: skip
        if offset % dtype.itemsize:
            raise ValueError(f"arena offset {offset} is not a multiple of {dtype.itemsize}")
        return DeviceValue(arena, shape, contiguous(shape), offset // dtype.itemsize, dtype)

    def view(self, step: Any, ins: list[DeviceValue]) -> DeviceValue:
        return self._planned(step, ins)(ins)

    def _planned(self, step: Any, ins: list[DeviceValue]) -> Any:
        key = (id(step), tuple(self.layout_key(v) for v in ins))  # type: ignore[attr-defined]
        run = self._exec_plans.get(key)
        if run is None:
            run = self._exec_plans[key] = (step, plan_step(self, step, ins))  # type: ignore[arg-type]
        return run[1]

    def execute(self, step: Any, ins: list[DeviceValue], out: DeviceValue,
                inplace: bool = False) -> None:  # fmt: skip
        """Run one step writing into `out` (for an in-place setitem, out is ins[0])."""
        self._capture_step = step  # names the op if a capture fails inside it
        self.launches_issued += 1
        run = self._planned(step, ins)
        self._out = out
        try:
            res = run(ins)
        finally:
            self._out = None
        if (res.storage is not out.storage or res.offset != out.offset
                or res.strides != out.strides):  # fmt: skip
            self.copy_into(out, res)
        self._capture_step = None

    def copy_into(self, dst: DeviceValue, src: DeviceValue) -> None:
        if src.ptr == dst.ptr and src.strides == dst.strides and src.dtype == dst.dtype:
            return  # already in its slot
        if (src.dtype == dst.dtype and src.shape == dst.shape
                and is_contiguous(src.shape, src.strides)
                and is_contiguous(dst.shape, dst.strides)):  # fmt: skip
            # A copy engine transfer: no kernel, and no launcher to build per call.
            nbytes = src.size * src.dtype.itemsize
            if nbytes:
                _native.memcpy_dtod_async(dst.ptr, src.ptr, nbytes, self.stream)
            return
        launch = ew.make(self, ("cast", dst.dtype.name, ("in", 0)), [src], dst.shape,  # type: ignore[arg-type]
                         dst.strides, dst.dtype, dst.ptr)  # fmt: skip
        self.launches_issued += 1
        launch(dst.ptr, [src.ptr])

    def clone(self, value: DeviceValue) -> DeviceValue:
        out = self.alloc(value.shape, value.dtype, "clone")  # type: ignore[attr-defined]
        if value.strides == _strides(value.shape):  # an arena slot: one copy-engine transfer
            self.copy_placed(out, value, value.ptr, value.size * value.dtype.itemsize)
        else:
            self.copy_into(out, value)
        return out

    def copy_placed(self, dst: DeviceValue, src: DeviceValue, src_place: int,
                    nbytes: int) -> None:  # fmt: skip
        """Copy `src`, whose place() is src_place, into the contiguous slot `dst` of the
        same shape and dtype: the checks copy_into makes were made by place()."""
        if nbytes and dst.ptr != src_place:
            _native.memcpy_dtod_async(dst.ptr, src_place, nbytes, self.stream)

    def fresh(self, shape: tuple[int, ...], dtype: DType) -> tuple[DeviceValue, int]:
        """A new output block, and the address a capture bakes in for it (alloc() without
        what only matters inside a step: an error location, the capture's scratch list)."""
        if self.poison:  # type: ignore[attr-defined]  # tests: alloc() fills it with NaN
            value = self.alloc(shape, dtype, "compiled output")  # type: ignore[attr-defined]
            return value, value.ptr
        strides = _contiguous.get(shape)
        if strides is None:
            strides = _strides(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        try:
            storage = block(self.pool, nbytes)
        except OutOfMemoryError:  # allocate() releases cached arenas, then names the output
            storage = device_pool.allocate(self.pool, nbytes, "compiled output")
        # Just allocated: resident, and the most recently used (no need for .addr's touch).
        return DeviceValue(storage, shape, strides, 0, dtype), storage._addr

    def place(self, value: DeviceValue, shape: tuple[int, ...], dtype: DType) -> int | None:
        """The address a captured graph bakes in when `value` stands in for a contiguous
        slot of this shape and dtype; None: copy it into the slot."""
        strides = _contiguous.get(shape)
        if strides is None:
            strides = _strides(shape)
        # Identity first: DType's __eq__ is Python code, and this runs per argument per call.
        if (value.strides != strides or value.shape != shape
                or (value.dtype is not dtype and value.dtype != dtype)):  # fmt: skip
            return None
        return value.storage.addr + value.offset * dtype.itemsize

    def with_storage(self, value: DeviceValue, storage: Any) -> DeviceValue:
        return DeviceValue(storage, value.shape, value.strides, value.offset, value.dtype)

    def capture(self, run: Callable[[], None]) -> CudaReplay:
        return CudaReplay(self, run)
