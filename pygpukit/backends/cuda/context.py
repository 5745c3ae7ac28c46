"""What step planners need from the backend: allocation, the error word, the stream; and
the per-call state (output slot, Launch) their launchers are handed, through StepContext."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from pygpukit.ir import DType
from pygpukit.ir.shapes import contiguous_strides
from pygpukit.memory import Storage

from .layout import is_contiguous
from .value import DeviceValue


class Context(Protocol):
    sm_count: int

    @property
    def stream(self) -> Any:
        """The stream launches go to, read at launch time."""
        ...

    @property
    def owner(self) -> Any:
        """What per-device caches (the cuBLASLt workspace) are kept for: the backend."""
        ...

    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue: ...

    def alloc_out(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        """The step's result buffer: the planned slot when the executor gave one."""
        ...

    def scratch_only(self) -> AbstractContextManager[None]:
        """Within it, alloc_out allocates instead of handing out the step's slot (a step
        that runs several kernels keeps the slot for its last one)."""
        ...

    @property
    def err_addr(self) -> int: ...

    def tag(self, op: str, inputs: list[tuple[tuple[int, ...], Any]], loc: Any) -> int: ...


class Launch:
    """Where one run's launches go, passed from the executor to every hook that launches
    (execute, copy_into) and from there to the step contexts: the stream, and while a
    CUDA graph is recorded, `keep` (the blocks allocated inside the recording, which the
    graph writes and so must outlive; `spare`: those of them no value holds now, which
    `recorded_block` hands out again) and `step` (the step running, named if the capture
    fails). `plans`: a lazy run's launch plans, one per step of its schedule (None: plan
    per input layout, as a compiled program does)."""

    __slots__ = ("stream", "keep", "spare", "step", "plans")

    def __init__(self, stream: Any, keep: list[Storage] | None = None,
                 plans: dict[int, Any] | None = None) -> None:  # fmt: skip
        self.stream = stream
        self.keep = keep
        self.spare: list[Storage] = []
        self.step: Any = None
        self.plans = plans

    def recorded_block(self, nbytes: int, new: Callable[[int], Storage]) -> Storage:
        """A block for a value made inside this recording (keep is not None): a spare one
        of at least nbytes (and at most twice that), else new(nbytes), which the graph
        keeps. The value gets a RecordedBlock over it; when that dies the block is spare
        again. A later step of the recording may then write it, as the eager run reuses a
        freed block: the graph runs its kernels in the recorded stream order. Without this
        the graph kept every step's scratch (a 7B int8 prefill's dequantized weights,
        14.8 GB, twice the quantized model)."""
        assert self.keep is not None
        best = -1
        for i, b in enumerate(self.spare):
            if nbytes <= b.nbytes <= 2 * nbytes and (
                    best < 0 or b.nbytes < self.spare[best].nbytes):  # fmt: skip
                best = i
        if best >= 0:
            base = self.spare.pop(best)
        else:
            base = new(nbytes)
            self.keep.append(base)
        return RecordedBlock(base, nbytes, self.spare)


class RecordedBlock(Storage):
    """A value's view of a block a CUDA graph recording keeps (Launch.recorded_block):
    freeing it puts the block back among the recording's spares instead of the pool's
    free blocks. It holds the block, so the address stays valid while it lives."""

    __slots__ = ("base", "spare")

    def __init__(self, base: Storage, nbytes: int, spare: list[Storage]) -> None:
        self.base, self.spare = base, spare
        self.pool, self.nbytes, self.freed = base.pool, nbytes, False
        self._addr = base.addr

    @property
    def addr(self) -> int:
        """The block's address now (Storage.addr of the block)."""
        a: int = self.base.addr
        self._addr = a
        return a

    @addr.setter
    def addr(self, value: int) -> None:  # Storage's is settable: so must this be
        self._addr = value

    @property
    def pins(self) -> int:
        return self.base.pins

    def pin(self) -> None:
        """Pins the block (a step pins its inputs while it allocates: none may move)."""
        self.base.pin()

    def unpin(self) -> None:
        self.base.unpin()

    def release(self) -> None:
        if not self.freed:
            self.freed = True
            self.spare.append(self.base)


class Allocator(Protocol):
    """What a StepContext asks its backend for."""

    stream: Any
    sm_count: int

    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str,
              launch: Launch | None = None) -> DeviceValue: ...  # fmt: skip

    @property
    def err_addr(self) -> int: ...

    def tag(self, op: str, inputs: list[tuple[tuple[int, ...], Any]], loc: Any) -> int: ...


class StepContext:
    """The Context one planned step is planned with and launched through. A planner's
    launcher keeps it, so what changes from call to call is handed to its call as
    arguments (StepContext.call: the output slot and the Launch) and held here only while
    that call runs: alloc_out hands out the slot, launches go to the launch's stream."""

    __slots__ = ("backend", "step", "sm_count", "out", "launch")

    def __init__(self, backend: Allocator, step: Any = None,
                 launch: Launch | None = None) -> None:  # fmt: skip
        self.backend = backend
        self.step = step
        self.sm_count = backend.sm_count
        self.out: DeviceValue | None = None
        self.launch = launch

    def call(self, run: Callable[[list[DeviceValue]], DeviceValue], ins: list[DeviceValue],
             out: DeviceValue | None, launch: Launch | None) -> DeviceValue:  # fmt: skip
        """run(ins) (a launcher planned with this context) writing into `out` when it can
        (None: it allocates), its launches going where `launch` says (None: the backend's
        stream)."""
        self.out, self.launch = out, launch
        try:
            return run(ins)
        finally:
            self.out = self.launch = None

    @property
    def owner(self) -> Any:
        return self.backend

    @property
    def stream(self) -> Any:
        launch = self.launch
        return self.backend.stream if launch is None else launch.stream

    @property
    def capturing(self) -> bool:
        launch = self.launch
        return launch is not None and launch.keep is not None

    @property
    def err_addr(self) -> int:
        return self.backend.err_addr

    def tag(self, op: str, inputs: list[tuple[tuple[int, ...], Any]], loc: Any) -> int:
        return self.backend.tag(op, inputs, loc)

    def alloc(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        step = self.step
        if step is not None and step.loc:
            what = f"{what} at {step.loc}"
        return self.backend.alloc(shape, dtype, what, self.launch)

    def alloc_out(self, shape: tuple[int, ...], dtype: DType, what: str) -> DeviceValue:
        o = self.out
        if (o is not None and o.shape == shape and o.dtype == dtype
                and is_contiguous(o.shape, o.strides)):  # fmt: skip
            self.out = None
            return o
        return self.alloc(shape, dtype, what)

    @contextmanager
    def scratch_only(self) -> Iterator[None]:
        saved, self.out = self.out, None
        try:
            yield
        finally:
            self.out = saved


def capturing(ctx: Context) -> bool:
    """Whether ctx's launches are being captured into a CUDA graph: every kernel ahead of
    one of them on the stream is then one of the graph's own (a context that never
    captures: False)."""
    return bool(getattr(ctx, "capturing", False))


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(contiguous_strides(shape))


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
