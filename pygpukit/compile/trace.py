"""Tracing: run the function once on placeholder arrays, recording one IR graph."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from threading import get_ident
from typing import Any

from pygpukit import errors
from pygpukit.backends import devices
from pygpukit.ir import Graph, Node, toposort

from .pytree import TreeDef, flatten, flatten_call

# The threads tracing now (one entry per trace in progress): a compiled function called
# from one of them is traced into the caller's graph rather than run (function._call).
TRACING: list[int] = []


@dataclass
class Traced:
    graph: Graph
    out_tree: TreeDef
    n_outputs: int  # user outputs; then one graph output per writeback
    persistent: list[Any]  # GPUArrays bound by reference, in graph-input order after args
    constants: list[Any]  # values created while tracing (held by the compiled entry)
    writeback_persistent: list[int] = field(default_factory=list)  # index into persistent
    writeback_args: list[int] = field(default_factory=list)  # index into array arguments
    # Each persistent array's index in the captured arrays (their view bases appended):
    # another instance's captures of the same structure bind in the same order.
    persistent_index: list[int] = field(default_factory=list)


def _placeholder(shape: tuple[int, ...], dtype: Any, k: int) -> Node:
    attrs = {"shape": shape, "dtype": dtype.name, "idx": k}
    node = Node("input", (), attrs, shape, dtype, None)
    if devices.ACTIVE[0]:
        devices.tag(node, devices.current_ordinal())  # the device the call runs on
    return node


def trace(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], arrays: list[Any],
          tree: TreeDef, captured: list[tuple[str, Any]], name: str) -> Traced:  # fmt: skip
    """`arrays` are the argument arrays (GPUArrays, realised), in flatten order."""
    from pygpukit.array import GPUArray
    from pygpukit.mode import eager

    from .pytree import unflatten

    captured = _with_view_bases(captured)
    tracers = [GPUArray(_placeholder(a.shape, a.dtype, k)) for k, a in enumerate(arrays)]
    start = [t._node for t in tracers]
    objects = [o for _, o in _objects_of(args, kwargs)]
    new_args, new_kwargs = unflatten(tree, iter(tracers), iter(objects))
    before = {id(a): a._node for _, a in captured}
    TRACING.append(get_ident())
    try:
        with eager(False):
            out = fn(*new_args, **new_kwargs)
    finally:
        TRACING.remove(get_ident())
        after = {id(a): a._node for _, a in captured}
        # Captured arrays must not keep pointing at symbolic nodes; bases (listed after
        # their views) first, so a restored view is in step with its base.
        for _, a in reversed(captured):
            a._node = before[id(a)]
    out_arrays: list[tuple[str, Any]] = []
    out_objects: list[tuple[str, Any]] = []
    out_tree = flatten(out, "result", out_arrays, out_objects)
    if out_objects:
        path, obj = out_objects[0]
        raise errors.TraceError(
            f"{name}: {path} is a {type(obj).__name__}; compiled functions return arrays, "
            "tuples, lists, dicts and Python scalars"
        )
    roots = [a if isinstance(a, GPUArray) else GPUArray(_const_node(a)) for _, a in out_arrays]
    out_nodes = [r._node for r in roots]
    # A written view's base is written (and captured): the view itself needs no writeback.
    wb_p = [i for i, (_, a) in enumerate(captured)
            if a.base is None and after[id(a)] is not before[id(a)]]  # fmt: skip
    wb_a = [k for k, t in enumerate(tracers) if t._node is not start[k]]
    wb_nodes = [after[id(captured[i][1])] for i in wb_p] + [tracers[k]._node for k in wb_a]

    # Copy the recorded nodes into a graph of their own: realised leaves become inputs.
    placeholder_ids = {n.id for n in start}
    copies: dict[int, Node] = {}
    inputs = [_placeholder(n.shape, n.dtype, k) for k, n in enumerate(start)]
    for n, c in zip(start, inputs, strict=True):
        copies[n.id] = c
    by_node = {id(before[id(a)]): i for i, (_, a) in enumerate(captured)}
    persistent_idx: dict[int, int] = {}
    constants: list[Any] = []
    const_nodes: list[Node] = []
    order = toposort(out_nodes + wb_nodes, is_leaf=lambda n: n.realized is not None)
    for n in order:
        if n.id in copies:
            continue
        if n.op == "input" and n.realized is None and n.id not in placeholder_ids:
            raise errors.TraceError(f"{name}: an array from another trace leaked into this one")
        if n.realized is not None and id(n) not in by_node and math.prod(n.shape) == 1:
            # A scalar made while tracing (gpk.where(m, -inf, 0.0)): a constant the passes see.
            value = _scalar_value(n.realized)
            attrs = {"shape": n.shape, "dtype": n.dtype.name, "value": value}
            copies[n.id] = Node("full", (), attrs, n.shape, n.dtype, n.loc)
            continue
        if n.realized is not None:
            c = _placeholder(n.shape, n.dtype, -1)
            if id(n) in by_node:
                persistent_idx[by_node[id(n)]] = len(inputs)
            else:
                constants.append(n.realized)
                const_nodes.append(c)
            copies[n.id] = c
            if id(n) in by_node:
                inputs.append(c)
            continue
        copies[n.id] = Node(n.op, tuple(copies[i.id] for i in n.inputs), n.attrs, n.shape,
                            n.dtype, n.loc, n.origin)  # fmt: skip
    # Mutated persistent arrays are inputs even if nothing else reads their old value.
    for i in wb_p:
        if i not in persistent_idx:
            a = captured[i][1]
            persistent_idx[i] = len(inputs)
            inputs.append(_placeholder(a.shape, a.dtype, -1))
    order_p = sorted(persistent_idx, key=lambda i: persistent_idx[i])
    persistent = [captured[i][1] for i in order_p]
    inputs.extend(const_nodes)
    outputs = [copies[n.id] for n in out_nodes + wb_nodes]
    graph = Graph(inputs, outputs, name=name)
    graph.writeback = {len(out_nodes) + j: persistent_idx[i] for j, i in enumerate(wb_p)}
    graph.validate()
    return Traced(graph, out_tree, len(out_nodes), persistent, constants,
                  [order_p.index(i) for i in wb_p], wb_a, order_p)  # fmt: skip


def _with_view_bases(captured: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Captured arrays plus the bases of captured views: a write through a view is a write
    of its base, which the graph must then reference and write back."""
    out = list(captured)
    seen = {id(a) for _, a in out}
    for path, a in captured:
        while a.base is not None:
            a, path = a.base, f"{path}.base"
            if id(a) not in seen:
                seen.add(id(a))
                out.append((path, a))
    return out


def _scalar_value(value: Any) -> Any:
    from pygpukit.backends import get_backend

    return get_backend().to_numpy(value).reshape(()).item()


def _const_node(value: Any) -> Node:
    from pygpukit.creation import asarray

    return asarray(value)._node


def _objects_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    arrays: list[tuple[str, Any]] = []
    objects: list[tuple[str, Any]] = []
    flatten_call(args, kwargs, arrays, objects)
    return objects
