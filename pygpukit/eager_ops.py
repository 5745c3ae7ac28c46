"""Eager elementwise ops without recording: a call seen before runs its cached schedule.

An eager `x + 1` on today's path records a `full` node for the scalar and realizes it, then
records the add and realizes a graph of three nodes (toposort, structure key, schedule
cache): two realizes for one op. Here a call is keyed by what today's path would decide
from: the op, its attributes, each operand's shape, dtype and layout (a realised array)
or type and value (a Python scalar: NEP 50 gives it the other operand's dtype, and the
value is a constant of the graph; kernels take it baked in), which operands are the same
array, the backend and the passes skipped. The first call of a key takes today's path with
its realizes captured (runtime.CAPTURE) and, when the last one read only the operands and
scalar constants made by this call, keeps that realize's schedule, the constants' values
(so a later call feeds the same schedule the same inputs) and which line each schedule
location came from. A later call of the key is one backend.run and a realised node with
the op's attributes and the user's line: what a realised op node of today's path is. Once
the backend has a replay of the schedule for the key's layouts (backend.eager_replay: on
CUDA the controller's recorded plan, dispatch.EagerReplay) the key keeps it, and a call is
that replay alone: the output block(s) and one `Dispatcher.run`, with no schedule lookup by
layouts on the way. A binary key with such a replay is also filed with NATIVE
(`_rust.EagerHits`): the array operators ask it first, and it serves the call in one native
call (the key's check, the controller's run, the result's objects) while the key stays in
the cache and no setting changes; it answers None for anything else. Errors are today's: a
first call raises as it always did (nothing is kept), and the key holds every shape and
dtype, so a call that would fail differently is a new key. A run error names the line of
the call that ran (errors.note_run).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pygpukit import _rust, errors, memory, settings
from pygpukit.ir import Node
from pygpukit.ir import node as node_mod
from pygpukit.ir.source import LIBRARY_FILES, user_frame

from . import backends, runtime
from .backends.cuda.value import DeviceValue

LIMIT = 1024  # keys kept (LRU); each holds a schedule and its scalar constants
_known = Node.known  # bound once: every hit makes its realised node with it


class EagerOp:
    """A learnt eager call: the schedule and where each of its inputs comes from."""

    __slots__ = ("schedule", "sources", "op", "attrs", "items", "shape", "dtype", "built",
                 "lines", "replay", "filed")  # fmt: skip

    def __init__(self, schedule: Any, sources: list[Any], result: Node, lines: list[int]) -> None:
        self.schedule = schedule
        # Per schedule input: an int k, operand k's value; else the constant's value itself.
        self.sources = sources
        self.op = result.op
        self.attrs = result.attrs
        self.items = result.canonical_attrs()
        self.shape = result.shape
        self.dtype = result.dtype
        self.built = schedule.info["locs"]
        # Per built location: operand k's line (k >= 0), else the call's own (-1).
        self.lines = lines
        # backend.eager_replay's answer: a callable run of the schedule over these layouts
        # (on CUDA the controller's plan: one Dispatcher.run), None to ask again after the
        # next backend.run, False never (no replay for this backend or schedule).
        self.replay: Any = None
        # (replay, settings.CHANGES[0]) when last handed to NATIVE.register.
        self.filed: Any = None


def scalar_key(x: Any) -> Any:
    """A Python scalar's part of a key (None: not a Python scalar). Floats by repr where
    equality would merge what must differ (0.0 and -0.0, NaN)."""
    t = type(x)
    if t is float:
        return (float, x) if x and x == x else (float, repr(x))
    if t is int or t is bool:
        return (t, x)
    return None


def hit(entry: EagerOp, key: tuple[Any, ...], nodes: tuple[Node | None, ...],
        backend: Any) -> Node | None:  # fmt: skip
    """The realised node of an eager call keyed `key`, found in runtime.EAGER_CACHE as
    `entry`, over operand nodes `nodes` (None for a scalar): the cached schedule's run.
    None: an operand was freed, so the key is dropped and the caller takes learn(), whose
    today's path names it."""
    ins = [nodes[s].realized if type(s) is int else s for s in entry.sources]  # type: ignore[union-attr]
    if memory.RELEASES[0] and any(backend.storage(v).freed for v in ins):
        del runtime.EAGER_CACHE[key]
        NATIVE.forget(entry)
        return None
    where = user_frame(2)  # this frame and its caller's (the array layer): the library's
    errors.note_run(entry.built, [where if k < 0 else nodes[k].where  # type: ignore[union-attr]
                                  for k in entry.lines])  # fmt: skip
    stats = runtime.stats
    stats["realize_calls"] += 1
    stats["schedule_hits"] += 1
    replay = entry.replay
    if replay:
        value = replay(ins)
        if value is None:  # not this time (the controller off, a plan dropped, ...)
            entry.replay = None
            (value,) = backend.run(entry.schedule, ins)
        elif len(nodes) == 2 and entry.filed != (replay, settings.CHANGES[0]):
            _file(entry, key, nodes, replay)
    else:
        (value,) = backend.run(entry.schedule, ins)
        if replay is None:
            entry.replay = backend.eager_replay(entry.schedule, ins)
    try:
        runtime.EAGER_CACHE.move_to_end(key)
    except KeyError:  # another thread evicted it meanwhile
        pass
    out = _known(entry.op, (), entry.attrs, entry.items, entry.shape, entry.dtype, where)
    out.realized = value
    return out


