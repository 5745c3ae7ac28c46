"""The backend interface: allocate, copy in/out, run a lowered Schedule.

`PlannedBackend` is the contract between pygpukit/executor.py, which runs every Schedule
(a lazy realize and a compiled call alike), and a backend. `Backend` declares it (so a
backend that lacks a hook, or has one with another signature, is a mypy error where it is
instantiated or defined), plus the host transfers and layout queries the rest of the
package uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from pygpukit.executor import run_schedule
from pygpukit.ir import DType
from pygpukit.memory import Storage
from pygpukit.passes import Schedule, Step


class Replayable(Protocol):
    """What capture() returns: replay() has the effect of the captured run."""

    # False while replay() launches a recording that holds the addresses it was made
    # with (CUDA, once captured); True while it runs the steps from Python, reading the
    # executor's values list.
    reads_values: bool

    def replay(self) -> None:
        """Run once more (a graph launch, or the steps from Python)."""
        ...


class PlannedBackend(Protocol):
    """The hooks the executor runs a Schedule through. `launch` is the run's launch
    context, made by new_launch() (a run from Python now) or handed to the function a
    capture records: the backend's own (CUDA: the stream, and while a graph is recorded,
    the blocks it must keep alive; NumPy: None); the executor only passes it along.
    Abstract: a Backend lacking a hook cannot be made (and mypy says so where it is)."""

    pool: Any

    def eager_replay(self, schedule: Schedule, inputs: Sequence[Any]) -> Any:
        """What an eager op's hits may call instead of run(schedule, inputs) for inputs of
        these layouts (eager_ops.py): a callable taking the inputs and returning the one
        output value, or None to take run() this time; None while there is none yet, False
        when there never will be (here: no backend-side replay)."""
        return False

    @abstractmethod
    def storage(self, value: Any) -> Storage:
        """The pool block behind a value (several views may share one)."""
        ...

    @abstractmethod
    def new_launch(self, schedule: Schedule, inputs: Sequence[Any]) -> Any:
        """The launch context of a lazy run of `schedule` on these inputs, from Python now
        (it may carry launch plans cached with the schedule)."""
        ...

    @abstractmethod
    def execute(self, step: Step, ins: list[Any], out: Any, inplace: bool,
                launch: Any = None) -> Any:  # fmt: skip
        """Run one step and return its value. out=None: the lazy policy, the step allocates
        its result (a view step returns a view of ins[0]); else it writes into `out`, a
        contiguous planned slot, and returns it (inplace: a setitem writing ins[0], which
        `out` is). launch=None: a lone step run from Python now (the profiler's)."""
        ...

    @abstractmethod
    def alloc_arena(self, nbytes: int) -> Storage:
        """One pool allocation holding a compiled graph's planned values."""
        ...

    @abstractmethod
    def value_at(self, arena: Storage, offset: int, shape: tuple[int, ...],
                 dtype: DType) -> Any:  # fmt: skip
        """A contiguous value at `offset` bytes into `arena`."""
        ...

    @abstractmethod
    def view(self, step: Step, ins: list[Any]) -> Any:
        """A view step (reshape/permute/expand/static index/after) over ins[0]'s memory,
        never a copy: the memory plan gave it no bytes of its own."""
        ...

    @abstractmethod
    def copy_into(self, dst: Any, src: Any, launch: Any = None) -> None:
        """Copy (casting) src into dst: inputs in, writebacks out."""
        ...

    @abstractmethod
    def copy_placed(self, dst: Any, src: Any, src_place: Any, nbytes: int) -> None:
        """Copy `src`, which place() accepted as src_place, into the contiguous slot
        `dst` of the same shape and dtype: no checks left to make."""
        ...

    @abstractmethod
    def clone(self, value: Any) -> Any:
        """A fresh pool copy of the value (outputs the caller owns)."""
        ...

    @abstractmethod
    def fresh(self, shape: tuple[int, ...], dtype: DType) -> tuple[Any, Any]:
        """A new contiguous pool value (an output the graph writes directly) and its key
        as place() gives it."""
        ...

    @abstractmethod
    def place(self, value: Any, shape: tuple[int, ...], dtype: DType) -> Any:
        """How a graph can read `value` in place of a contiguous slot of this shape and
        dtype: a hashable key of what a capture bakes in (CUDA: the address of its first
        element; NumPy: its block's address), or None: copy it into the slot."""
        ...

    @abstractmethod
    def with_storage(self, value: Any, storage: Storage) -> Any:
        """The same view over another Storage object (a static output's slot)."""
        ...

    @abstractmethod
    def capture(self, run: Callable[[Any], None]) -> Replayable:
        """A replayable whose replay() has the effect of run(launch) (NumPy calls it;
        CUDA records the launches once into a CUDA Graph)."""
        ...


class ReadyTransfer:
    """A host copy that is already complete (backends without queued work)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def done(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        return self._array


class Backend(PlannedBackend, ABC):
    name: str
    ordinal: int = 0  # the device this backend's memory and work are on

    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Any:
        """A backend value holding a copy of `array`."""

    def from_numpy_bulk(self, array: np.ndarray) -> Any:
        """As from_numpy, for bulk copies (model loading) that a backend with copy
        priorities queues behind urgent ones."""
        return self.from_numpy(array)

    def from_numpy_rows(self, parts: Sequence[np.ndarray]) -> Any:
        """A backend value holding the parts (one dtype, the same trailing shape)
        concatenated along axis 0, each copied into its rows of one new block, as a bulk
        copy (model loading: a fused weight from its checkpoint tensors). This default
        concatenates on the host."""
        return self.from_numpy_bulk(np.concatenate(parts))

    def from_numpy_groups(self, groups: Sequence[Sequence[np.ndarray]],
                          progress: Callable[[int], None] | None = None) -> list[Any]:  # fmt: skip
        """from_numpy_rows of each group (a one-part group: from_numpy_bulk), as one bulk
        load that a backend may copy on several threads at once (model loading);
        progress(nbytes) counts the bytes copied. The sources may be closed on return.
        This default copies the groups one by one."""
        out = []
        for g in groups:
            out.append(self.from_numpy_rows(g) if len(g) > 1 else self.from_numpy_bulk(g[0]))
            if progress is not None:
                progress(sum(p.nbytes for p in g))
        return out

    @abstractmethod
    def to_numpy(self, value: Any) -> np.ndarray:
        """A fresh host copy of the value."""

    def to_numpy_async(self, value: Any) -> Any:
        """A transfer whose result() is the host copy; result() waits for that copy only,
        not for work queued after it."""
        return ReadyTransfer(self.to_numpy(value))

    def run(self, schedule: Schedule, inputs: Sequence[Any]) -> list[Any]:
        """Execute the schedule lazily (each step allocates its result, dead values are
        dropped); inputs bind to schedule.input_slots in order."""
        return run_schedule(self, schedule, inputs)

    @abstractmethod
    def storage(self, value: Any) -> Storage:
        """The pool block behind a value (several views may share one)."""

    @abstractmethod
    def strides(self, value: Any) -> tuple[int, ...]:
        """Strides in bytes, as NumPy reports them."""

    @abstractmethod
    def layout_key(self, value: Any) -> Any:
        """What about a value's layout a cached schedule depends on."""

    @abstractmethod
    def pool_stats(self) -> dict[str, Any]:
        """The pool's statistics."""

    def synchronize(self) -> None:  # noqa: B027 - only the CUDA backend has queued work
        """Wait for queued work (nothing to wait for on the CPU)."""
