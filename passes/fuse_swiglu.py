"""SwiGLU: silu(g) * u and g * sigmoid(g) * u become one `swiglu` node."""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, operands


def _gate(a: Node) -> Node | None:
    """g for silu(g) or g * sigmoid(g)."""
    if a.op == "silu":
        return a.inputs[0]
    for g, s in operands(a, "mul"):
        if s.op == "sigmoid" and s.inputs[0] is g:
            return g
    return None


def fuse_swiglu(graph: Graph) -> Graph:
    m = Matcher(graph, "swiglu", "fuse_swiglu")
    for n in graph.nodes:
        for a, u in operands(n, "mul"):
            g = _gate(a)
            if g is None:
                continue
            fused = Node.make("swiglu", (g, u), {}, n.loc)
            if (fused.shape, fused.dtype) != (n.shape, n.dtype):
                m.missed(n, f"swiglu would give {fused.dtype.short}{list(fused.shape)}, "
                            f"the program {n.dtype.short}{list(n.shape)}")  # fmt: skip
                break
            if not g.dtype.is_float:
                m.missed(n, f"gate is {g.dtype.name}, not floating point")
                break
            m.matched(n, fused, [g, u])
            break
    return m.finish()
