"""Linear layers as users write them: x @ w.T (+ b) (+ gelu) becomes one `linear` node,
a GEMM with the bias and activation in its epilogue."""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, operands
from .rewrite import users

_ACT = {"tanh": "gelu_tanh", "none": "gelu_erf"}


def _weight(mm: Node) -> Node | None:
    """w for x @ w.T with a 2-D w."""
    b = mm.inputs[1]
    if b.op == "permute" and len(b.shape) == 2 and tuple(b.attrs["perm"]) == (1, 0):
        return b.inputs[0]
    return None


def fuse_linear(graph: Graph) -> Graph:
    m = Matcher(graph, "linear", "fuse_linear")
    use = users(graph)
    absorbed: set[int] = set()

    def single(n: Node, user: Node) -> bool:
        return [u.id for u in use.get(n.id, [])] == [user.id] and n not in graph.outputs

    for n in reversed(graph.nodes):
        if n.id in absorbed:
            continue
        act, top = "none", n
        if n.op == "gelu":
            act, n = _ACT[n.attrs.get("approximate", "none")], n.inputs[0]
            if not single(n, top):
                continue
        bias = None
        mm = n
        if n.op == "add":
            for a, b in operands(n, "add"):
                if a.op == "matmul" and single(a, n):
                    mm, bias = a, b
                    break
            else:
                continue
        if mm.op != "matmul" or len(mm.inputs[1].shape) != 2:
            continue
        x = mm.inputs[0]
        w = _weight(mm)
        absorbed |= {mm.id, n.id}
        if w is None:
            m.missed(top, "the weight is not transposed (write x @ w.T with w of shape [out, in])")
            continue
        if not mm.dtype.is_float:
            m.missed(top, f"{mm.dtype.name} matmul (linear is floating point)")
            continue
        if len(x.shape) < 2:
            m.missed(top, f"input {list(x.shape)} is 1-D")
            continue
        ins = [x, w]
        if bias is not None:
            why = ""
            if bias.shape != (w.shape[0],):
                why = f"bias of shape {bias.shape} is not a vector of {w.shape[0]}"
            elif n.dtype != mm.dtype:
                why = f"bias {bias.dtype.name} promotes the {mm.dtype.name} result"
            if why:
                # The GEMM still fuses; the add (and activation) stay separate ops.
                m.missed(top, why)
                bias, act, top = None, "none", mm
            else:
                ins.append(bias)
        attrs = {"activation": act, "has_bias": bias is not None}
        fused = Node.make("linear", tuple(ins), attrs, top.loc)
        if (fused.shape, fused.dtype) != (top.shape, top.dtype):
            m.missed(top, f"linear would give {fused.dtype.short}{list(fused.shape)}")
            continue
        m.matched(top, fused, ins)
    return m.finish()
