"""Graphs printed as a readable program: one line per node, dtype[shape], source line."""

from __future__ import annotations

from typing import Any

from .expr import to_source
from .graph import Graph
from .node import Node
from .quant import QuantSpec


def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) for x in v):
        return "[" + ", ".join(_fmt_attr(x) for x in v) + "]"
    return repr(v)


def _type(n: Node) -> str:
    return f"{n.dtype.short}[{','.join(str(d) for d in n.shape)}]"


def _fmt_index(spec: Any, dyn: list[str]) -> str:
    """An index spec as Python subscript text: x[:, 0:64, None, pos]."""
    parts = []
    for e in spec:
        if e[0] == "slice":
            start, stop, step = e[1], e[2], e[3]
            txt = f"{start}:{stop if stop >= 0 else ''}" + (f":{step}" if step != 1 else "")
            parts.append(txt)
        elif e[0] == "int":
            parts.append(str(e[1]))
        elif e[0] == "dyn":
            parts.append(dyn[e[1]])
        else:
            parts.append("None")
    return "[" + ", ".join(parts) + "]"


def format_node(n: Node, names: dict[int, str]) -> str:
    if n.op in ("index", "setitem"):
        ins = [names[i.id] for i in n.inputs]
        k = 1 if n.op == "index" else 2
        sub = _fmt_index(n.attrs["spec"], ins[k:])
        expr = f"{ins[0]}{sub}" if n.op == "index" else f"setitem({ins[0]}{sub}, {ins[1]})"
        return _with_notes(n, f"  {names[n.id]}: {_type(n)} = {expr}")
    if n.op in ("fused_elementwise", "fused_reduce"):
        body = to_source(n.attrs["expr"], [names[i.id] for i in n.inputs])
        if n.op == "fused_reduce":
            red = n.attrs["reduce"]
            body = f"{red}({body}, axes={n.attrs['axes']}, keepdims={n.attrs['keepdims']})"
        return _with_notes(n, f"  {names[n.id]}: {_type(n)} = {n.op}[{body}]")
    args = [names[i.id] for i in n.inputs]
    args += [f"{k}={_fmt_attr(v)}" for k, v in sorted(n.attrs.items())
             if k not in ("shape", "quant")]  # fmt: skip
    op = n.op
    if n.attrs.get("quant"):  # a quantized linear names its weight format: linear[int4 g128]
        op = f"{op}[{QuantSpec.of_attr(n.attrs['quant']).label}]"
    if n.op in ("full", "input", "arange") and "shape" in n.attrs:
        pass
    elif "shape" in n.attrs:
        args.append(f"shape={_fmt_attr(n.attrs['shape'])}")
    return _with_notes(n, f"  {names[n.id]}: {_type(n)} = {op}({', '.join(args)})")


def _with_notes(n: Node, line: str) -> str:
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
