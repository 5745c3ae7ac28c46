"""The native fast path of lazy realizes and eager ops: a cached schedule's launches replayed
by the Rust dispatch controller (`_rust.Dispatcher`) in one call.

A lazy realize that hits the schedule cache, and every eager op (a one-node realize), ends
in CudaBackend.run(schedule, inputs). The first runs of a (schedule, input layouts) pair take
the general path (run_schedule: a Python launcher per step); the next one runs it with a
launch recorder (`_native.set_launch_recorder`) and turns what it launched into a plan: every
pointer argument becomes "input i + offset" or "buffer j + offset", every other argument
constant bytes. Buffers that an output views are allocated here (they become the arrays'
storages); the others are temporaries the controller takes from the pool and frees after
their last reader. From then on a run costs one output allocation per output buffer and one
`Dispatcher.run`; an eager op's key keeps its plan as an EagerReplay, so its hits skip
even the lookup by layouts. A call whose inputs share a block (x + x) is not recorded: which input a
pointer means would be ambiguous. What a plan cannot express stays on the general path for
that layout: a pointer to anything but the inputs, the steps' results and the error word (a
workspace, a plan-time table), or an op outside RECORDABLE_OPS (those may launch through
cuBLASLt, copy or synchronise, which the recorder does not see).
"""

from __future__ import annotations

import itertools
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pygpukit import _native, _rust
from pygpukit.errors import CUDAError
from pygpukit.memory import adopt
from pygpukit.passes import Schedule

from .ops_elementwise import ELEMENTWISE_OPS, is_zero_fill
from .ops_movement import VIEW_OPS
from .ops_reduce import REDUCE_OPS
from .value import DeviceValue

if TYPE_CHECKING:
    from .backend import CudaBackend

# Ops whose planners launch only through Function.launch (what the recorder sees); a zero
# `full` is a memset (ops_elementwise.is_zero_fill), which a replay would skip: a plan of
# gpk.zeros once handed out uninitialised memory.
RECORDABLE_OPS = frozenset({*ELEMENTWISE_OPS, "arange", *REDUCE_OPS, *VIEW_OPS})
PLAN_CAPACITY = 4096  # plans the controller keeps (LRU)
# General-path runs of a (schedule, layouts) before its run is recorded: the first plans the
# steps and compiles kernels, so its launches are the steady ones only from the second on.
_GENERAL_RUNS = 1
_NOT_CACHEABLE = -1  # this layout's run cannot be expressed as a plan
_CONST, _INPUT, _OUTPUT, _TEMP = 0, 1, 2, 3
_MASK64 = (1 << 64) - 1
_keys = itertools.count(1)
_record_lock = threading.Lock()  # one recording at a time: the recorder is process-wide


OutSpec = tuple[int, tuple[int, ...], tuple[int, ...], int, Any]


class NativePlan:
    """A recorded (schedule, layouts) pair: its controller key, the sizes of the buffers the
    outputs live in, and each output as (buffer j, or -1 - input i; shape; strides; element
    offset; dtype)."""

    __slots__ = ("key", "buf_bytes", "outs")

    def __init__(self, key: int, buf_bytes: list[int], outs: list[OutSpec]) -> None:
        self.key = key
        self.buf_bytes = buf_bytes
        self.outs = outs


