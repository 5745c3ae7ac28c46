"""The CUDA side of the planned-execution hooks (see pygpukit/executor.py): compiled graphs
run inside one arena block, and each step writes into its planned slot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygpukit.ir import DType
from pygpukit.memory import Storage

from . import device_pool, ew
from .context import contiguous
from .plan import plan_step
from .value import DeviceValue


class CudaReplay:
    """Replays the planned steps: every launch is already planned, so a replay is the
    launches alone, queued asynchronously."""

    def __init__(self, run: Callable[[], None]) -> None:
        self._run = run

    def replay(self) -> None:
        self._run()


class CudaPlannedHooks:
    pool: Any
    _out: DeviceValue | None
    _exec_plans: dict[Any, Any]

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
        run = self._planned(step, ins)
        self._out = out
        try:
            res = run(ins)
        finally:
            self._out = None
        if (res.storage is not out.storage or res.offset != out.offset
                or res.strides != out.strides):  # fmt: skip
            self.copy_into(out, res)

    def copy_into(self, dst: DeviceValue, src: DeviceValue) -> None:
        launch = ew.make(self, ("cast", dst.dtype.name, ("in", 0)), [src], dst.shape,  # type: ignore[arg-type]
                         dst.strides, dst.dtype, dst.ptr)  # fmt: skip
        launch(dst.ptr, [src.ptr])

    def clone(self, value: DeviceValue) -> DeviceValue:
        out = self.alloc(value.shape, value.dtype, "clone")  # type: ignore[attr-defined]
        self.copy_into(out, value)
        return out

    def with_storage(self, value: DeviceValue, storage: Any) -> DeviceValue:
        return DeviceValue(storage, value.shape, value.strides, value.offset, value.dtype)

    def capture(self, run: Callable[[], None]) -> CudaReplay:
        return CudaReplay(run)
