"""Helpers shared by the passes: rebuilding a graph around replaced nodes.

Passes never mutate a node in place: the runtime may still hold the originals (lazy
graphs are copies, but compiled graphs are kept for dumps). A pass maps old node ids to
replacement nodes; `substitute` re-creates every user of a replaced node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pygpukit.ir import Graph, Node


def clone(n: Node, inputs: tuple[Node, ...]) -> Node:
    return Node(n.op, inputs, n.attrs, n.shape, n.dtype, n.loc, n.origin)


def substitute(graph: Graph, replace: dict[int, Node]) -> Graph:
    """The graph with node id -> replacement; replacements may reference old nodes.

    A walk with an explicit stack: a 7B model's residual chain is thousands of nodes deep,
    past Python's recursion limit."""
    if not replace:
        return graph
    new: dict[int, Node] = {}
    visiting: set[int] = set()

    def remap(root: Node) -> Node:
        # Frames: [node, stage, mapped inputs]; stage 0 enter, 1 await the replacement's
        # remap, 2 await the inputs' remaps one by one.
        stack: list[list[Any]] = [[root, 0, []]]
        result = root
        while stack:
            frame = stack[-1]
            n, stage, ins = frame
            if stage == 0:
                if n.id in new or n.id in visiting:
                    # (a replacement that references its own root keeps the root there)
                    result = new.get(n.id, n)
                    stack.pop()
                    _deliver(stack, result)
                    continue
                visiting.add(n.id)
                r = replace.get(n.id, n)
                frame[1] = 1 if r is not n else 2
                if r is not n:
                    stack.append([r, 0, []])
                continue
            if stage == 2 and len(ins) < len(n.inputs):
                stack.append([n.inputs[len(ins)], 0, []])
                continue
            if stage == 1:
                result = ins[0]
            else:
                changed = any(a is not b for a, b in zip(ins, n.inputs, strict=True))
                result = clone(n, tuple(ins)) if changed else n
            visiting.discard(n.id)
            new[n.id] = result
            stack.pop()
            _deliver(stack, result)
        return result

    outputs = []
    for o in graph.outputs:
        r = remap(o)
        # An output must stay a value of its own: never hand back a caller's input buffer.
        outputs.append(o if r.op == "input" and o.op != "input" else r)
    return graph.rebuild(outputs)


def _deliver(stack: list[list[Any]], value: Node) -> None:
    """Hand a finished remap to the frame waiting for it."""
    if stack:
        stack[-1][2].append(value)


def rewrite(graph: Graph, rule: Callable[[Node], Node | None]) -> Graph:
    """Apply `rule` to every node, inputs first; a rule sees already-rewritten inputs."""
    new: dict[int, Node] = {}
    for n in graph.nodes:
        ins = tuple(new.get(i.id, i) for i in n.inputs)
        m = n if all(a is b for a, b in zip(ins, n.inputs, strict=True)) else clone(n, ins)
        r = rule(m)
        if r is not None:
            m = r
        if m is not n:
            new[n.id] = m
    if not new:
        return graph
    outputs = []
    for o in graph.outputs:
        r = new.get(o.id, o)
        outputs.append(o if r.op == "input" and o.op != "input" else r)
    return graph.rebuild(outputs)


def users(graph: Graph) -> dict[int, list[Node]]:
    """Distinct users of each node (an op reading a value twice counts once)."""
    out: dict[int, list[Node]] = {n.id: [] for n in graph.nodes}
    for n in graph.nodes:
        for i in {i.id: i for i in n.inputs}.values():
            out[i.id].append(n)
    return out


def const_value(n: Node) -> Any:
    """The value of a `full` node (a uniform constant), else None."""
    return n.attrs["value"] if n.op == "full" else None


def is_const(n: Node, value: float) -> bool:
    v = const_value(n)
    return v is not None and not isinstance(v, bool) and v == value


def numel(n: Node) -> int:
    return math.prod(n.shape)


def canonical_attrs(n: Node) -> tuple[Any, ...]:
    """attr_key with floats by repr, so 0.0 and -0.0 (and NaNs) are told apart."""
    return n.canonical_attrs()