class NativeDispatch:
    """The backend's controller and the Python side of its plans (kept in schedule.info,
    so they go when the schedule leaves the runtime's cache)."""

    def __init__(self, backend: CudaBackend, ctrl: Any = None) -> None:
        """ctrl: the controller (tests hand in `_rust.Dispatcher(fake=True)`); None: a real
        one, over the launch C ABI registered here."""
        if ctrl is None:
            _rust.register_launch_capi(_native.launch_capi())
            ctrl = _rust.Dispatcher(capacity=PLAN_CAPACITY)
        self.backend = backend
        self.ctrl = ctrl
        self.stats = {"native_runs": 0, "recorded": 0, "not_cacheable": 0, "fallbacks": 0}
        # An allocation that evicted may have moved an input: then the plan's pointers,
        # read before, are stale (the pool counts its evictions).
        pool = backend.pool
        self._evicting_pool = pool if getattr(pool, "evicts", False) else None

    def run(self, schedule: Schedule, inputs: Sequence[DeviceValue]) -> list[Any] | None:
        """The schedule's outputs, run natively or recorded now; None: take the general path."""
        info = schedule.info
        plans = info.get("native_plans")
        if plans is None:
            if any(st.op not in RECORDABLE_OPS or is_zero_fill(st) for st in schedule.steps):
                info["native_plans"] = False
                return None
            plans = info["native_plans"] = {}
        elif plans is False:
            return None
        lk = tuple([(v.strides, align(v)) for v in inputs])
        got = plans.get(lk)
        if type(got) is NativePlan:
            out = self._replay(got, inputs)
            if out is None:
                del plans[lk]  # evicted from the controller, or no room: record again later
            return out
        if got is None:
            got = 0
        if 0 <= got < _GENERAL_RUNS:
            plans[lk] = got + 1
            return None
        if got == _NOT_CACHEABLE or len({id(v.storage) for v in inputs}) < len(inputs):
            return None  # inputs sharing a block (x + x): record another call of this layout
        return self._record(schedule, inputs, [v.ptr for v in inputs], plans, lk)

    def eager_replay(self, schedule: Schedule, inputs: Sequence[DeviceValue]
                     ) -> EagerReplay | bool | None:  # fmt: skip
        """The recorded plan of this schedule for these inputs' layouts, bound for an eager
        op's hits (eager_ops.py): None while there is none yet, False when there never will
        be (an op outside RECORDABLE_OPS, a layout that cannot be a plan, more than one
        output)."""
        plans = schedule.info.get("native_plans")
        if plans is False or len(schedule.output_slots) != 1:
            return False
        if plans is None:
            return None
        got = plans.get(tuple([(v.strides, align(v)) for v in inputs]))
        if type(got) is NativePlan:
            return EagerReplay(self, got)
        return False if got == _NOT_CACHEABLE else None

    def _replay(self, plan: NativePlan, inputs: Sequence[DeviceValue]) -> list[Any] | None:
        backend = self.backend
        pool = backend.pool
        stream = backend.stream
        try:
            got = self.ctrl.run_alloc(plan.key, [operand(v) for v in inputs], plan.buf_bytes,
                                      0 if stream is None else stream.handle, pool)  # fmt: skip
        except RuntimeError as e:
            raise CUDAError(str(e)) from None
        if got is None:  # an eviction, a temporary that did not fit, the plan dropped
            self.stats["fallbacks"] += 1
            return None
        self.stats["native_runs"] += 1
        bufs = [adopt(pool, n, addr, h) for n, (addr, h) in zip(plan.buf_bytes, got, strict=True)]
        return [
            DeviceValue(bufs[j], shape, strides, off, dtype) if j >= 0
            else DeviceValue(inputs[-1 - j].storage, shape, strides, inputs[-1 - j].offset + off,
                             dtype)
            for j, shape, strides, off, dtype in plan.outs
        ]  # fmt: skip

    def _record(self, schedule: Schedule, inputs: Sequence[DeviceValue], ptrs: list[int],
                plans: dict[Any, Any], lk: Any) -> list[Any]:  # fmt: skip
        """A general-path run with the launch recorder on; its launches become a plan when
        they can. Returns the run's outputs either way."""
        with _record_lock:
            rec = _Recording(self.backend, inputs, ptrs)
            _native.set_launch_recorder(rec.launched)
            try:
                outs = rec.run(schedule)
            finally:
                _native.set_launch_recorder(None)
        made = rec.plan(outs)
        if made is None:
            plans[lk] = _NOT_CACHEABLE
            self.stats["not_cacheable"] += 1
            return outs
        launches, temp_bytes, buf_bytes, out_specs = made
        key = next(_keys)
        self.ctrl.insert(key, launches, len(inputs), len(buf_bytes), temp_bytes)
        plans[lk] = NativePlan(key, buf_bytes, out_specs)
        self.stats["recorded"] += 1
        return outs


