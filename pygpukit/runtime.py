"""Recording ops into the IR and realising pending subgraphs.

record(): one user call -> one Node, shape/dtype checked at once, with the user's line.
realize(): the pending subgraph under some nodes -> passes -> Schedule -> backend.
Schedules are cached by graph structure, so a Python loop does not re-run the passes; a
realize of one node whose recorded summary (pending.py) was seen before finds its schedule
without walking the graph.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from pygpukit import errors, memory, passes
from pygpukit.ir import Graph, Node, toposort, user_location
from pygpukit.ir.dtypes import DTypeRuleError, UnsupportedDType
from pygpukit.ir.indexing import IndexRuleError
from pygpukit.ir.shapes import ShapeRuleError
from pygpukit.ir.source import register_library, resolve, user_frame
from pygpukit.passes import Schedule, lower, run_pipeline
from pygpukit.pending import EPOCH, Trail, drop, summarise, tree_nodes

from . import settings
from .backends import devices, get_backend
from .mode import is_eager

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# The user's line is the first frame outside these: the passes, the backends, compiled
# functions and the package's own modules. demo.py is a user-level program written with
# the API (as llm/, cli/ and bench/ are), so lines point into it.
register_library(
    trees=[os.path.dirname(os.path.abspath(getattr(passes, "__file__", None) or "")),
           os.path.join(_PKG_DIR, "backends"), os.path.join(_PKG_DIR, "compile")],
    flat=[_PKG_DIR], user_level=["demo.py"],
)  # fmt: skip


class ScheduleCache(OrderedDict[Any, Any]):
    """An LRU of schedules; clearing one clears the caches registered with it (schedules
    found by other keys: a test that clears the structure cache after changing the pipeline
    must not be served an old schedule by another route)."""

    def __init__(self, *linked: ScheduleCache) -> None:
        super().__init__()
        self.linked = linked

    def clear(self) -> None:
        super().clear()
        for cache in self.linked:
            cache.clear()


_CACHE_LIMIT = 2048
# Summary key (kid, backend, passes skipped, leaf layouts) -> (schedule, which leaf each
# schedule input is, build-time locations in trail order).
_KNOWN = ScheduleCache()
# Eager ops by their operands' layouts (eager.py); cleared with the others.
EAGER_CACHE = ScheduleCache()
_SCHEDULE_CACHE = ScheduleCache(_KNOWN, EAGER_CACHE)
stats = {"realize_calls": 0, "schedule_hits": 0, "schedule_misses": 0}
# While a list: each realize appends (schedule, order, leaves, pending) (eager.py learns
# what today's path ran from it).
CAPTURE: list[list[tuple[Any, ...]] | None] = [None]


def record(op: str, inputs: tuple[Node, ...], attrs: dict[str, Any] | None = None,
           name: str | None = None) -> Node:  # fmt: skip
    """One node of op, checked now; an error names `name` (the user's function, where it
    differs from the IR op: broadcast_to records expand), the inputs and the user's line."""
    where = user_frame()  # made a SourceLoc only when something prints it
    try:
        node = Node.make(op, inputs, attrs, where)
    except (ShapeRuleError, DTypeRuleError, UnsupportedDType, IndexRuleError) as e:
        raise errors.op_error(
            name or op, e, [(i.shape, i.dtype) for i in inputs], resolve(where)
        ) from None
    if devices.ACTIVE[0]:
        _place(node, name or op, where)
    if is_eager():
        realize([node])
    else:
        summarise(node)
    return node


def _place(node: Node, op: str, where: Any) -> None:
    """Put a new node on its inputs' device (a node without inputs: the current one);
    inputs on two devices raise DeviceMismatchError naming them and the user's line. A
    pending 0-d constant (a Python scalar operand) goes with any device, as it is folded
    into the graph of whatever reads it."""
    ins = node.inputs
    if not ins:
        devices.tag(node, devices.current_ordinal())
        return
    placed = [(k, devices.ordinal_of(i)) for k, i in enumerate(ins)
              if i.shape or i.op != "full" or i.realized is not None]  # fmt: skip
    if not placed:
        devices.tag(node, devices.ordinal_of(ins[0]))
        return
    first_k, first = placed[0]
    for k, o in placed[1:]:
        if o != first:
            from .device import device_of

            raise errors.DeviceMismatchError(
                f"{op}: input {first_k} is on {device_of(first)} but input {k} is on "
                f"{device_of(o)}; copy one with x.to(device) first "
                f"{errors.describe_inputs([(i.shape, i.dtype) for i in ins], resolve(where))}"
            )
    devices.tag(node, first)


