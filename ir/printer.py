"""Graphs printed as a readable program: one line per node, dtype[shape], source line."""

from __future__ import annotations

from typing import Any

from .graph import Graph
from .node import Node


def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) for x in v):
        return "[" + ", ".join(_fmt_attr(x) for x in v) + "]"
    return repr(v)


def _type(n: Node) -> str:
    return f"{n.dtype.short}[{','.join(str(d) for d in n.shape)}]"


def format_node(n: Node, names: dict[int, str]) -> str:
    args = [names[i.id] for i in n.inputs]
    args += [f"{k}={_fmt_attr(v)}" for k, v in sorted(n.attrs.items()) if k not in ("shape",)]
    if n.op in ("full", "input", "arange") and "shape" in n.attrs:
        pass
    elif "shape" in n.attrs:
        args.append(f"shape={_fmt_attr(n.attrs['shape'])}")
    line = f"  {names[n.id]}: {_type(n)} = {n.op}({', '.join(args)})"
    notes = []
    if n.loc is not None:
        notes.append(str(n.loc))
    if n.origin:
        notes.append(n.origin)
    if notes:
        line = f"{line:<72} # " + "; ".join(notes)
    return line


def format_graph(g: Graph) -> str:
    names: dict[int, str] = {}
    for k, n in enumerate(g.inputs):
        names[n.id] = f"in{k}"
    t = 0
    for n in g.nodes:
        if n.id not in names:
            names[n.id] = f"t{t}"
            t += 1
    params = ", ".join(f"{names[n.id]}: {_type(n)}" for n in g.inputs)
    lines = [f"def {g.name}({params}):"]
    for n in g.nodes:
        if n.op == "input":
            continue
        lines.append(format_node(n, names))
    lines.append("  return " + ", ".join(names[o.id] for o in g.outputs))
    return "\n".join(lines)