class EagerReplay:
    """One plan of an eager op's cached schedule, for that op's hits: the eager key holds
    its operands' layouts, so a hit goes to the plan without looking it up by layouts again
    (no schedule, no layout tuple), and makes one `Dispatcher.run_alloc` (which touches the
    inputs, allocates the output buffer(s) and runs, in one crossing). A call returns the
    op's value, or None to take backend.run this time (the controller off or bypassed, an
    eviction meanwhile, a temporary that did not fit, a plan the controller dropped: the
    caller then asks eager_replay again)."""

    __slots__ = ("native", "key", "buf_bytes", "out")

    def __init__(self, native: NativeDispatch, plan: NativePlan) -> None:
        self.native = native
        self.key = plan.key
        self.buf_bytes = plan.buf_bytes
        (self.out,) = plan.outs

    def __call__(self, inputs: Sequence[DeviceValue]) -> DeviceValue | None:
        native = self.native
        backend = native.backend
        if backend.native is not native or backend.poison:
            return None
        pool = backend.pool
        stream = backend.stream
        # NativeDispatch._replay's call, inlined: this is every eager hit's path, and a
        # shared helper would cost a frame per op.
        try:
            got = native.ctrl.run_alloc(self.key, [operand(v) for v in inputs], self.buf_bytes,
                                        0 if stream is None else stream.handle, pool)  # fmt: skip
        except RuntimeError as e:
            raise CUDAError(str(e)) from None
        if got is None:  # an eviction, a temporary that did not fit, the plan dropped
            native.stats["fallbacks"] += 1
            return None
        native.stats["native_runs"] += 1
        j, shape, strides, off, dtype = self.out
        if j >= 0:  # the one output buffer (buffers are only those an output views)
            addr, h = got[j]
            return DeviceValue(adopt(pool, self.buf_bytes[j], addr, h), shape, strides, off, dtype)
        v = inputs[-1 - j]
        return DeviceValue(v.storage, shape, strides, v.offset + off, dtype)


def operand(v: DeviceValue) -> tuple[int, int | None]:
    """An input as Dispatcher.run_alloc takes it: a pool block's (byte offset, handle),
    which the controller touches for its address now (restoring it if it was evicted),
    else (address, None)."""
    s = v.storage
    h = s._h
    off = v.offset * v.dtype.itemsize
    return (off, h) if h is not None else (s._addr + off, None)


def align(v: DeviceValue) -> int:
    """v's address mod 16, without touching its block: a pool block is 256-byte aligned
    wherever eviction moves it, and any other block never moves."""
    return (v.storage._addr + v.offset * v.dtype.itemsize) & 15


