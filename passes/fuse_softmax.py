"""Softmax written out: exp(x - max(x)) / sum(exp(x - max(x))) becomes one `softmax` node."""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher


def _single_axis_keep(r: Node, op: str) -> int | None:
    if r.op != op or not r.attrs["keepdims"] or len(r.attrs["axes"]) != 1:
        return None
    return int(r.attrs["axes"][0])


def fuse_softmax(graph: Graph) -> Graph:
    m = Matcher(graph, "softmax", "fuse_softmax")
    for n in graph.nodes:
        if n.op != "div":
            continue
        e, s = n.inputs
        if e.op != "exp" or s.op != "sum" or s.inputs[0] is not e:
            continue
        axis = _single_axis_keep(s, "sum")
        if axis is None:
            m.missed(n, "the sum is not over one axis with keepdims=True")
            continue
        z = e.inputs[0]
        if z.op != "sub" or _single_axis_keep(z.inputs[1], "max") != axis:
            m.missed(n, "no max subtraction: write exp(x - x.max(axis, keepdims=True))")
            continue
        x = z.inputs[0]
        if z.inputs[1].inputs[0] is not x:
            m.missed(n, "the max is taken over a different array than the one exponentiated")
            continue
        if not x.dtype.is_float or x.shape != n.shape or x.dtype != n.dtype:
            m.missed(n, f"input {x.dtype.short}{list(x.shape)} and result "
                        f"{n.dtype.short}{list(n.shape)} differ")  # fmt: skip
            continue
        m.matched(n, Node.make("softmax", (x,), {"axis": axis}, n.loc), [x])
    return m.finish()