def leaf(value: Any, shape: tuple[int, ...], dtype: Any) -> Node:
    """A node for data that already exists on the backend."""
    node = Node("input", (), {"shape": shape, "dtype": dtype.name}, shape, dtype, user_frame())
    node.realized = value
    if devices.ACTIVE[0]:
        devices.tag(node, devices.current_ordinal())
    return node


def _is_leaf(n: Node) -> bool:
    return n.realized is not None


def _check_not_freed(order: list[Node], backend: Any) -> None:
    for n in order:
        for k, i in enumerate(n.inputs):
            if i.realized is not None and backend.storage(i.realized).freed:
                made = f" (made at {i.loc.full})" if i.loc else ""
                raise errors.FreedArrayError(
                    f"{n.op}: input {k}, the array {i.dtype.short}{list(i.shape)}{made}, was "
                    f"freed {errors.describe_inputs([(x.shape, x.dtype) for x in n.inputs], n.loc)}"
                )


def _graph_of(order: list[Node], pending: list[Node]) -> tuple[Graph, list[Node]]:
    """A fresh Graph over copies of the pending nodes; realised leaves become inputs."""
    copies: dict[int, Node] = {}
    inputs: list[Node] = []
    leaves: list[Node] = []
    for n in order:
        if n.realized is not None:
            c = Node("input", (), {"shape": n.shape, "dtype": n.dtype.name, "idx": len(inputs)},
                     n.shape, n.dtype, n.loc)  # fmt: skip
            inputs.append(c)
            leaves.append(n)
        else:
            c = Node(n.op, tuple(copies[i.id] for i in n.inputs), n.attrs, n.shape, n.dtype,
                     n.loc, n.origin, frozen=True)  # fmt: skip
        copies[n.id] = c
    return Graph(inputs, [copies[p.id] for p in pending], name="realize"), leaves


def pending_graph(nodes: list[Node], name: str = "graph") -> Graph:
    """The recorded, not yet run, graph under these nodes (a copy: nothing is executed)."""
    pending = [n for n in nodes if n.realized is None]
    graph, _ = _graph_of(toposort(pending, is_leaf=_is_leaf), pending)
    graph.name = name
    return graph


def _check_traced(order: list[Node]) -> None:
    """A placeholder of @gpk.compile's tracing has no value: Python asked for one."""
    for n in order:
        if n.op == "input" and n.realized is None:
            loc = user_location()
            where = f"\n  at {loc.full}" if loc else ""
            raise errors.TraceError(
                "a traced array's value was needed in Python (bool(), float(), int(), .item(), "
                "to_numpy() or print) while tracing a compiled function; tracing records ops "
                "without running them, so branch with gpk.where or pass the value as a static "
                f"Python argument{where}"
            )


def structure_key(order: list[Node], pending: list[Node], backend: Any) -> Any:
    """What a cached schedule depends on: the graph's structure and the passes it went
    through (a pass skipped since must not be served from the cache)."""
    index = {n.id: k for k, n in enumerate(order)}
    layout_key = backend.layout_key
    rows: list[tuple[Any, ...]] = []
    add = rows.append
    for n in order:
        if n.realized is not None:
            add(("input", n.shape, n.dtype.name, layout_key(n.realized)))
        else:
            ins = tuple([index[i.id] for i in n.inputs])
            add((n.op, n.shape, n.dtype.name, n.canonical_attrs(), ins))
    pending_idx = tuple([index[p.id] for p in pending])
    # The ordinal too: a schedule carries launch plans made for one device's kernels.
    return (backend.name, backend.ordinal, settings.skip_passes(), tuple(rows), pending_idx)


def realize(nodes: list[Node]) -> None:
    pending = list({id(n): n for n in nodes if n.realized is None}.values())
    if not pending:
        return
    if devices.ACTIVE[0]:
        _realize_by_device(pending)
        return
    _realize(pending)


