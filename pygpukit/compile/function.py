"""@gpk.compile: a function traced once per signature and replayed from a planned schedule."""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pygpukit import errors
from pygpukit.memory import Storage

from .captures import scan
from .pytree import TreeDef, describe, flatten_call, unflatten
from .trace import Traced, trace

_WARN_AFTER = 3  # misses (after the first trace) before the one-time warning


class StaleOutputError(errors.FreedArrayError):
    """A static output view was read after a later call overwrote it."""


class _StaticSlot(Storage):
    """The storage of a static output: the arena block, valid for one call's results."""

    __slots__ = ("_fn", "_gen", "_what")

    def __init__(self, base: Storage, fn: CompiledFunction, what: str) -> None:
        self.pool, self.nbytes, self.addr = base.pool, base.nbytes, base.addr
        self._fn, self._gen, self._what = fn, fn._calls, what

    @property
    def freed(self) -> bool:
        if self._fn._calls != self._gen:
            raise StaleOutputError(
                f"{self._fn.__name__}: output {self._what} is a view into the compiled graph's "
                f"buffers (static_outputs=True) from call {self._gen}, and call "
                f"{self._fn._calls} has overwritten it; copy it (y.copy()) before calling again"
            )
        return False

    @freed.setter
    def freed(self, value: bool) -> None:
        pass  # the arena belongs to the compiled entry; it is never freed from here

    def release(self) -> None:
        pass


class Reservation(NamedTuple):
    """What one call needs from the pool, from the memory plan (bytes)."""

    arena_bytes: int  # the planned arena: intermediates, inputs copied in, outputs
    input_bytes: int  # the array arguments
    output_bytes: int  # the fresh output arrays (0 with static_outputs)
    traffic_bytes: int  # what the kernels read and write: input to a cost model

    @property
    def total(self) -> int:
        return self.arena_bytes + self.input_bytes + self.output_bytes


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * dtype.itemsize


@dataclass
class _Entry:
    traced: Traced
    program: Any  # executor.PlannedProgram
    signature: dict[str, str]
    trace_ms: float