class _Recording:
    """One run of a schedule with every launch's arguments resolved, per step, against what
    is live then: the inputs' blocks and the blocks the steps made so far."""

    def __init__(self, backend: CudaBackend, inputs: Sequence[DeviceValue],
                 ptrs: list[int]) -> None:  # fmt: skip
        self.backend = backend
        self.inputs = inputs
        self.ptrs = ptrs
        self.thread = threading.get_ident()
        self.raw: list[tuple[Any, ...]] = []
        self.launches: list[tuple[Any, ...]] = []
        self.ok = True
        # (storage weakref, lo, hi, kind, index, base address)
        self.roots: list[tuple[Any, int, int, int, int, int]] = [
            (weakref.ref(v.storage), v.storage.addr, v.storage.addr + max(v.storage.nbytes, 1),
             _INPUT, i, p)
            for i, (v, p) in enumerate(zip(inputs, ptrs, strict=True))
        ]  # fmt: skip
        self.bufs: list[Any] = []  # weakrefs of the steps' new blocks, by buffer index
        self.buf_bytes: list[int] = []

    def launched(self, fn: Any, grid: Any, block: Any, fmt: str, args: tuple[Any, ...],
                 shared_mem: int, pdl: bool) -> None:  # fmt: skip
        if threading.get_ident() == self.thread:
            self.raw.append((fn, grid, block, fmt, args, shared_mem, pdl))

    def run(self, schedule: Schedule) -> list[Any]:
        backend = self.backend
        values: list[Any] = [None] * schedule.n_slots
        for slot, v in zip(schedule.input_slots, self.inputs, strict=True):
            if slot >= 0:
                values[slot] = v
        launch = backend.new_launch(schedule, self.inputs)
        known = {id(v.storage) for v in self.inputs}
        for st in schedule.steps:
            out = backend.execute(st, [values[i] for i in st.ins], None, False, launch)
            values[st.out] = out
            s = out.storage
            if id(s) not in known:
                known.add(id(s))
                self.roots.append((weakref.ref(s), s.addr, s.addr + max(s.nbytes, 1), _TEMP,
                                   len(self.bufs), s.addr))  # fmt: skip
                self.bufs.append(weakref.ref(s))
                self.buf_bytes.append(s.nbytes)
            self._resolve()
            for f in st.frees:
                values[f] = None
        return [values[s] for s in schedule.output_slots]

    def _resolve(self) -> None:
        """The launches of the step just run, against the blocks live now."""
        err = self.backend.err_addr
        live = [r for r in self.roots if r[0]() is not None]
        for fn, grid, block_, fmt, args, shared_mem, pdl in self.raw:
            params: list[tuple[int, int, int]] = []
            for code, a in zip(fmt, args, strict=True):
                if code != "P":
                    params.append((_CONST, _bits(code, a), 0))
                    continue
                if a == 0 or a == err:
                    params.append((_CONST, a, 0))
                    continue
                hit = [r for r in live if r[1] <= a < r[2]]
                if len(hit) != 1:
                    self.ok = False  # a workspace, a plan-time table: not expressible
                    break
                _, _, _, kind, index, base = hit[0]
                params.append((kind, index, a - base))
            self.launches.append((fn, fn.context_handle, fn.handle, _dims(grid), _dims(block_),
                                  int(shared_mem), bool(pdl), params))  # fmt: skip
        self.raw.clear()

    def plan(self, outs: list[Any]) -> tuple[list[Any], list[int], list[int], list[Any]] | None:
        """(launches, temporary sizes, output buffer sizes, output specs), or None when the
        run cannot be replayed from a plan."""
        if not self.ok:
            return None
        by_storage = {id(r()): j for j, r in enumerate(self.bufs) if r() is not None}
        in_storage = {id(v.storage): i for i, v in enumerate(self.inputs)}
        exported: dict[int, int] = {}  # buffer -> output buffer index
        specs: list[Any] = []
        for v in outs:
            j = by_storage.get(id(v.storage))
            if j is not None:
                o = exported.setdefault(j, len(exported))
                specs.append((o, v.shape, v.strides, v.offset, v.dtype))
                continue
            i = in_storage.get(id(v.storage))
            if i is None or v.dtype != self.inputs[i].dtype:
                return None  # a block made outside the steps (a plan's constant)
            specs.append((-1 - i, v.shape, v.strides, v.offset - self.inputs[i].offset, v.dtype))
        temps = [j for j in range(len(self.bufs)) if j not in exported]
        temp_index = {j: k for k, j in enumerate(temps)}
        launches = []
        for fn, ctx, handle, grid, block_, shared_mem, pdl, params in self.launches:
            mapped = []
            for kind, index, off in params:
                if kind == _TEMP:
                    if index in exported:
                        kind, index = _OUTPUT, exported[index]
                    else:
                        index = temp_index[index]
                mapped.append((kind, index, off))
            launches.append((fn, ctx, handle, grid, block_, shared_mem, pdl, mapped))
        buf_bytes = [0] * len(exported)
        for j, o in exported.items():
            buf_bytes[o] = self.buf_bytes[j]
        return launches, [self.buf_bytes[j] for j in temps], buf_bytes, specs


def _bits(code: str, value: Any) -> int:
    """A non-pointer kernel argument as the 64-bit slot Function.launch packs it into."""
    if code == "f":
        return int(struct.unpack("<I", struct.pack("<f", float(value)))[0])
    if code == "d":
        return int(struct.unpack("<Q", struct.pack("<d", float(value)))[0])
    if code in "iI":
        return int(value) & 0xFFFFFFFF
    return int(value) & _MASK64


def _dims(d: Any) -> list[int]:
    return [int(x) for x in d] if isinstance(d, tuple | list) else [int(d)]
