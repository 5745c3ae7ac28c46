"""A graph: input placeholders, nodes in topological order, outputs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import ops
from .node import Node


def toposort(outputs: Iterable[Node], is_leaf: Any = None) -> list[Node]:
    """Nodes reachable from outputs, inputs first. `is_leaf(n)` stops the walk at n."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in outputs:
        if root.id in seen:
            continue
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node.id in seen:
                continue
            seen.add(node.id)
            stack.append((node, True))
            if is_leaf is None or not is_leaf(node):
                for i in reversed(node.inputs):
                    if i.id not in seen:
                        stack.append((i, False))
    return order


class GraphError(ValueError):
    pass


class Graph:
    """`inputs` are the op='input' placeholders (in argument order), `outputs` the results."""

    def __init__(self, inputs: list[Node], outputs: list[Node], name: str = "graph") -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.name = name
        self.nodes = toposort(outputs)
        self.provenance: list[dict[str, Any]] = []
        # Pattern-fusion matches and near-misses, one dict per event (see passes/patterns.py).
        self.report: list[dict[str, Any]] = []
        # Output position -> input position: the caller stores that output into that input's
        # memory after the run (a compiled function's mutated persistent array), so a node
        # may write the new value into the input's memory directly (passes/fuse_kv_append.py).
        self.writeback: dict[int, int] = {}

    def rebuild(self, outputs: list[Node]) -> Graph:
        g = Graph(self.inputs, outputs, self.name)
        g.provenance = list(self.provenance)
        g.report = list(self.report)
        g.writeback = dict(self.writeback)
        return g

    def users(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i.id, []).append(n)
        return out

    def key(self) -> tuple[Any, ...]:
        """Structure of the graph: equal keys run the same schedule on different data."""
        index = {n.id: k for k, n in enumerate(self.nodes)}
        input_pos = {n.id: k for k, n in enumerate(self.inputs)}
        rows = []
        for n in self.nodes:
            rows.append(
                (
                    n.op,
                    n.shape,
                    n.dtype.name,
                    n.attr_key(),
                    tuple(index[i.id] for i in n.inputs),
                    input_pos.get(n.id, -1),
                )
            )
        return (tuple(rows), tuple(index[o.id] for o in self.outputs))

    def validate(self) -> None:
        """Every node's shape and dtype agree with its op's rule; inputs come first."""
        seen: set[int] = set()
        placeholders = {n.id for n in self.inputs}
        for n in self.nodes:
            for i in n.inputs:
                if i.id not in seen:
                    raise GraphError(f"{n!r} uses {i!r} before it is defined")
            if n.op == "input" and n.id not in placeholders:
                raise GraphError(f"{n!r} is an input placeholder not listed in graph.inputs")
            shape, dtype = ops.infer(n.op, [(i.shape, i.dtype) for i in n.inputs], n.attrs)
            if tuple(shape) != n.shape or dtype != n.dtype:
                raise GraphError(
                    f"{n!r}: op rule gives {dtype.short}{list(shape)}, "
                    f"node says {n.dtype.short}{list(n.shape)}"
                )
            seen.add(n.id)

    def count_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def to_networkx(self) -> Any:
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for n in self.nodes:
            g.add_node(
                n.id,
                op=n.op,
                shape=list(n.shape),
                dtype=n.dtype.name,
                attrs={k: repr(v) for k, v in n.attrs.items()},
                loc=str(n.loc) if n.loc else "",
                origin=n.origin,
            )
            for k, i in enumerate(n.inputs):
                g.add_edge(i.id, n.id, arg=k)
        g.graph["inputs"] = [n.id for n in self.inputs]
        g.graph["outputs"] = [n.id for n in self.outputs]
        return g

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)
