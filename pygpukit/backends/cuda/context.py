"""What step planners need from the backend: allocation, the error word, the stream."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any, Protocol

from pygpukit.ir import DType
from pygpukit.ir.shapes import contiguous_strides

from .value import DeviceValue


class Context(Protocol):
    stream: Any
    sm_count: int

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
