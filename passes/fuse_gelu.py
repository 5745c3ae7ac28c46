"""GELU written out -> one `gelu` node, so fuse_linear can put it in a GEMM epilogue.

erf form:  0.5 * x * (1 + erf(x / sqrt(2)))     (or x * sqrt(0.5), any operand order)
tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))   (x**3 or x*x*x)
"""

from __future__ import annotations

import math

from pygpukit.ir import Graph, Node

from .patterns import Matcher, operands, scalar_const

_TOL = 1e-6


def _const(n: Node, want: float) -> bool:
    v = scalar_const(n)
    return v is not None and not isinstance(v, bool) and abs(float(v) - want) <= _TOL * abs(want)


def _scaled(n: Node, x: Node, c: float) -> bool:
    """n is x * c (or x / (1/c))."""
    if any(a is x and _const(k, c) for a, k in operands(n, "mul")):
        return True
    return n.op == "div" and n.inputs[0] is x and _const(n.inputs[1], 1 / c)


def _cube(n: Node, x: Node) -> bool:
    if n.op == "pow" and n.inputs[0] is x and _const(n.inputs[1], 3.0):
        return True
    for a, b in operands(n, "mul"):
        if a is x and b.op == "mul" and b.inputs[0] is x and b.inputs[1] is x:
            return True
    return False


def _inner(t: Node, x: Node) -> str | None:
    """'none' for erf(x/sqrt2), 'tanh' for tanh(c*(x + 0.044715*x^3)); else None."""
    if t.op == "erf" and _scaled(t.inputs[0], x, math.sqrt(0.5)):
        return "none"
    if t.op == "tanh":
        for p, c in operands(t.inputs[0], "mul"):
            if not _const(c, math.sqrt(2 / math.pi)):
                continue
            for xx, cub in operands(p, "add"):
                if xx is x and any(_const(k, 0.044715) and _cube(q, x)
                                   for q, k in operands(cub, "mul")):  # fmt: skip
                    return "tanh"
    return None


def _half_x(n: Node) -> Node | None:
    """x for 0.5 * x."""
    for x, c in operands(n, "mul"):
        if _const(c, 0.5):
            return x
    return None


def fuse_gelu(graph: Graph) -> Graph:
    m = Matcher(graph, "gelu", "fuse_gelu")
    for n in graph.nodes:
        for a, b in operands(n, "mul"):
            # 0.5 * x * (1 + t)  or  (0.5 * x) * (1 + t)  or  x * (0.5 * (1 + t))
            cands = []
            hx = _half_x(a)
            if hx is not None:
                cands.append((hx, b))
            hb = _half_x(b)
            if hb is not None:
                cands.append((a, hb))
            for x, onept in cands:
                for one, t in operands(onept, "add"):
                    if not _const(one, 1.0):
                        continue
                    approx = _inner(t, x)
                    if approx is None or not x.dtype.is_float:
                        continue
                    fused = Node.make("gelu", (x,), {"approximate": approx}, n.loc)
                    if (fused.shape, fused.dtype) == (n.shape, n.dtype):
                        m.matched(n, fused, [x])
                        break
                else:
                    continue
                break
            if n.id in m.replace:
                break
    return m.finish()
