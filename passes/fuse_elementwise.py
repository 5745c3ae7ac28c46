"""Generic fusion: chains of elementwise ops (and broadcasts), with an optional trailing
reduction, become one fused_elementwise / fused_reduce node over ir.expr expressions.

A value read by more than one op is materialised (it becomes an input of the fused
kernels reading it) unless it is cheap to recompute: a cast, negation, abs or broadcast
of a materialised value.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node
from pygpukit.ir.expr import Expr, count_ops, node_expr

from .rewrite import substitute, users

_ELEMENTWISE = ("unary", "binary", "ternary", "cast")
_CHEAP = ("cast", "neg", "abs", "expand")
_REDUCE = ("sum", "mean", "max", "min")


def _fusible(n: Node) -> bool:
    if n.op == "expand":
        return True
    if n.kind not in _ELEMENTWISE:
        return False
    if n.op == "cast":
        src = n.inputs[0].dtype
        return bool(n.dtype.is_float and (src.is_float or src.kind == "b"))
    ok = all(i.dtype.is_float or i.dtype.kind == "b" for i in n.inputs)
    return bool(ok and (n.dtype.is_float or n.dtype.kind == "b"))


def fuse_elementwise(graph: Graph) -> Graph:
    use = users(graph)
    outs = {o.id for o in graph.outputs}
    fus = {n.id for n in graph.nodes if _fusible(n)}

    # Values that must exist in memory: outputs, and fusible nodes read by a non-fusible op
    # or by several ops (unless cheap to recompute).
    # Reads count with multiplicity: x*x over a fused x would evaluate x twice per element.
    reads: dict[int, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            reads[i.id] = reads.get(i.id, 0) + 1
    material: set[int] = set()
    for n in graph.nodes:
        if n.id not in fus:
            continue
        us = use.get(n.id, [])
        if n.id in outs or any(u.id not in fus for u in us) or not us:
            material.add(n.id)
        elif reads.get(n.id, 0) > 1 and n.op not in _CHEAP:
            material.add(n.id)
    for n in graph.nodes:  # a recomputed cheap node reads its input from memory
        if n.id in fus and n.id not in material and reads.get(n.id, 0) > 1:
            for i in n.inputs:
                if i.id in fus:
                    material.add(i.id)

    replace: dict[int, Node] = {}

    def build(root: Node) -> tuple[Expr, list[Node], list[Node]]:
        ins: list[Node] = []
        body: list[Node] = []
        index: dict[int, int] = {}

        def leaf(n: Node) -> Expr:
            if n.op == "full" and len(n.shape) <= len(root.shape):
                return ("const", n.attrs["value"], n.dtype.name)
            if n.id not in index:
                index[n.id] = len(ins)
                ins.append(n)
            return ("in", index[n.id])

        def walk(n: Node, top: bool) -> Expr:
            if not top and (n.id not in fus or n.id in material):
                return leaf(n)
            body.append(n)
            if n.op == "expand":
                return walk(n.inputs[0], False)
            return node_expr(n.op, n.attrs, [walk(i, False) for i in n.inputs])

        return walk(root, True), ins, body

    def origin(body: list[Node]) -> str:
        return "fuse_elementwise from " + ", ".join(b.op for b in sorted(body, key=lambda x: x.id))

    for n in graph.nodes:
        if n.op in _REDUCE and n.inputs[0].id in fus and n.inputs[0].op != "expand":
            src = n.inputs[0]
            if src.id in outs or len(use.get(src.id, [])) != 1:
                continue
            expr, ins, body = build(src)
            attrs = {"expr": expr, "out_shape": src.shape, "reduce": n.op,
                     "axes": n.attrs["axes"], "keepdims": n.attrs["keepdims"]}  # fmt: skip
            fused = Node.make("fused_reduce", tuple(ins), attrs, n.loc)
            if (fused.shape, fused.dtype) == (n.shape, n.dtype):
                fused.origin = origin(body + [n])
                replace[n.id] = fused
                material.discard(src.id)
        elif n.id in material and n.op != "expand":
            expr, ins, body = build(n)
            if count_ops(expr) < 2 or not ins:
                continue
            fused = Node.make("fused_elementwise", tuple(ins), {"expr": expr,
                              "out_shape": n.shape}, n.loc)  # fmt: skip
            if (fused.shape, fused.dtype) == (n.shape, n.dtype):
                fused.origin = origin(body)
                replace[n.id] = fused
    return substitute(graph, replace)
