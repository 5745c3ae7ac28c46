"""@gpk.compile: a function traced once per signature and replayed from a planned schedule."""

from __future__ import annotations

import functools
import gc
import math
import operator
import threading
import time
import warnings
from dataclasses import dataclass, field
from threading import get_ident
from typing import Any, NamedTuple

import numpy as np

from pygpukit import _rust, errors, memory, settings
from pygpukit.array import GPUArray, realize_arrays
from pygpukit.backends import devices
from pygpukit.ir import Node, SourceLoc
from pygpukit.ir.node import _ids as node_ids  # the counter Node() takes its ids from
from pygpukit.memory import Storage

from .captures import Values, Watch, scan
from .pytree import TreeDef, describe, flatten_call, is_array, unflatten
from .trace import TRACING, Traced, trace

# Traced and passed programs shared across CompiledFunctions made with the same `share`
# key (a model loaded twice, a second Generator): structure key -> _Template, least
# recently used first. A template holds no captured array (weights bind per function),
# only the graph, its schedule and the constants made while tracing.
_SHARED: dict[Any, _Template] = {}
SHARED_KEPT = 16
_SHARED_LOCK = threading.Lock()  # ranks of a tensor-parallel model trace in threads


def _shared_get(key: Any) -> _Template | None:
    with _SHARED_LOCK:
        template = _SHARED.pop(key, None)
        if template is not None:
            _SHARED[key] = template  # the most recently used last
        return template


def _shared_put(key: Any, template: _Template) -> None:
    with _SHARED_LOCK:
        _SHARED[key] = template
        while len(_SHARED) > SHARED_KEPT:
            _SHARED.pop(next(iter(_SHARED)))


_WARN_AFTER = 3  # misses (after the first trace) before the one-time warning
_RELEASES = memory.RELEASES  # [explicit releases so far]: a freed check when it moved


class StaleOutputError(errors.FreedArrayError):
    """A static output view was read after a later call overwrote it."""


_new = object.__new__


class _StaticSlot(Storage):
    """The storage of a static output: the arena block, valid for one call's results."""

    __slots__ = ("_fn", "_gen", "_evicted", "_what")
    _fn: CompiledFunction
    _gen: int
    _evicted: int
    _what: str

    @classmethod
    def of(cls, base: Storage, fn: CompiledFunction, what: str) -> _StaticSlot:
        # Made on every call: the slots are set here, not through Storage's generic
        # constructor and its defaults.
        s = _new(cls)
        # A static output goes stale at the next call without being released: the freed
        # checks that only run once something was released (memory.RELEASES) must run.
        _RELEASES[0] += 1
        s._h, s._pins, s.gen = None, 0, 0
        s.pool, s.nbytes, s._addr = base.pool, base.nbytes, base.addr
        s._fn, s._gen, s._evicted, s._what = fn, fn._calls, fn._evictions, what
        return s

    @property
    def freed(self) -> bool:
        if self._fn._evictions != self._evicted:
            raise StaleOutputError(
                f"{self._fn.__name__}: output {self._what} is a view into the compiled graph's "
                f"buffers (static_outputs=True) from call {self._gen}, and entries of its cache "
                "have been evicted since (their buffers went back to the pool); copy it "
                "(y.copy()) before calling again"
            )
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
        """Arena, input and output bytes together: what the scheduler reserves for a call."""
        return self.arena_bytes + self.input_bytes + self.output_bytes


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * dtype.itemsize


@dataclass
class _Template:
    """What a trace, the passes and lowering made of one structure, any instance's."""

    graph: Any  # the traced Graph
    out_tree: TreeDef
    n_outputs: int
    constants: list[Any]
    writeback_persistent: list[int]
    writeback_args: list[int]
    persistent_index: list[int]  # into the captured arrays, view bases appended
    schedule: Any
    phases_ms: dict[str, float]  # what making it cost (trace, passes)

    def traced(self, captured: list[tuple[str, Any]]) -> Traced:
        """The trace as if made with these captured arrays (same structure)."""
        return Traced(self.graph, self.out_tree, self.n_outputs,
                      [captured[i][1] for i in self.persistent_index], self.constants,
                      self.writeback_persistent, self.writeback_args,
                      self.persistent_index)  # fmt: skip


@dataclass
class _Entry:
    traced: Traced
    program: Any  # executor.PlannedProgram
    signature: dict[str, str]
    trace_ms: float  # trace, passes and planning: what the miss cost before running
    outputs: _Outputs
    phases_ms: dict[str, float] = field(default_factory=dict)  # trace_ms split up
    reservation: Reservation | None = None  # set by the first reservation() that hits it
    shared: bool = False  # traced and passed by another function of the same share key


