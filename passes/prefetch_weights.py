"""The projection after an attention prefetches the next projection's weight.

A decode step's attention runs on a few multiprocessors and is bound by latency, so
memory sits idle while it runs; the output projection after it is launched early (a
programmatic dependent on SM 9.0+) and waits. This pass hands that projection the weight
of the linear that follows it (the MLP's gate/up projection in a transformer block) as a
hint operand (attrs["prefetch"]): its GEMV pulls the start of that weight into L2 while
it waits, so the next projection reads part of its weight from L2. Nothing is computed
from the operand; backends that cannot use it ignore it.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .rewrite import substitute

_VIEWS = ("reshape", "permute", "expand")
_ATTENTION = ("sdpa", "sdpa_append")


def _after_attention(x: Node) -> bool:
    while x.op in _VIEWS or (x.op == "index" and len(x.inputs) == 1):
        x = x.inputs[0]
    return x.op in _ATTENTION


def prefetch_weights(graph: Graph) -> Graph:
    nodes = graph.nodes
    linears = [k for k, n in enumerate(nodes) if n.op == "linear"]
    replace: dict[int, Node] = {}
    for i, k in enumerate(linears):
        n = nodes[k]
        if n.attrs.get("prefetch") or not _after_attention(n.inputs[0]):
            continue
        later = [nodes[j] for j in linears[i + 1 :]]
        nxt = next((m for m in later if m.inputs[1] is not n.inputs[1]), None)
        if nxt is not None and nxt.inputs[1].op == "input":
            attrs = {**n.attrs, "prefetch": True}
            replace[n.id] = Node.make("linear", n.inputs + (nxt.inputs[1],), attrs, n.loc,
                                      n.origin)  # fmt: skip
    return substitute(graph, replace)