def _realize_by_device(pending: list[Node]) -> None:
    """Each device's pending nodes run on that device's backend (record keeps a graph on
    one device, so a node's whole pending graph goes with it)."""
    by_device: dict[int, list[Node]] = {}
    for n in pending:
        by_device.setdefault(devices.ordinal_of(n), []).append(n)
    for ordinal, nodes in by_device.items():
        with devices.using(ordinal):
            _realize(nodes)


def _realize(pending: list[Node]) -> None:
    backend = get_backend()
    stats["realize_calls"] += 1
    known = None
    if len(pending) == 1:
        root = pending[0]
        sub = root.sub
        if sub is not None and sub[1] == EPOCH[0]:
            layout_key = backend.layout_key
            leaves = root.leaves
            known = (sub[0], backend.name, backend.ordinal, settings.skip_passes(),
                     tuple([layout_key(n.realized) for n in leaves]))  # fmt: skip
            hit = _KNOWN.get(known)
            if hit is not None and _run_known(root, leaves, sub, hit, backend):
                try:
                    _KNOWN.move_to_end(known)
                except KeyError:  # another thread evicted it meanwhile
                    pass
                return
    order = toposort(pending, is_leaf=_is_leaf)
    _check_traced(order)
    if memory.RELEASES[0]:  # no array was ever freed explicitly: nothing to find
        _check_not_freed(order, backend)
    key = structure_key(order, pending, backend)
    schedule = _SCHEDULE_CACHE.get(key)
    leaves = [n for n in order if n.realized is not None]
    if schedule is None:
        stats["schedule_misses"] += 1
        graph, leaves = _graph_of(order, pending)
        schedule = lower(run_pipeline(graph))
        schedule.info["locs"] = locs = [n.loc for n in order]
        _SCHEDULE_CACHE[key] = schedule
        if len(_SCHEDULE_CACHE) > _CACHE_LIMIT:
            _SCHEDULE_CACHE.popitem(last=False)
        errors.note_run(locs, locs)
    else:
        stats["schedule_hits"] += 1
        _SCHEDULE_CACHE.move_to_end(key)
        # The nodes' captured locations, resolved only if an error describes this run.
        errors.note_run(schedule.info["locs"], [n.where for n in order])
    if known is not None:
        _remember(known, pending[0], schedule, order, leaves)
    capture = CAPTURE[0]
    if capture is not None:
        capture.append((schedule, order, leaves, pending))
    values = backend.run(schedule, [n.realized for n in leaves])
    if settings.debug():
        from .profiling import debug_realize

        debug_realize(schedule, [n.realized for n in leaves])
    for n, v in zip(pending, values, strict=True):
        n.realized = v
        n.inputs = ()
        drop(n)


def _remember(key: Any, root: Node, schedule: Schedule, order: list[Node],
              leaves: list[Node]) -> None:  # fmt: skip
    """File the schedule under root's summary key: which of the summary's leaves each
    schedule input is, and the schedule's build-time locations in trail order."""
    mine = {id(n): k for k, n in enumerate(root.leaves)}
    which = [mine.get(id(n), -1) for n in leaves]
    if -1 in which or len(which) != len(mine):
        return  # the summary disagrees with the walk: leave this graph to the walk
    at = {n.id: k for k, n in enumerate(order)}
    built = schedule.info["locs"]
    _KNOWN[key] = (schedule, which, [built[at[n.id]] for n in tree_nodes(root)])
    if len(_KNOWN) > _CACHE_LIMIT:
        _KNOWN.popitem(last=False)


def _run_known(root: Node, leaves: tuple[Node, ...], trail: Any, hit: Any, backend: Any) -> bool:
    """Run a summary-key hit (no graph walk): False leaves it to the walk (a freed leaf,
    which the walk reports)."""
    schedule, which, built = hit
    if memory.RELEASES[0] and any(backend.storage(n.realized).freed for n in leaves):
        return False
    stats["schedule_hits"] += 1
    errors.note_run(built, Trail(trail))
    values = [leaves[k].realized for k in which]
    (root.realized,) = backend.run(schedule, values)
    if settings.debug():
        from .profiling import debug_realize

        debug_realize(schedule, values)
    root.inputs = ()
    drop(root)
    return True