class CompiledFunction:
    """The callable @gpk.compile returns; see gpk.compile."""

    def __init__(self, fn: Any, static_outputs: bool = False, cache_size: int | None = None,
                 share: Any = None) -> None:  # fmt: skip
        if cache_size is not None and (
            isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1
        ):
            raise errors.GPUKitValueError(
                f"gpk.compile: cache_size must be an int >= 1 (entries kept), got {cache_size!r}"
            )
        if share is not None:
            try:
                hash(share)
            except TypeError:
                raise errors.GPUKitValueError(
                    f"gpk.compile: share must be hashable, got {type(share).__name__}"
                ) from None
        self.__wrapped_fn__ = fn
        self.share = share
        self._shared_hits = 0  # entries made from another function's trace
        self.static_outputs = static_outputs
        self.cache_size = cache_size  # None: settings.compile_cache_size() when it fills
        self.__name__ = getattr(fn, "__name__", "compiled")
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._cache: dict[Any, _Entry] = {}  # least recently used first
        self._evictions = 0
        self._warned_evicting = False
        self._last_key: Any = None
        self._calls = 0
        self._hits = 0  # the full path's (fast_hits are counted apart)
        self._misses = 0
        self._reasons: list[str] = []
        self._warned = False
        self._fast: _Guard | None = None  # the last call's signature: hits check only it
        # Its hit(), where a plain call can take it (see _Guard.hit); None otherwise.
        self._hit: Any = None
        self._fast_hits = 0  # hits the guard served, without flattening and rescanning
        self._where = _definition(fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    # -- cache --------------------------------------------------------------------------
    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any],
             watch: Watch | None = None) -> tuple[Any, ...]:  # fmt: skip
        arrays: list[tuple[str, Any]] = []
        objects: list[tuple[str, Any]] = []
        tree = flatten_call(args, kwargs, arrays, objects)
        from pygpukit.creation import asarray

        arrays = [(p, a if not isinstance(a, np.ndarray) else asarray(a)) for p, a in arrays]
        values = Values()
        captured = scan(self.__wrapped_fn__, objects, watch, values)
        if values.host_arrays:
            raise self._host_array(*values.host_arrays[0])
        from pygpukit.backends import get_backend

        backend = get_backend()
        key = (
            backend.name,  # a plan built for one backend never runs on another
            backend.ordinal,  # nor one built for one device on another
            tree,
            tuple((a.shape, a.dtype.name) for _, a in arrays),
            tuple(id(a) for _, a in captured),
            values.key(),  # any of them may have shaped the trace
        )
        return key, tree, arrays, captured, values

    def _host_array(self, path: str, a: np.ndarray) -> errors.TraceError:
        return errors.TraceError(
            f"{self.__name__}: captured {path} is a NumPy array ({a.dtype}{list(a.shape)}); "
            "a compiled function cannot see changes made to a host array in place: pass it "
            "as an argument (read on every call), or capture gpk.asarray(...) of it"
        )

    def _check_host_items(self, traced: Traced, items: list[tuple[str, np.ndarray]]) -> None:
        """TraceError for a host array inside a captured container (`tables[0]`) whose
        contents became a constant of the graph (compared sorted: a transpose or a reshape
        of it is the same values)."""
        from pygpukit.backends import get_backend

        if not items or not traced.constants:
            return
        to_numpy = get_backend().to_numpy
        consts = [np.sort(np.asarray(to_numpy(c)).ravel()) for c in traced.constants]
        for path, a in items:
            if a.size <= 1 or a.dtype.kind not in "biuf":
                continue
            mine = np.sort(a.ravel())
            for c in consts:
                if (
                    c.size == a.size
                    and c.dtype.kind in "biuf"
                    and np.array_equal(c.astype(np.float64), mine.astype(np.float64))
                ):
                    raise self._host_array(path, a)

    @staticmethod
    def _signature(tree: TreeDef, arrays: list[tuple[str, Any]], captured: list[tuple[str, Any]],
                   values: Values) -> dict[str, str]:  # fmt: skip
        sig: dict[str, str] = {}
        for p, v in values.scalars:
            sig[f"captured {p}"] = f"value {v!r}"
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
            elif a.startswith("array id ") and b.startswith("array id "):
                out.append(f"{p} rebound to another array")
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

    def _guard(self, fast: _Guard | None) -> None:
        """Make `fast` the last call's guard; the old one's hits join the counts."""
        old = self._fast
        if old is not None:
            hits = old.hits + (old.native.take_hits() if old.native is not None else 0)
            self._fast_hits += hits
            self._calls += hits
            old.hits = 0
        self._fast = fast
        if fast is None or not fast.quick:
            self._hit = None
        else:  # the native hit where the guard has one (one array in, one out)
            self._hit = fast.hit if fast.native is None else fast.native

    def stats(self) -> dict[str, Any]:
        """hits, misses, the reason of each miss, and the cached entries' plans."""
        fast = self._fast
        quick = 0  # not yet in the counts
        if fast is not None:
            quick = fast.hits + (fast.native.hits if fast.native is not None else 0)
        return {
            "calls": self._calls + quick,
            "hits": self._hits + self._fast_hits + quick,
            "fast_hits": self._fast_hits + quick,
            "misses": self._misses,
            "reasons": list(self._reasons),
            "evictions": self._evictions,
            "shared_hits": self._shared_hits,
            "entries": [
                {
                    "signature": dict(e.signature),
                    "trace_ms": e.trace_ms,
                    "phases_ms": dict(e.phases_ms),
                    "shared": e.shared,
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
        values: Values,
        stacklevel: int = 5,  # the warning points at the user's line (through _call)
    ) -> _Entry:
        from pygpukit.backends import get_backend
        from pygpukit.executor import PlannedProgram
        from pygpukit.passes import lower, run_pipeline

        sig = self._signature(tree, arrays, captured, values)
        if devices.ACTIVE[0]:  # a plan is one device's: a call on another misses
            from pygpukit.device import current_device

            sig["device"] = str(current_device())
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
        skey = self._shared_key(tree, arrays, captured, values, sig)
        template = _shared_get(skey) if skey is not None else None
        if template is not None:
            traced, schedule = template.traced(captured), template.schedule
            self._shared_hits += 1
            t1 = t2 = time.perf_counter()
        else:
            traced = trace(self.__wrapped_fn__, args, kwargs, [a for _, a in arrays], tree,
                           captured, self.__name__)  # fmt: skip
            self._check_host_items(traced, values.host_items)
            t1 = time.perf_counter()
            schedule = lower(run_pipeline(traced.graph))
            t2 = time.perf_counter()
            if skey is not None:
                _shared_put(skey, _Template(
                    traced.graph, traced.out_tree, traced.n_outputs, traced.constants,
                    traced.writeback_persistent, traced.writeback_args,
                    traced.persistent_index, schedule,
                    {"trace": (t1 - t0) * 1e3, "passes": (t2 - t1) * 1e3}))  # fmt: skip
        n_args = len(arrays)
        ins = schedule.input_slots
        external = ins[n_args:]
        n_user = traced.n_outputs
        outs = schedule.output_slots
        writeback = [(outs[n_user + j], external[p])
                     for j, p in enumerate(traced.writeback_persistent)]  # fmt: skip
        program = PlannedProgram(schedule, get_backend(), external, writeback, n_user)
        t3 = time.perf_counter()
        entry = _Entry(traced, program, sig, (t3 - t0) * 1e3,
                       _Outputs(traced, program, self._where),
                       {"trace": (t1 - t0) * 1e3, "passes": (t2 - t1) * 1e3,
                        "plan": (t3 - t2) * 1e3}, shared=template is not None)  # fmt: skip
        self._cache[key] = entry
        self._evict(stacklevel + 1)
        return entry

    def _shared_key(self, tree: TreeDef, arrays: list[tuple[str, Any]],
                    captured: list[tuple[str, Any]], values: Values,
                    sig: dict[str, str]) -> Any:  # fmt: skip
        """The key another function made with the same `share` finds this call's trace
        under, or None where a trace cannot be shared: the share key, the backend and
        device, the arguments' structure, shapes and dtypes, and what the walk of the
        captures found by path -- each object's class and function's code, each array's
        shape and dtype, each scalar's value. Calls with opaque object arguments, captured
        views (their offsets shape the graph) or host arrays in containers (their contents
        may be constants) are traced for themselves."""
        if self.share is None or values.host_items or _has_objects(tree):
            return None
        if any(a.base is not None for _, a in captured):
            return None
        from pygpukit.backends import get_backend

        backend = get_backend()
        return (self.share, backend.name, backend.ordinal, sig.get("device"), tree,
                tuple((p, a.shape, a.dtype.name) for p, a in arrays),
                tuple((p, a.shape, a.dtype.name) for p, a in captured),
                values.key(), tuple(values.kinds))  # fmt: skip

    def _evict(self, stacklevel: int) -> None:
        """Drop the least recently used entries beyond the cache size; their arenas and
        captured graphs go back (warned once: a function traced for ever-new signatures)."""
        size = self.cache_size or settings.compile_cache_size()
        while len(self._cache) > size:
            old = self._cache.pop(next(iter(self._cache)))
            if self._fast is not None and self._fast.entry is old:
                self._guard(None)
            old.program.close()
            self._evictions += 1
            if not self._warned_evicting:
                self._warned_evicting = True
                warnings.warn(
                    f"{self.__name__}: its cache of {size} entries is full, so the least "
                    "recently used entry was evicted (traced again when called); reasons of "
                    "the misses: " + " | ".join(self._reasons[1:][-8:]),
                    stacklevel=stacklevel,
                )

    def reservation(self, *args: Any, **kwargs: Any) -> Reservation:
        """The memory a call with these arguments needs, known before it runs (a cache miss
        traces and plans the graph here, and the call then hits). Arguments that pass the
        last call's guard cost that check alone: each entry keeps its reservation (a
        scheduler asks on every submit)."""
        fast = self._fast
        if fast is not None and fast.entry.reservation is not None:
            if fast.match(args, kwargs) is not None:
                return fast.entry.reservation
        key, tree, arrays, captured, values = self._key(args, kwargs)
        realize_arrays([a for _, a in arrays + captured])  # views share their bases' memory
        entry = self._cache.get(key)
        if entry is None:
            self._check_freed([(f"captured {p}", a) for p, a in captured] + arrays)
            entry = self._compile(key, args, kwargs, tree, arrays, captured, values,
                                  stacklevel=3)  # fmt: skip
            self._last_key = key
        prog = entry.program
        nodes = prog.schedule.graph.nodes
        outs = prog.schedule.graph.outputs[: entry.traced.n_outputs]
        traffic = sum(_nbytes(st.shape, st.dtype)
                      + sum(_nbytes(nodes[i].shape, nodes[i].dtype) for i in st.ins)
                      for _, st in prog.kernels)  # fmt: skip
        # The key fixes every argument's shape and dtype: the same for each call it hits.
        entry.reservation = Reservation(
            prog.plan.arena_bytes,
            sum(_nbytes(a.shape, a.dtype) for _, a in arrays),
            0 if self.static_outputs else sum(_nbytes(n.shape, n.dtype) for n in outs),
            traffic,
        )
        return entry.reservation

    def reservation_bytes(self, *args: Any, **kwargs: Any) -> int:
        """The total bytes a call with these arguments needs (`reservation(...).total`).

        Args:
            *args: The call's positional arguments.
            **kwargs: The call's keyword arguments.

        Returns:
            Arena, input and output bytes together.
        """
        return self.reservation(*args, **kwargs).total

    def reserve_matched(self, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> tuple[Reservation, Any]:  # fmt: skip
        """reservation(*args, **kwargs), and a ticket for call_in_matched: the argument
        values when they hit the last call's guard (else None), so a scheduler that
        reserves a call and launches it at once checks the arguments once."""
        fast = self._fast
        if fast is not None and fast.entry.reservation is not None:
            native = fast.native
            if native is not None and native is self._hit and not kwargs \
                    and native.matches(args):  # fmt: skip
                # Checked natively (no values kept): call_in_matched runs the native hit.
                return fast.entry.reservation, (fast, None)
            values = fast.match(args, kwargs)
            if values is not None:
                return fast.entry.reservation, (fast, values)
        return self.reservation(*args, **kwargs), None

    def call_in_matched(self, ticket: Any, arena: Storage, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:  # fmt: skip
        """call_in(arena, *args, **kwargs) for the arguments reserve_matched gave `ticket`
        for: run without matching them again while that guard is still the last call's;
        otherwise (another call came between, or none was matched) the usual call."""
        if (
            ticket is None
            or ticket[0] is not self._fast
            or devices.ACTIVE[0]
            or (TRACING and get_ident() in TRACING)
        ):
            return self._call(args, kwargs, arena)
        fast, values = ticket
        prog = fast.entry.program
        hit = self._hit
        if (hit is not None and hit is fast.native and not kwargs and arena is prog.arena
                and fast.plain and not self.static_outputs):  # fmt: skip
            # Runs in the program's own arena: exactly the direct call, so its native hit
            # (the guard's check again, the quick call and the result array in one native
            # call; it counts itself). A miss there changed nothing: the paths below.
            out = hit(args)
            if out is not _MISS:
                return out
        if values is None:  # matched natively, but not run by the hit: the usual call
            return self._call(args, kwargs, arena)
        if fast.releases != _RELEASES[0]:  # something was freed since the last check
            fast.check_freed(values)
        self._fast_hits += 1
        if arena is prog.arena and fast.plain and not self.static_outputs:
            # The program already runs in this arena (a scheduler's spare, step after
            # step): the direct call's run, its outputs written into fresh blocks (the
            # program's quick call where it has one: one native call). The first call in
            # a new arena binds it through _run below.
            self._calls += 1
            quick = prog.quick
            outs = None if quick is None else quick(values)
            if outs is None:
                outs = prog.call(values, fast.externals, True, True)
            return fast.results(outs)
        return self._run(fast.entry, values, fast.externals, True, arena)

    def call_in(self, arena: Storage, *args: Any, **kwargs: Any) -> Any:
        """Call with the graph's arena placed in `arena`, a pool block of at least
        `reservation(...).arena_bytes` that the caller owns (the scheduler reserves it at
        admission and frees it when the task ends)."""
        return self._call(args, kwargs, arena)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hit = self._hit
        if hit is not None and not kwargs:
            out = hit(args)
            if out is not _MISS:
                return out
        return self._call(args, kwargs, None)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], arena: Any) -> Any:
        """A call (arena: see call_in): a hit of the last call's guard runs the cached
        entry at once; anything else takes the full path. While another compiled function
        is being traced, the call is traced into its graph (inlined)."""
        if TRACING and get_ident() in TRACING:
            return self.__wrapped_fn__(*args, **kwargs)
        if devices.ACTIVE[0]:
            return self._call_on_device(args, kwargs, arena)
        fast = self._fast
        if fast is not None:
            values = fast.match(args, kwargs)
            if values is not None:
                if fast.releases != _RELEASES[0]:  # something was freed since the last check
                    fast.check_freed(values)
                self._fast_hits += 1
                if arena is None and fast.plain and not self.static_outputs:
                    self._calls += 1  # _run's usual case, inline
                    return fast.results(fast.call(values, fast.externals, True, True))
                return self._run(fast.entry, values, fast.externals, True, arena)
        return self._call_slow(args, kwargs, arena)

    def _call_on_device(self, args: tuple[Any, ...], kwargs: dict[str, Any], arena: Any) -> Any:
        """With several devices in use, a call runs on its array arguments' device (the
        current one when it has none), through the full path: the fast guard matches
        shapes and identities, not devices."""
        arrays: list[tuple[str, Any]] = []
        flatten_call(args, kwargs, arrays, [])
        on = {devices.ordinal_of(a._node): p for p, a in arrays if isinstance(a, GPUArray)}
        if len(on) > 1:
            from pygpukit.device import device_of

            where = ", ".join(f"{p} on {device_of(o)}" for o, p in on.items())
            raise errors.user_error(errors.DeviceMismatchError, self.__name__,
                                    f"arguments on different devices: {where}; copy them to "
                                    "one with x.to(device) first")  # fmt: skip
        ordinal = next(iter(on)) if on else devices.current_ordinal()
        with devices.using(ordinal):
            return self._call_slow(args, kwargs, arena)

    def _call_slow(self, args: tuple[Any, ...], kwargs: dict[str, Any], arena: Any) -> Any:
        self._guard(None)
        watch = Watch()
        key, tree, arrays, captured, values = self._key(args, kwargs, watch)
        realize_arrays([a for _, a in arrays + captured])  # views share their bases' memory
        releases = _RELEASES[0]
        named = [(f"captured {p}", a) for p, a in captured] + arrays
        self._check_freed(named)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(key, args, kwargs, tree, arrays, captured, values)
        else:
            self._hits += 1
            self._cache[key] = self._cache.pop(key)  # the most recently used last
        self._last_key = key
        persistent = entry.traced.persistent
        externals = [a._node.realized for a in persistent] + entry.traced.constants
        given = [a for _, a in arrays]
        where = {id(a): p for p, a in named}
        self._guard(_Guard.build(entry, args, kwargs, given, watch, externals, releases,
                                 [where.get(id(a), "a captured view's base")
                                  for a in given + persistent], self.static_outputs))  # fmt: skip
        return self._run(entry, [a._node.realized for a in given], externals, False, arena)

    def _check_freed(self, arrays: list[tuple[str, Any]]) -> None:
        """FreedArrayError naming the first argument or captured array whose memory was
        freed (array.free()): a compiled call would read it, or write into the block
        something else now holds."""
        from pygpukit.backends import get_backend

        storage = get_backend().storage
        for path, a in arrays:
            if storage(a._node.realized).freed:
                raise _freed(self.__name__, path, a._node)

    def _run(self, entry: _Entry, args: list[Any], externals: list[Any], same: bool,
             arena: Any) -> Any:  # fmt: skip
        """One call of a cached entry: args are the argument arrays' realised values."""
        prog = entry.program
        if arena is not None:
            if arena.nbytes < prog.plan.arena_bytes:
                raise ValueError(f"{self.__name__}: arena of {arena.nbytes} bytes is smaller "
                                 f"than the plan's {prog.plan.arena_bytes}")  # fmt: skip
            prog.use_arena(arena)
        self._calls += 1
        # A scheduled call's results outlive the next call (tasks hold them): their blocks
        # never recur, so they are copied out of the arena rather than bound.
        values = prog.call(args, externals, not self.static_outputs, same, arena is None)
        out = entry.outputs
        if out.writeback_args:
            copy_into = prog.backend.copy_into
            for k, j in out.writeback_args:
                copy_into(args[k], values[j])
        if self.static_outputs:
            with_storage, storage = prog.backend.with_storage, prog.backend.storage
            values = [with_storage(v, _StaticSlot.of(storage(v), self, what))
                      for v, what in zip(values, out.what)]  # noqa: B905  # fmt: skip
        return out.build(values)


class _Outputs:
    """What turns an entry's output values into the user's result, precomputed."""

    def __init__(self, traced: Traced, program: Any, where: Any) -> None:
        n = traced.n_outputs
        nodes = program.schedule.graph.outputs[:n]
        self.tree = traced.out_tree
        self.single = traced.out_tree == ("*",)
        # Result arrays are leaves made at the compiled function's definition: finding the
        # caller's line (a stack walk) per output per call costs more than the call.
        self.leaves = [({"shape": m.shape, "dtype": m.dtype.name}, m.shape, m.dtype)
                       for m in nodes]  # fmt: skip
        self.where = where
        self.what = [f"{k} ({m.dtype.short}{list(m.shape)})" for k, m in enumerate(nodes)]
        first = n + len(traced.writeback_persistent)
        self.writeback_args = [(k, first + j) for j, k in enumerate(traced.writeback_args)]

    def build(self, values: list[Any]) -> Any:
        if self.single:
            attrs, shape, dtype = self.leaves[0]
            node = Node("input", (), attrs, shape, dtype, self.where, frozen=True)
            node.realized = values[0]
            return GPUArray(node)
        where = self.where
        outs = []
        for v, (attrs, shape, dtype) in zip(values, self.leaves, strict=False):
            node = Node("input", (), attrs, shape, dtype, where, frozen=True)
            node.realized = v
            outs.append(GPUArray(node))
        return unflatten(self.tree, iter(outs), iter(()))


def _freed(name: str, what: str, node: Node) -> errors.FreedArrayError:
    return errors.FreedArrayError(
        f"{name}: {what} ({node.dtype.short}{list(node.shape)}) was freed (array.free()); "
        "a compiled call would read freed memory or write into a block reused since"
    )


_ARRAY, _VALUE, _FLOAT, _OBJECT = range(4)
_MISS = object()  # _Guard.hit's answer for a call it does not serve
_is = operator.is_
_NODE = operator.attrgetter("_node")
_FEW_PERSISTENT = 8  # measured break-even of the two ways to check persistent arrays


class _Guard:
    """The last call's signature, checked with a few comparisons per argument: a call
    that matches it would get the same cache key (same structure, shapes, dtypes, static
    values, objects; the captured containers hold the same objects, so a rescan would
    find the same arrays; the persistent arrays still hold the same realised nodes)."""

    __slots__ = ("entry", "n", "kw", "sigs", "checks", "containers", "persistent", "held",
                 "globals", "externals", "plain", "call", "results", "releases", "paths",
                 "name", "prog", "quick", "hits", "one", "sig1", "native")  # fmt: skip

    def __init__(self, entry: _Entry, kw: tuple[str, ...], checks: list[Any], watch: Watch,
                 externals: list[Any], releases: int, paths: list[str],
                 static_outputs: bool = False) -> None:  # fmt: skip
        self.entry, self.n, self.kw = entry, len(checks), kw
        # Memory released since `releases` (memory.RELEASES) may be the arguments' or the
        # persistent arrays': check_freed then looks, before the call runs.
        self.releases, self.paths, self.name = releases, paths, entry.traced.graph.name
        # All arguments arrays (the usual case): (shape, dtype) per argument, one loop.
        arrays = all(c[0] == _ARRAY for c in checks)
        self.sigs = [(a, b) for _, a, b in checks] if arrays else None
        self.checks = checks
        # A lazy write gives a persistent array a new node. A few arrays join the
        # containers (their referents include the node); many are read node by node
        # (fewer items to compare than all their referents).
        persistent = list(entry.traced.persistent)
        few = len(persistent) <= _FEW_PERSISTENT
        self.containers = (*watch.containers, *persistent) if few else tuple(watch.containers)
        self.persistent = [] if few else persistent
        # The globals the function names, by name (dict.get bound once per dict).
        self.globals = [(g.get, names) for g, names in watch.globals]
        # Strong references: the objects compared by identity cannot be freed and their
        # ids reused while the guard lives.
        self.held = self._now()
        self.externals = externals  # their realised values: valid while `held` holds
        # No arguments written back: with fresh outputs, a hit is one program call and
        # one build of the results, through methods bound once here.
        self.plain = not entry.outputs.writeback_args
        self.call, self.results = entry.program.call, entry.outputs.build
        self.prog = entry.program
        # Positional arrays in, fresh arrays out, nothing written back: hit() serves the
        # call from CompiledFunction.__call__ (its hits are counted here, see _guard).
        self.quick = self.plain and not static_outputs and not kw and self.sigs is not None
        self.hits = 0
        # One array argument, one array result (the common call): hit() without loops.
        out = entry.outputs
        self.one = out.leaves[0] + (out.where,) if out.single else None
        self.sig1 = self.sigs[0] if self.sigs is not None and len(self.sigs) == 1 else None
        # hit() in one native call (rust/pygpukit-py/src/hit.rs) for one array in and one
        # out, with every persistent array among the containers: CompiledFunction.__call__
        # calls it instead of hit(); it counts its hits itself (see _guard and stats).
        self.native = None
        if self.quick and self.sig1 is not None and self.one is not None and not self.persistent:
            self.native = _rust.CompiledHit(
                self, self.prog, _MISS, TRACING, devices.ACTIVE, _RELEASES, GPUArray, Node,
                node_ids, self.sig1, list(self.containers),
                [(g, list(names)) for g, names in watch.globals], list(self.held), self.one,
            )  # fmt: skip

    @classmethod
    def build(cls, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any],
              arrays: list[Any], watch: Watch, externals: list[Any], releases: int,
              paths: list[str], static_outputs: bool = False) -> _Guard | None:  # fmt: skip
        """None when the arguments are not flat (nested pytrees, NumPy arrays): those
        calls take the full path."""
        checks = []
        k = 0
        for v in list(args) + list(kwargs.values()):
            t = type(v)
            if t is GPUArray:
                if k >= len(arrays) or arrays[k] is not v:
                    return None
                checks.append((_ARRAY, v._node.shape, v._node.dtype))
                k += 1
            elif t is float:
                checks.append((_FLOAT, float, repr(v)))
            elif t in (int, bool, str, bytes, type(None), complex):
                checks.append((_VALUE, t, v))
            elif isinstance(v, tuple | list | dict | np.ndarray) or is_array(v):
                return None
            else:
                checks.append((_OBJECT, v, None))
        if k != len(arrays):
            return None
        return cls(entry, tuple(kwargs), checks, watch, externals, releases, paths, static_outputs)

    def check_freed(self, values: list[Any]) -> None:
        """FreedArrayError if an argument's or a persistent array's memory was freed."""
        releases = _RELEASES[0]
        storage = self.entry.program.backend.storage
        nodes = self.entry.traced.graph.inputs
        n_args = len(values)
        persistent = self.externals[: len(self.entry.traced.persistent)]
        for k, v in enumerate(values + persistent):
            if storage(v).freed:
                node = nodes[k] if k < n_args else self.entry.traced.persistent[k - n_args]._node
                raise _freed(self.name, self.paths[k], node)
        self.releases = releases

    def match(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
        """The argument arrays' values when this call hits the guarded entry, else None."""
        if kwargs:
            if tuple(kwargs) != self.kw:
                return None
            args = args + tuple(kwargs.values())
        elif self.kw:
            return None
        if len(args) != self.n:
            return None
        if self.sigs is None:
            values = self._mixed(args)
            if values is None:
                return None
        else:
            values = []
            for v, (shape, dtype) in zip(args, self.sigs):  # noqa: B905 (a keyword slows zip)
                if type(v) is not GPUArray:
                    return None
                node = v._node
                if node.shape != shape or node.dtype is not dtype:
                    return None
                r = node.realized
                if r is None:
                    return None
                values.append(r)
        now = gc.get_referents(*self.containers)  # _now(), inline: it runs on every hit
        for get, names in self.globals:
            now += map(get, names)
        if self.persistent:
            now += map(_NODE, self.persistent)
        held = self.held
        # By identity: an array's __eq__ records an op.
        if len(now) != len(held) or not all(map(_is, now, held)):
            return None
        return values

    def hit(self, args: tuple[Any, ...]) -> Any:
        """The result of a call with these positional arguments when it hits this guard
        (match() and the plain fresh-output run of CompiledFunction._call in one frame,
        the program's quick call where it has one), else _MISS: the caller takes _call,
        which decides everything again (another thread tracing, several devices)."""
        if TRACING or devices.ACTIVE[0] or len(args) != self.n:
            return _MISS
        if self.sig1 is not None:
            v = args[0]
            if type(v) is not GPUArray:
                return _MISS
            node = v._raw if v._link is None else v._node  # a view re-derives its node
            shape, dtype = self.sig1
            r = node.realized
            if node.shape != shape or node.dtype is not dtype or r is None:
                return _MISS
            values = [r]
        else:
            values = []
            for v, (shape, dtype) in zip(args, self.sigs):  # type: ignore[arg-type]  # noqa: B905
                if type(v) is not GPUArray:
                    return _MISS
                node = v._raw if v._link is None else v._node
                r = node.realized
                if node.shape != shape or node.dtype is not dtype or r is None:
                    return _MISS
                values.append(r)
        now = gc.get_referents(*self.containers)  # as in match()
        for get, names in self.globals:
            now += map(get, names)
        if self.persistent:
            now += map(_NODE, self.persistent)
        held = self.held
        if len(now) != len(held) or not all(map(_is, now, held)):
            return _MISS
        if self.releases != _RELEASES[0]:  # something was freed since the last check
            self.check_freed(values)
        self.hits += 1
        prog = self.prog
        quick = prog.quick
        outs = None if quick is None else quick(values)
        if outs is None:
            outs = prog.call(values, self.externals, True, True)
        one = self.one
        if one is None:
            return self.results(outs)
        attrs, shape, dtype, where = one  # _Outputs.build of one array, inline
        node = Node("input", (), attrs, shape, dtype, where, frozen=True)
        node.realized = outs[0]
        return GPUArray(node)

    def _now(self) -> list[Any]:
        """What the containers hold, what the globals name, the persistent arrays' nodes."""
        now = gc.get_referents(*self.containers)
        for get, names in self.globals:
            now += map(get, names)
        now += map(_NODE, self.persistent)
        return now

    def _mixed(self, args: tuple[Any, ...]) -> list[Any] | None:
        arrays = []
        for v, (kind, a, b) in zip(args, self.checks, strict=False):
            if kind == _ARRAY:
                if type(v) is not GPUArray:
                    return None
                node = v._node
                if node.shape != a or node.dtype is not b or node.realized is None:
                    return None
                arrays.append(node.realized)
            elif kind == _VALUE:
                if type(v) is not a or v != b:
                    return None
            elif kind == _FLOAT:
                if type(v) is not float or repr(v) != b:
                    return None
            elif v is not a:
                return None
        return arrays


def _has_objects(tree: TreeDef) -> bool:
    """Whether a call's structure holds an opaque object (keyed by its identity)."""
    if tree[0] == "obj":
        return True
    return any(isinstance(t, tuple) and t and _has_objects(t) for t in tree[1:])


def _definition(fn: Any) -> SourceLoc | None:
    """Where fn is defined: the location of the arrays a compiled call returns."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None),
                                                    "__code__", None)  # fmt: skip
    if code is None:
        return None
    return SourceLoc(code.co_filename, code.co_firstlineno, getattr(fn, "__name__", ""))


def compile(fn: Any = None, *, static_outputs: bool = False,  # noqa: A001
            cache_size: int | None = None, share: Any = None) -> Any:  # fmt: skip
    """Trace `fn` once per signature into one graph, fuse and plan it, and replay it.

    The cache key is the arguments' structure, shapes, dtypes and static Python values
    (ints, floats, strings, tuples), the identity of persistent arrays the function reads
    from closures, globals or objects (referenced, not copied), and the values of the
    Python scalars reachable there (a changed global float or attribute is a miss, never a
    stale result). Captured host NumPy arrays are refused: pass them as arguments. Use
    gpk.scalar(i) or a 0-d array for values that change every call. `fn.stats()` reports
    hits, misses with their reasons and evictions (fast_hits: hits the last call's guard
    served without re-walking the captures). Called while another compiled function is
    traced, the function is traced into that graph (inlined). A graph of a few kernels reads
    its arguments and writes its results in place (no copies; one capture per set of
    addresses, which recur as the pool hands blocks back); a bigger one does so for large
    arrays only and copies small ones (token ids, device scalars) into its slots, keeping one
    capture. Usable as `@gpk.compile` or `@gpk.compile(cache_size=8)`.

    Args:
        fn: The function of arrays; None when used as `@gpk.compile(...)` with options.
        static_outputs: Return views into the graph's buffers instead of fresh arrays, valid
            until the next call (reading one later raises StaleOutputError).
        cache_size: Signatures kept, least recently used evicted first with their buffers
            and captured graphs; None: settings.compile_cache_size() (PYGPUKIT_COMPILE_CACHE_SIZE,
            default 64).
        share: A hashable naming what `fn` computes (its code and the meaning of what it
            captures), to share traces across the compiled functions made with the same
            key: a miss whose arguments and captures have the same structure (by path: each
            object's class, function's code, array's shape and dtype, scalar's value) as a
            call another one traced reuses that trace and its passes (a model loaded again
            binds its own weights; `stats()["shared_hits"]` counts them). Each function
            still plans and captures its own program. None: nothing shared.

    Returns:
        A CompiledFunction (or, without `fn`, a decorator making one). Calling it raises
        TraceError for what tracing cannot record (a traced value needed in Python, a
        captured host array, a returned object that is not an array or a scalar) and
        FreedArrayError for a freed argument or captured array, before anything runs.

    Raises:
        ValueError: `cache_size` is not an int >= 1.
    """
    if fn is None:
        return functools.partial(compile, static_outputs=static_outputs, cache_size=cache_size,
                                 share=share)  # fmt: skip
    return CompiledFunction(fn, static_outputs=static_outputs, cache_size=cache_size,
                            share=share)  # fmt: skip


def scalar(value: int | float, dtype: Any = None) -> Any:
    """A device scalar: a 0-d array that compiled kernels read from memory.

    Use it for values that change on every call (a decode position): a new value is new data,
    not a new signature, so nothing is traced again.

    Args:
        value: The value.
        dtype: The dtype; by default int64 for an int, float32 for a float.

    Returns:
        A new 0-d array.
    """
    from pygpukit.creation import asarray

    if dtype is None:
        dtype = "int64" if isinstance(value, int) and not isinstance(value, bool) else "float32"
    return asarray(np.asarray(value), dtype=dtype)
