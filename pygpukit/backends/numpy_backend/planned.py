"""The NumPy side of the planned-execution hooks (PlannedBackend in backends/base.py).

Compiled graphs run inside one pool block (the arena); every value is a NumPy view at a
planned offset, and each kernel writes its result into its slot instead of allocating.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.memory import Storage

from . import movement


class NumpyReplay:
    """What `capture` returns on the CPU: replaying re-executes the planned steps."""

    reads_values = True  # every replay runs the steps from Python

    def __init__(self, run: Callable[[Any], None]) -> None:
        self._run = run

    def replay(self) -> None:
        self._run(None)  # the NumPy backend has no launch context


class PlannedHooks:
    """Mixed into NumpyBackend; the CUDA backend implements the same methods."""

    pool: Any

    def alloc_arena(self, nbytes: int) -> Storage:
        return Storage(self.pool, max(nbytes, 1))

    def value_at(self, arena: Storage, offset: int, shape: tuple[int, ...], dtype: DType) -> Any:
        from .backend import HostValue, host_view

        return HostValue(arena, host_view(arena, offset, shape, dtype))

    def view(self, step: Any, ins: list[Any]) -> Any:
        """The view step over ins[0]'s memory (the memory plan gave it no bytes)."""
        from .backend import HostValue, _run_step

        if step.op == "index":
            # An all-integer index makes NumPy return a scalar copy, not the element's
            # memory; a trailing Ellipsis keeps it a (0-d) view of what the step names.
            spec = movement.index_tuple(step.attrs["spec"], [])
            return HostValue(ins[0].storage, ins[0].array[(*spec, ...)])
        return HostValue(ins[0].storage, _run_step(step, [v.array for v in ins]))

    def copy_into(self, dst: Any, src: Any, launch: Any = None) -> None:
        np.copyto(dst.array, src.array, casting="unsafe")

    def copy_placed(self, dst: Any, src: Any, src_place: Any, nbytes: int) -> None:
        """Copy `src` (place() accepted it) into the contiguous slot `dst`."""
        np.copyto(dst.array, src.array)

    def clone(self, value: Any) -> Any:
        return self.from_numpy(value.array.copy())  # type: ignore[attr-defined]

    def fresh(self, shape: tuple[int, ...], dtype: DType) -> tuple[Any, int]:
        """A new output value, and its block's address (see place)."""
        value = self.empty(shape, dtype)  # type: ignore[attr-defined]
        return value, value.storage.addr

    def place(self, value: Any, shape: tuple[int, ...], dtype: DType) -> Any:
        """The block's address when `value` can stand in for a contiguous slot of this
        shape and dtype, else None (copy it). A NumPy replay reads the values list, so
        nothing is baked in; keying on the address anyway keeps the capture bookkeeping
        (and the fall back to copies) the same as on the GPU."""
        a = value.array
        if a.shape != shape or a.dtype != dtype.np or not a.flags.c_contiguous:
            return None
        return value.storage.addr

    def with_storage(self, value: Any, storage: Any) -> Any:
        from .backend import HostValue

        return HostValue(storage, value.array)

    def capture(self, run: Callable[[Any], None]) -> NumpyReplay:
        return NumpyReplay(run)
