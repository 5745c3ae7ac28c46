"""The NumPy backend: executes a Schedule on host memory carved by the Rust pool."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.errors import OutOfMemoryError, op_error
from pygpukit.ir import DType, dtypes
from pygpukit.ir.elementwise import OPS as ELEMENTWISE
from pygpukit.ir.evaluate import evaluate
from pygpukit.ir.ops import REDUCTIONS
from pygpukit.memory import Storage, enable_eviction, pin_all, pinned, unpin_all
from pygpukit.passes import Schedule, Step

from ..base import Backend
from . import fused, linalg, movement, nn, paged, reduce, scan_sort
from .collective import COLLECTIVE_OPS, collective
from .planned import PlannedHooks

VIEW_OPS = ("reshape", "permute", "expand", "index", "after")


class HostValue:
    """A NumPy array over pool memory, and the block it lives in. The array is rebuilt
    when its block was evicted and restored at another address (see pygpukit.memory)."""

    __slots__ = ("storage", "_array", "_gen", "_base")

    def __init__(self, storage: Storage, array: np.ndarray) -> None:
        self.storage = storage
        self._array = array
        self._gen = storage.gen
        self._base = storage._addr

    @property
    def array(self) -> np.ndarray:
        st = self.storage
        addr = st.addr  # restores an evicted block, marks it used
        if st.gen != self._gen:
            a = self._array
            off = a.__array_interface__["data"][0] - self._base
            raw = (ctypes.c_char * max(st.nbytes, 1)).from_address(addr)
            raw._storage = st  # type: ignore[attr-defined]
            b = np.ndarray(a.shape, a.dtype, buffer=raw, offset=off, strides=a.strides)  # type: ignore[arg-type]
            b.flags.writeable = a.flags.writeable
            self._array, self._gen, self._base = b, st.gen, addr
        return self._array


def _copy_out(addr: int, nbytes: int) -> np.ndarray:
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(addr)
    return np.frombuffer(raw, np.uint8).copy()  # type: ignore[call-overload]


def _copy_in(host: np.ndarray, addr: int) -> None:
    ctypes.memmove(addr, host.ctypes.data, host.nbytes)


def host_view(storage: Storage, offset: int, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    """A NumPy array over `storage` bytes [offset, offset + size)."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(storage.addr + offset)
    raw._storage = storage  # type: ignore[attr-defined]  # numpy views keep the block alive
    flat = np.frombuffer(raw, dtype=dtype.np, count=math.prod(shape))  # type: ignore[call-overload]
    return flat.reshape(shape)


def _run_step(step: Step, ins: list[np.ndarray]) -> np.ndarray:
    op, a, d = step.op, step.attrs, step.dtype
    if op in ELEMENTWISE:
        return evaluate(op, ins, a, d)
    if op in REDUCTIONS:
        return reduce.reduce(op, ins[0], a, d)
    if op == "scan":
        return scan_sort.scan(ins[0], a, d)
    if op == "sort":
        return scan_sort.sort(ins[0], a, d)
    if op in VIEW_OPS or op == "concat":
        return movement.movement(op, ins, a, d)
    if op == "take":
        return movement.take(ins[0], ins[1], a)
    if op == "setitem":
        return movement.setitem(ins, a)
    if op == "paged_write":
        return paged.paged_write(ins, a, d)
    if op == "paged_sdpa":
        return paged.paged_sdpa(ins, a, d)
    if op == "paged_sdpa_append":
        return paged.paged_sdpa_append(ins, a, d)
    if op == "flatnonzero":
        return movement.flatnonzero(ins[0], a)
    if op == "mask_rank":
        return movement.mask_rank(ins[0])
    if op == "matmul":
        return linalg.matmul(ins[0], ins[1], d)
    if op == "linear":
        return linalg.linear(ins, a, d)
    if op in ("softmax", "log_softmax"):
        return nn.softmax(ins[0], a, d, log=op == "log_softmax")
    if op == "rms_norm":
        return nn.rms_norm(ins[0], ins[1], a, d, ins[2] if len(ins) > 2 else None)
    if op == "layer_norm":
        return nn.layer_norm(ins, a, d)
    if op == "rope":
        return nn.rope(ins, a, d)
    if op == "sdpa":
        return nn.sdpa(ins, a, d)
    if op == "sdpa_append":
        return nn.sdpa_append(ins, a, d)
    if op == "rope_kv_write":
        return nn.rope_kv_write(ins, a, d)
    if op == "swiglu":
        return nn.swiglu(ins[0], ins[1], d)
    if op == "fused_elementwise":
        return fused.fused_elementwise(ins, a, d)
    if op == "fused_reduce":
        return fused.fused_reduce(ins, a, d)
    if op in COLLECTIVE_OPS:
        return collective(op, ins[0], a)
    if op == "full":
        return np.full(step.shape, a["value"], dtype=d.np)
    if op == "arange":
        return (a["start"] + a["step"] * np.arange(math.prod(step.shape))).astype(d.np)
    raise NotImplementedError(f"the NumPy backend has no kernel for op {op!r}")


