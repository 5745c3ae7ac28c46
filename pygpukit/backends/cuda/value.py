"""DeviceValue: a strided view of device memory. Views share Storage; nothing is copied."""

from __future__ import annotations

import math
from typing import Any

from pygpukit.ir import DType
from pygpukit.memory import RELEASES, Storage


class DeviceValue:
    """shape, element strides and element offset over a Storage block."""

    __slots__ = ("storage", "shape", "strides", "offset", "dtype")

    def __init__(self, storage: Storage, shape: tuple[int, ...], strides: tuple[int, ...],
                 offset: int, dtype: DType) -> None:  # fmt: skip
        self.storage = storage
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype

    @property
    def ptr(self) -> int:
        return self.storage.addr + self.offset * self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> DeviceValue:
        return DeviceValue(self.storage, shape, strides, offset, self.dtype)

    def __repr__(self) -> str:
        return (f"DeviceValue({self.dtype.short}{list(self.shape)}, strides={self.strides}, "
                f"offset={self.offset}, ptr=0x{self.ptr:x})")  # fmt: skip


class ExternalStorage(Storage):
    """Memory another library owns (DLPack, __cuda_array_interface__): the pool never frees
    it, and `owner` keeps the producer alive as long as any view of it lives."""

    __slots__ = ("owner",)

    def __init__(self, addr: int, nbytes: int, owner: Any) -> None:
        self.pool = None
        self.nbytes = nbytes
        self.freed = False
        self.addr = addr
        self.owner = owner

    def release(self) -> None:
        if not self.freed:
            RELEASES[0] += 1  # compiled calls check their arrays again (memory.RELEASES)
            self.freed = True
            self.owner = None
