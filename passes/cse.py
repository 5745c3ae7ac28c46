"""Common subexpression elimination: one node per (op, attrs, inputs)."""

from __future__ import annotations

from typing import Any

from pygpukit.ir import Graph, Node

from .rewrite import canonical_attrs, rewrite

COMMUTATIVE = {"add", "mul", "maximum", "minimum", "eq", "ne", "logical_and", "logical_or"}


def common_subexpression_elimination(graph: Graph) -> Graph:
    """Merge nodes computing the same thing; inputs (placeholders) are never merged.

    Two graph outputs are kept apart: each must come back as its own buffer.
    """
    seen: dict[Any, Node] = {}
    outputs = {o.id for o in graph.outputs}

    def rule(n: Node) -> Node | None:
        if n.op == "input":
            return None
        ids = [i.id for i in n.inputs]
        if n.op in COMMUTATIVE:
            ids.sort()
        key = (n.op, canonical_attrs(n), tuple(ids), n.shape, n.dtype.name)
        prev = seen.get(key)
        if prev is None or (n.id in outputs and prev.id in outputs):
            seen.setdefault(key, n)
            return None
        return prev

    return rewrite(graph, rule)
