"""What surrounds a linear layer in a transformer block folds into the `linear` node:
an RMSNorm or a SwiGLU feeding it (a prologue on its input) and a residual add of its
result (an epilogue). A decode step's GEMVs then read their inputs through the norm or the
gate and add the residual in place, instead of a separate kernel for each.

    linear(rms_norm(h, g), w)      -> linear(h, w, g;  prologue=rms_norm)
    linear(swiglu(gate, up), w)    -> linear(gate, w, up;  prologue=swiglu)
    linear(x, w) + r               -> linear(x, w, r;  has_residual)

The norm or gate must have no other user (its result is never materialised), and the
residual must have the linear's shape and dtype (no broadcast, no promotion).
"""

from __future__ import annotations

from typing import Any

from pygpukit.ir import Graph, Node
from pygpukit.ir.linear import LinearSpec

from .patterns import Matcher, operands
from .rewrite import users


def _parts(n: Node) -> tuple[Node, tuple[Node, ...], Node | None, Node | None, dict[str, Any]]:
    """(x, the weight's inputs, bias, residual, attrs) of a linear node without a prologue
    (a quantized weight is its data, scale and zero points)."""
    p = LinearSpec.of(n.attrs, len(n.inputs)).split(n.inputs)
    return p.x, p.weight, p.bias, p.residual, dict(n.attrs)


def _build(x: Node, w: tuple[Node, ...], bias: Node | None, res: Node | None,
           pro: Node | None, attrs: dict[str, Any], loc: Any) -> Node:  # fmt: skip
    ins = [x, *w] + [b for b in (bias, res, pro) if b is not None]
    attrs = dict(attrs, has_bias=bias is not None, has_residual=res is not None)
    return Node.make("linear", tuple(ins), attrs, loc)


def fold_into_linear(graph: Graph) -> Graph:
    m = Matcher(graph, "linear_fold", "fold_into_linear")
    use = users(graph)
    outputs = {o.id for o in graph.outputs}

    def only_user(n: Node, user: Node) -> bool:
        return n.id not in outputs and [u.id for u in use.get(n.id, [])] == [user.id]

    def with_prologue(lin: Node) -> tuple[Node, Node | None, dict[str, Any], list[Node]]:
        """(input, prologue operand, attrs, operands) once the input's norm/gate folds in."""
        x, _, _, _, attrs = _parts(lin)
        if LinearSpec.of(attrs, len(lin.inputs)).prologue != "none" or not only_user(x, lin):
            return x, None, attrs, [x]
        if x.op == "rms_norm" and len(x.inputs) == 2:
            attrs.update(prologue="rms_norm", eps=x.attrs["eps"])
            return x.inputs[0], x.inputs[1], attrs, list(x.inputs)
        if x.op == "swiglu":
            attrs.update(prologue="swiglu")
            return x.inputs[0], x.inputs[1], attrs, list(x.inputs)
        return x, None, attrs, [x]

    folded: set[int] = set()
    for n in graph.nodes:  # residual adds first: they take their linear with them
        if n.op != "add":
            continue
        for lin, r in operands(n, "add"):
            if lin.op != "linear" or not only_user(lin, n) or _parts(lin)[3] is not None:
                continue
            if (r.shape, r.dtype) != (n.shape, n.dtype) or lin.dtype != n.dtype:
                m.missed(n, f"residual {r.dtype.short}{list(r.shape)} is not the linear's "
                            f"{lin.dtype.short}{list(lin.shape)}")  # fmt: skip
                continue
            x, pro, attrs, xs = with_prologue(lin)
            _, w, bias, _, _ = _parts(lin)
            fused = _build(x, w, bias, r, pro, attrs, lin.loc)
            m.matched(n, fused, xs + [*w, r] + ([bias] if bias is not None else []))
            folded.add(lin.id)
            break
    for n in graph.nodes:
        if n.op != "linear" or n.id in folded:
            continue
        x, pro, attrs, xs = with_prologue(n)
        if pro is None:
            continue
        _, w, bias, res, _ = _parts(n)
        fused = _build(x, w, bias, res, pro, attrs, n.loc)
        extra = [b for b in (bias, res) if b is not None]
        m.matched(n, fused, xs + [*w] + extra)
    return m.finish()