def learn(key: tuple[Any, ...], nodes: tuple[Node | None, ...], call: Callable[[], Any],
           backend: Any) -> Node:  # fmt: skip
    """The realised node of `call()` (today's path, returning a GPUArray) for a key not in
    the cache (or whose operand was freed), kept under `key` when its last realize read only
    the operands `nodes` and the scalar constants this call made."""
    first = next(node_mod._ids)  # nodes made by this call have larger ids
    outer = runtime.CAPTURE[0]
    runs: list[tuple[Any, ...]] = []
    runtime.CAPTURE[0] = runs
    try:
        result = call()
    finally:
        runtime.CAPTURE[0] = outer
    if outer is not None:
        outer.extend(runs)
    node: Node = result._raw
    if not runs:
        return node
    schedule, order, leaves, pending = runs[-1]
    if len(pending) != 1 or pending[0] is not node or node.realized is None:
        return node
    sources: list[Any] = []
    for leaf in leaves:
        k = next((k for k, n in enumerate(nodes) if n is leaf), -1)
        if k >= 0:
            sources.append(k)
        elif leaf.op == "full" and leaf.id > first:
            sources.append(leaf.realized)  # a scalar made a constant by this call
        else:
            return node
    out_storage = backend.storage(node.realized)
    if any(type(s) is not int and backend.storage(s) is out_storage for s in sources):
        return node  # the result is a constant's memory: each call must own its own
    lines = [next((k for k, n in enumerate(nodes) if n is m), -1) for m in order]
    cache = runtime.EAGER_CACHE
    cache[key] = EagerOp(schedule, sources, node, lines)
    if len(cache) > LIMIT:
        NATIVE.forget(cache.popitem(last=False)[1])
    return node


def _file(entry: EagerOp, key: tuple[Any, ...], nodes: tuple[Node | None, ...],
          replay: Any) -> None:  # fmt: skip
    """Hand a binary key (array._eager_binary's: op, operand parts, same, backend, skipped
    passes) with its replay to NATIVE; it declines replays it cannot run (another
    backend's, an output that views an operand)."""
    entry.filed = (replay, settings.CHANGES[0])
    op, ka, kb, same, backend, _ = key
    a, b = _operand(ka, nodes[0]), _operand(kb, nodes[1])
    if a is not None and b is not None:
        NATIVE.register(sys.intern(op), entry, replay, (a, b), same, backend, entry.sources)


def _operand(part: tuple[Any, ...], node: Node | None) -> tuple[Any, ...] | None:
    """A key's operand part as NATIVE takes it: an array's (shape, dtype, strides, align)
    from (shape, dtype name, layout key), the CUDA backend's layout key being (strides,
    align) (None for another backend's); a scalar's (type, value)."""
    if node is not None:
        shape, _, layout = part
        if type(layout) is not tuple or len(layout) != 2:
            return None
        return (shape, node.dtype, *layout)
    t, value = part
    return (t, t(value) if type(value) is str else value)  # 0.0, -0.0, NaN by repr


def start_native(array_type: type) -> Any:
    """Make NATIVE, the native hits of binary keys (rust/pygpukit-py/src/eager.rs), for the
    array type (called once by pygpukit.array, which imports this module before it has
    one); cleared with the eager cache. Returns its `binary`, what the operators call."""
    global NATIVE
    NATIVE = _rust.EagerHits(
        (Node, array_type, memory.Storage, DeviceValue, EagerOp), node_mod._ids,
        vars(backends), settings.CHANGES, memory.RELEASES, runtime.stats, errors._LAST_RUN,
        LIBRARY_FILES, user_frame, errors.CUDAError,
    )  # fmt: skip
    runtime.EAGER_CACHE.linked = (*runtime.EAGER_CACHE.linked, NATIVE)
    return NATIVE.binary


NATIVE: Any = None  # start_native's
