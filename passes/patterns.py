"""Shared pieces of the pattern-fusion passes: operand matching and the fusion report.

A pattern pass walks the graph, tries to match at each candidate root, and either builds
the fused node or records a near-miss with the reason and the user's line. The report
lives on graph.report, one dict per event:
  {"pattern": "rms_norm", "status": "matched" | "missed", "loc": "model.py:40",
   "reason": "...", "ops": n}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pygpukit.ir import Graph, Node

from .rewrite import const_value, substitute


class Miss(Exception):
    """A near-miss: the shape of a pattern is there, but a condition fails."""


def loc_of(n: Node) -> str:
    return str(n.loc) if n.loc is not None else "?"


def event(pattern: str, status: str, node: Node, reason: str = "", ops: int = 0) -> dict[str, Any]:
    return {"pattern": pattern, "status": status, "loc": loc_of(node), "reason": reason,
            "ops": ops, "node": node.id}  # fmt: skip


def format_report(report: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in report:
        if r["status"] == "matched":
            lines.append(f"{r['pattern']}: matched at {r['loc']} ({r['ops']} ops -> 1)")
        else:
            lines.append(f"{r['pattern']}: missed at {r['loc']}, {r['reason']}")
    return lines


def operands(n: Node, op: str) -> Iterator[tuple[Node, Node]]:
    """(a, b) and, for a commutative op, (b, a)."""
    if n.op != op or len(n.inputs) != 2:
        return
    a, b = n.inputs
    yield a, b
    if op in ("add", "mul") and a is not b:
        yield b, a


def scalar_const(n: Node) -> Any:
    """The value of a constant that broadcasts as a scalar (a `full`), else None."""
    return const_value(n)


def origin(pass_name: str, nodes: list[Node]) -> str:
    ops = ", ".join(n.op for n in sorted(nodes, key=lambda m: m.id))
    return f"{pass_name} from {ops}"


def collect(root: Node, stop: set[int]) -> list[Node]:
    """Nodes between root and the fused node's operands (for origin and op counts)."""
    out: dict[int, Node] = {}
    stack = [root]
    while stack:
        n = stack.pop()
        if n.id in stop or n.id in out or n.op in ("input", "full"):
            continue
        out[n.id] = n
        stack.extend(n.inputs)
    return list(out.values())


class Matcher:
    """Holds the graph being matched and the replacements found so far."""

    def __init__(self, graph: Graph, pattern: str, pass_name: str) -> None:
        self.graph = graph
        self.pattern = pattern
        self.pass_name = pass_name
        self.replace: dict[int, Node] = {}
        self.events: list[dict[str, Any]] = []

    def matched(self, root: Node, fused: Node, operands_: list[Node]) -> None:
        body = collect(root, {o.id for o in operands_})
        fused.origin = origin(self.pass_name, body)
        fused_loc = root.loc
        if fused.loc is None:
            fused.loc = fused_loc
        self.replace[root.id] = fused
        self.events.append(event(self.pattern, "matched", root, ops=len(body)))

    def missed(self, root: Node, reason: str) -> None:
        self.events.append(event(self.pattern, "missed", root, reason))

    def finish(self) -> Graph:
        """The rewritten graph, with this pass's events added to its report."""
        g = substitute(self.graph, self.replace)
        if g is self.graph:
            g = self.graph.rebuild(self.graph.outputs)
        g.report = list(self.graph.report) + self.events
        return g


def own_memory(graph: Graph, buf: Node, store: Node, use: dict[int, list[Node]],
               what: str) -> None:  # fmt: skip
    """Miss unless `buf` is a graph input that only `store` reads and whose new value (the
    store's) the caller takes back into buf's memory (graph.writeback): the rule for a
    fused node that writes into its input in place."""
    if buf.op != "input" or buf not in graph.inputs:
        raise Miss(f"the {what} is not a graph input")
    if [u.id for u in use[buf.id]] != [store.id]:
        raise Miss(f"something else reads the {what}'s old value")
    outs = [k for k, o in enumerate(graph.outputs) if o is store]
    if not outs or graph.writeback.get(outs[0]) != graph.inputs.index(buf):
        raise Miss(f"the {what} is not written back to its own memory (not a compiled "
                   "function's captured array)")  # fmt: skip