class CompiledFunction:
    """The callable @gpk.compile returns; see gpk.compile."""

    def __init__(self, fn: Any, static_outputs: bool = False) -> None:
        self.__wrapped_fn__ = fn
        self.static_outputs = static_outputs
        self.__name__ = getattr(fn, "__name__", "compiled")
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._cache: dict[Any, _Entry] = {}
        self._last_key: Any = None
        self._calls = 0
        self._hits = 0
        self._misses = 0
        self._reasons: list[str] = []
        self._warned = False

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    # -- cache --------------------------------------------------------------------------
    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        arrays: list[tuple[str, Any]] = []
        objects: list[tuple[str, Any]] = []
        tree = flatten_call(args, kwargs, arrays, objects)
        from pygpukit.creation import asarray

        arrays = [(p, a if not isinstance(a, np.ndarray) else asarray(a)) for p, a in arrays]
        captured = scan(self.__wrapped_fn__, objects)
        from pygpukit.backends import get_backend

        key = (
            get_backend().name,  # a plan built for one backend never runs on another
            tree,
            tuple((a.shape, a.dtype.name) for _, a in arrays),
            tuple(id(a) for _, a in captured),
        )
        return key, tree, arrays, captured

    @staticmethod
    def _signature(tree: TreeDef, arrays: list[tuple[str, Any]],
                   captured: list[tuple[str, Any]]) -> dict[str, str]:  # fmt: skip
        sig: dict[str, str] = {}
        for k, t in enumerate(tree[1][1:]):
            describe(t, f"arg {k}", sig)
        for name, t in zip(tree[2][1], tree[2][2:], strict=True):
            describe(t, f"kwarg {name}", sig)
        for p, a in arrays:
            sig[p] = f"array {a.dtype.short} ({','.join(str(d) for d in a.shape)})"
        for p, a in captured:
            sig[f"captured {p}"] = f"array id {id(a):#x}"
        return sig

    @staticmethod
    def _why(old: dict[str, str], new: dict[str, str]) -> str:
        """`arg 1 shape (1,7) -> (1,8)`, one clause per difference."""
        out = []
        for p in sorted(set(old) | set(new)):
            a, b = old.get(p), new.get(p)
            if a == b:
                continue
            if a is None or b is None:
                out.append(f"{p} new: {b}" if a is None else f"{p} gone (was {a})")
            elif a.startswith("array ") and b.startswith("array "):
                (_, da, sa), (_, db, sb) = a.split(" ", 2), b.split(" ", 2)
                if da != db:
                    out.append(f"{p} dtype {da} -> {db}")
                if sa != sb:
                    out.append(f"{p} shape {sa} -> {sb}")
            elif a.startswith("value ") and b.startswith("value "):
                out.append(f"{p} value {a[6:]} -> {b[6:]}")
            else:
                out.append(f"{p} {a} -> {b}")
        return "; ".join(out) or "same signature, new captured arrays"

    def stats(self) -> dict[str, Any]:
        """hits, misses, the reason of each miss, and the cached entries' plans."""
        return {
            "calls": self._calls,
            "hits": self._hits,
            "misses": self._misses,
            "reasons": list(self._reasons),
            "entries": [
                {
                    "signature": dict(e.signature),
                    "trace_ms": e.trace_ms,
                    "arena_bytes": e.program.plan.arena_bytes,
                    "naive_bytes": e.program.plan.naive_bytes,
                    "kernels": len(e.program.kernels),
                    "replay": e.program.replay_info(),
                }  # fmt: skip
                for e in self._cache.values()
            ],
        }

    # -- calling --------------------------------------------------------------------------
    def _compile(
        self,
        key: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tree: TreeDef,
        arrays: list[tuple[str, Any]],
        captured: list[tuple[str, Any]],
        stacklevel: int = 4,  # the warning points at the user's line
    ) -> _Entry:
        from pygpukit.backends import get_backend
        from pygpukit.executor import PlannedProgram
        from pygpukit.passes import lower, run_pipeline

        sig = self._signature(tree, arrays, captured)
        if self._last_key is None:
            reason = "first call"
        else:
            reason = self._why(self._cache[self._last_key].signature, sig)
        self._misses += 1
        self._reasons.append(reason)
        if self._misses > _WARN_AFTER and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.__name__} was traced {self._misses} times; reasons: "
                + " | ".join(self._reasons[1:]),
                stacklevel=stacklevel,
            )
        t0 = time.perf_counter()
        traced = trace(self.__wrapped_fn__, args, kwargs, [a for _, a in arrays], tree, captured,
                       self.__name__)  # fmt: skip
        schedule = lower(run_pipeline(traced.graph))
        n_args = len(arrays)
        ins = schedule.input_slots
        external = ins[n_args:]
        n_user = traced.n_outputs
        outs = schedule.output_slots
        writeback = [(outs[n_user + j], external[p])
                     for j, p in enumerate(traced.writeback_persistent)]  # fmt: skip
        program = PlannedProgram(schedule, get_backend(), external, writeback)
        entry = _Entry(traced, program, sig, (time.perf_counter() - t0) * 1e3)
        self._cache[key] = entry
        return entry

    def reservation(self, *args: Any, **kwargs: Any) -> Reservation:
        """The memory a call with these arguments needs, known before it runs (a cache miss
        traces and plans the graph here, and the call then hits)."""
        from pygpukit import runtime

        key, tree, arrays, captured = self._key(args, kwargs)
        pending = [a._node for _, a in arrays + captured if a._node.realized is None]
        if pending:
            runtime.realize(pending)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(key, args, kwargs, tree, arrays, captured, stacklevel=3)
            self._last_key = key
        prog = entry.program
        nodes = prog.schedule.graph.nodes
        outs = prog.schedule.graph.outputs[: entry.traced.n_outputs]
        traffic = sum(_nbytes(st.shape, st.dtype)
                      + sum(_nbytes(nodes[i].shape, nodes[i].dtype) for i in st.ins)
                      for _, st in prog.kernels)  # fmt: skip
        return Reservation(
            prog.plan.arena_bytes,
            sum(_nbytes(a.shape, a.dtype) for _, a in arrays),
            0 if self.static_outputs else sum(_nbytes(n.shape, n.dtype) for n in outs),
            traffic,
        )

    def reservation_bytes(self, *args: Any, **kwargs: Any) -> int:
        return self.reservation(*args, **kwargs).total

    def call_in(self, arena: Storage, *args: Any, **kwargs: Any) -> Any:
        """Call with the graph's arena placed in `arena`, a pool block of at least
        `reservation(...).arena_bytes` that the caller owns (the scheduler reserves it at
        admission and frees it when the task ends)."""
        return self._call(args, kwargs, arena)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, None)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], arena: Any) -> Any:
        from pygpukit import runtime
        from pygpukit.array import GPUArray
        from pygpukit.backends import get_backend

        key, tree, arrays, captured = self._key(args, kwargs)
        pending = [a._node for _, a in arrays + captured if a._node.realized is None]
        if pending:
            runtime.realize(pending)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(key, args, kwargs, tree, arrays, captured)
        else:
            self._hits += 1
        self._last_key = key
        if arena is not None:
            if arena.nbytes < entry.program.plan.arena_bytes:
                raise ValueError(f"{self.__name__}: arena of {arena.nbytes} bytes is smaller "
                                 f"than the plan's {entry.program.plan.arena_bytes}")  # fmt: skip
            entry.program.use_arena(arena)
        self._calls += 1
        traced = entry.traced
        externals = [a._node.realized for a in traced.persistent] + traced.constants
        values = entry.program([a._node.realized for _, a in arrays], externals)
        backend: Any = get_backend()
        n = traced.n_outputs
        for j, k in enumerate(traced.writeback_args):
            backend.copy_into(arrays[k][1]._node.realized, values[n + len(
                traced.writeback_persistent) + j])  # fmt: skip
        outs = []
        for k, v in enumerate(values[:n]):
            node = entry.program.schedule.graph.outputs[k]
            if self.static_outputs:
                what = f"{k} ({node.dtype.short}{list(node.shape)})"
                v = backend.with_storage(v, _StaticSlot(backend.storage(v), self, what))
            else:
                v = backend.clone(v)
            outs.append(GPUArray(runtime.leaf(v, node.shape, node.dtype)))
        return unflatten(traced.out_tree, iter(outs), iter(()))


def compile(fn: Any = None, *, static_outputs: bool = False) -> Any:  # noqa: A001
    """Trace `fn` once per signature into one graph, fuse and plan it, and replay it.

    The cache key is the arguments' structure, shapes, dtypes and static Python values
    (ints, floats, strings, tuples), and the identity of persistent arrays the function
    reads from closures, globals or objects (referenced, not copied). Use gpk.scalar(i) or
    a 0-d array for values that change every call. `fn.stats()` reports hits and misses.
    Results are fresh arrays; static_outputs=True returns views into the graph's buffers,
    valid until the next call.
    """
    if fn is None:
        return functools.partial(compile, static_outputs=static_outputs)
    return CompiledFunction(fn, static_outputs=static_outputs)


def scalar(value: int | float, dtype: Any = None) -> Any:
    """A device scalar (a 0-d array): compiled kernels read it from memory, so changing
    it does not re-trace."""
    from pygpukit.creation import asarray

    if dtype is None:
        dtype = "int64" if isinstance(value, int) and not isinstance(value, bool) else "float32"
    return asarray(np.asarray(value), dtype=dtype)
