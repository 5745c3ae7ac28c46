"""Rotary embeddings of q and k cut from one fused QKV projection -> one `rope` node.

    q = qkv[..., a:b].reshape(B, T, Hq, D).swapaxes(1, 2)     rope(q, cos, sin)
    k = qkv[..., b:c].reshape(B, T, Hk, D).swapaxes(1, 2)     rope(k, cos, sin)

become rope(qkv[..., a:c].reshape(B, T, Hq + Hk, D).swapaxes(1, 2), cos, sin), with q and
k read back as head ranges of its result: one kernel instead of two per attention layer.
Both must share the tables and layout, and sit next to each other in the same buffer.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher

_BTHD_TO_BHTD = (0, 2, 1, 3)


def _heads_of(x: Node) -> tuple[Node, int, int, int] | None:
    """(qkv, start, stop, head_dim) for qkv[..., start:stop].reshape(B, T, H, D) swapped to
    [B, H, T, D], qkv of shape [B, T, N]."""
    if x.op != "permute" or tuple(x.attrs["perm"]) != _BTHD_TO_BHTD:
        return None
    r = x.inputs[0]
    if r.op != "reshape" or len(r.shape) != 4:
        return None
    s = r.inputs[0]
    if s.op != "index" or len(s.inputs) != 1 or len(s.shape) != 3:
        return None
    base, spec = s.inputs[0], s.attrs["spec"]
    if len(spec) != 3 or any(e[0] != "slice" for e in spec):
        return None
    if any(e[1:] != (0, d, 1) for e, d in zip(spec[:2], base.shape[:2], strict=True)):
        return None
    start, stop, step = spec[2][1:]
    if step != 1 or r.shape[:2] != base.shape[:2]:
        return None
    return base, start, stop, r.shape[3]


def _heads(both: Node, lo: int, hi: int, like: Node) -> Node:
    """both[:, lo:hi]: the heads one of the merged ropes gave."""
    b, _, t, d = both.shape
    spec = (("slice", 0, b, 1), ("slice", lo, hi, 1), ("slice", 0, t, 1), ("slice", 0, d, 1))
    return Node.make("index", (both,), {"spec": spec}, like.loc)


def merge_rope(graph: Graph) -> Graph:
    m = Matcher(graph, "rope_merge", "merge_rope")
    ropes = [n for n in graph.nodes if n.op == "rope"]
    by_start: dict[tuple[int, int, int, int], tuple[Node, tuple[Node, int, int, int]]] = {}
    for n in ropes:
        h = _heads_of(n.inputs[0])
        if h is not None:
            by_start[(h[0].id, n.inputs[1].id, n.inputs[2].id, h[1])] = (n, h)
    done: set[int] = set()
    for n in ropes:
        first = _heads_of(n.inputs[0])
        if first is None or n.id in done:
            continue
        base, a, b, d = first
        nxt = by_start.get((base.id, n.inputs[1].id, n.inputs[2].id, b))
        if nxt is None or nxt[0] is n or nxt[0].id in done:
            continue
        other, (_, _, c, d2) = nxt
        if d2 != d or other.attrs != n.attrs or other.dtype != n.dtype:
            continue
        bsz, t = base.shape[0], base.shape[1]
        hq, hk = (b - a) // d, (c - b) // d
        spec = (("slice", 0, bsz, 1), ("slice", 0, t, 1), ("slice", a, c, 1))
        cut = Node.make("index", (base,), {"spec": spec}, n.loc)
        heads = Node.make("reshape", (cut,), {"shape": (bsz, t, hq + hk, d)}, n.loc)
        x = Node.make("permute", (heads,), {"perm": _BTHD_TO_BHTD}, n.loc)
        both = Node.make("rope", (x, n.inputs[1], n.inputs[2]), dict(n.attrs), n.loc)

        m.matched(n, _heads(both, 0, hq, n), [base, n.inputs[1], n.inputs[2]])
        m.matched(other, _heads(both, hq, hq + hk, other),
                  [base, other.inputs[1], other.inputs[2]])  # fmt: skip
        done |= {n.id, other.id}
    return m.finish()