class NumpyBackend(PlannedHooks, Backend):
    name = "cpu"

    def __init__(self, arena_bytes: int = 64 << 20, quota_bytes: int | None = None) -> None:
        from pygpukit import _rust

        self.pool = _rust.Pool(arena_bytes=arena_bytes, quota_bytes=quota_bytes)
        enable_eviction(self.pool, _copy_out, _copy_in)

    # -- memory ---------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: DType) -> HostValue:
        storage = Storage(self.pool, math.prod(shape) * dtype.itemsize)
        return HostValue(storage, host_view(storage, 0, shape, dtype))

    def from_numpy(self, array: np.ndarray) -> HostValue:
        v = self.empty(array.shape, dtypes.as_dtype(array.dtype))
        v.array[...] = array
        return v

    def from_numpy_rows(self, parts: Sequence[np.ndarray]) -> HostValue:
        """The parts concatenated along axis 0: each copied once, into its rows."""
        rows = sum(p.shape[0] for p in parts)
        v = self.empty((rows, *parts[0].shape[1:]), dtypes.as_dtype(parts[0].dtype))
        at = 0
        for p in parts:
            v.array[at : at + p.shape[0]] = p
            at += p.shape[0]
        return v

    def to_numpy(self, value: HostValue) -> np.ndarray:
        with pinned((value.storage,)):
            return np.array(value.array, copy=True)

    def storage(self, value: HostValue) -> Storage:
        return value.storage

    def strides(self, value: HostValue) -> tuple[int, ...]:
        return tuple(value.array.strides)

    def layout_key(self, value: HostValue) -> Any:
        return None  # NumPy kernels take any strides

    def pool_stats(self) -> dict[str, Any]:
        return dict(self.pool.stats())

    # -- execution ------------------------------------------------------------------------
    def _store(self, result: np.ndarray, step: Step, ins: list[HostValue]) -> HostValue:
        if step.op in VIEW_OPS:
            for v in ins[:1]:
                if np.may_share_memory(result, v.array):
                    return HostValue(v.storage, result)
        try:
            out = self.empty(step.shape, step.dtype)
        except OutOfMemoryError as e:
            where = f" at {step.loc}" if step.loc else ""
            raise OutOfMemoryError(f"{step.op}{where}: {e}") from None
        out.array[...] = result
        return out

    def new_launch(self, schedule: Schedule, inputs: Sequence[Any]) -> None:
        """None: NumPy runs each step as it is called, with nothing to carry."""
        return None

    def execute(self, step: Step, ins: list[Any], out: Any, inplace: bool,
                launch: Any = None) -> Any:  # fmt: skip
        """Run one step (PlannedBackend.execute): into `out` when given, else into a new
        block, or as a view of ins[0] for a view step."""
        # A lazy step allocates its output: that must not evict (move) its inputs.
        held = pin_all(v.storage for v in ins) if out is None else None
        try:
            arrays = [v.array for v in ins]
            try:
                if inplace:
                    if step.op == "paged_write":
                        paged.paged_write_into(arrays, step.attrs, step.dtype)
                    else:
                        movement.setitem_into(arrays, step.attrs)
                    return out
                result = _run_step(step, arrays)
                if out is None:
                    return self._store(result, step, ins)
                out.array[...] = result
                return out
            except (IndexError, ValueError, TypeError, ArithmeticError) as e:
                specs: list[tuple[tuple[int, ...], object]] = [
                    (a.shape, dtypes.as_dtype(a.dtype)) for a in arrays
                ]
                raise op_error(step.op, e, specs, step.loc) from None
        finally:
            if held is not None:
                unpin_all(held)
