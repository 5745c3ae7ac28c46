"""Attention whose output is read only with its heads and sequence axes swapped -> sdpa
writing that layout itself (attrs["seq_major"]).

    o = sdpa(q, k, v, ...)                          [B, H, T, D]
    y = o.swapaxes(1, 2).reshape(B, T, H * D)       (the heads merged for the out projection)

becomes y = sdpa(q, k, v, ..., seq_major=True).reshape(B, T, H * D): the attention kernel
stores each query row at its [B, T, H, D] place, so the merge is a view and the copy that
transposed the whole output (a read and a write of it, and a launch, per layer of a
prefill) is gone. Decode steps (one query row) are left alone: there the two layouts are
the same bytes and the swap is a view already.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss
from .rewrite import users


def _swaps_heads_and_seq(perm: tuple[int, ...]) -> bool:
    """perm swaps the last-but-two and last-but-one axes and keeps every other."""
    n = len(perm)
    if n < 3:
        return False
    want = list(range(n))
    want[n - 3], want[n - 2] = n - 2, n - 3
    return list(perm) == want


def sdpa_seq_major(graph: Graph) -> Graph:
    m = Matcher(graph, "sdpa_seq_major", "sdpa_seq_major")
    found = [n for n in graph.nodes
             if n.op == "permute" and n.inputs[0].op == "sdpa"
             and not n.inputs[0].attrs.get("seq_major")
             and _swaps_heads_and_seq(tuple(n.attrs["perm"]))]  # fmt: skip
    if not found:  # most graphs: no users map to build
        return m.finish()
    use = users(graph)
    outputs = {o.id for o in graph.outputs}
    for n in found:
        a = n.inputs[0]
        try:
            if a.shape[-2] <= 1:
                raise Miss("one query row: the swapped output is a view already")
            if a.id in outputs or [u.id for u in use[a.id]] != [n.id]:
                raise Miss("the attention output is also read in its own layout")
        except Miss as e:
            m.missed(n, str(e))
            continue
        fused = Node.make("sdpa", a.inputs, {**a.attrs, "seq_major": True}, a.loc)
        m.matched(n, fused, list(a.inputs))
    return m.finish()
