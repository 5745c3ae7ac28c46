"""Rotary embeddings written out -> one `rope` node.

Half-split (GPT-NeoX / HF Llama): x * cos + rotate_half(x) * sin, rotate_half(x) =
concatenate([-x2, x1], -1), with full-width tables built as concatenate([c, c], -1) (or
cos/sin of concatenate([f, f], -1)); or the halves written out,
concatenate([x1*c - x2*s, x2*c + x1*s], -1). Interleaved (GPT-J): the same pair over
x[..., 0::2], x[..., 1::2], re-interleaved with stack(..., -1).reshape(x.shape).
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, operands, scalar_const


def _last_slice(n: Node) -> tuple[Node, int, int, int] | None:
    """(x, start, stop, step) for x[..., start:stop:step] (full slices elsewhere)."""
    if n.op != "index" or len(n.inputs) != 1:
        return None
    x = n.inputs[0]
    spec = n.attrs["spec"]
    if len(spec) != len(x.shape) or any(e[0] != "slice" for e in spec):
        return None
    if any(e[1:] != (0, d, 1) for e, d in zip(spec[:-1], x.shape[:-1], strict=True)):
        return None
    return x, spec[-1][1], spec[-1][2], spec[-1][3]


def _halves(x1: Node, x2: Node) -> tuple[Node, str] | None:
    """(x, layout) if x1, x2 are the two halves (or the even/odd lanes) of one x."""
    a, b = _last_slice(x1), _last_slice(x2)
    if a is None or b is None or a[0] is not b[0]:
        return None
    x = a[0]
    d = x.shape[-1]
    if d % 2:
        return None
    if a[1:] == (0, d // 2, 1) and b[1:] == (d // 2, d, 1):
        return x, "half"
    if a[1:] == (0, d, 2) and b[1:] == (1, d, 2):
        return x, "interleaved"
    return None


def _neg_of(n: Node) -> Node | None:
    if n.op == "neg":
        return n.inputs[0]
    for a, c in operands(n, "mul"):
        if scalar_const(c) == -1:
            return a
    return None


def _rotated_pair(p: Node, q: Node) -> tuple[Node, Node, Node, Node] | None:
    """(x1, x2, c, s) for p = x1*c - x2*s, q = x2*c + x1*s."""
    if p.op != "sub" or q.op != "add":
        return None
    for x1, c in operands(p.inputs[0], "mul"):
        for x2, s in operands(p.inputs[1], "mul"):
            want = {frozenset((x2.id, c.id)), frozenset((x1.id, s.id))}
            got = {frozenset(i.id for i in t.inputs) for t in q.inputs if t.op == "mul"}
            if want == got:
                return x1, x2, c, s
    return None


def _half_table(t: Node) -> Node | None:
    """c for a full-width table built from two equal halves."""
    if t.op == "concat" and len(t.inputs) == 2 and t.inputs[0] is t.inputs[1]:
        return t.inputs[0]
    if t.kind == "unary" and t.inputs[0].op == "concat":
        c = t.inputs[0]
        if len(c.inputs) == 2 and c.inputs[0] is c.inputs[1]:
            return Node.make(t.op, (c.inputs[0],), t.attrs, t.loc)
    return None


def _match(n: Node) -> tuple[Node, Node, Node, str, list[Node]] | None:
    """(x, cos, sin, layout, operands) or None; raises Miss for near-misses."""
    last = len(n.shape) - 1
    if n.op == "concat" and len(n.inputs) == 2 and n.attrs["axis"] == last:
        r = _rotated_pair(*n.inputs)
        if r is not None:
            x1, x2, c, s = r
            h = _halves(x1, x2)
            if h is None or h[1] != "half":
                raise Miss("the rotated pair is not the two halves of one array")
            return h[0], c, s, "half", [x1, x2, c, s]
    if n.op == "reshape" and n.inputs[0].op == "concat":
        cat = n.inputs[0]
        if len(cat.inputs) == 2 and all(i.op == "reshape" for i in cat.inputs):
            p, q = (i.inputs[0] for i in cat.inputs)
            r = _rotated_pair(p, q)
            if r is not None and cat.shape[-1] == 2 and cat.shape[:-1] == p.shape:
                x1, x2, c, s = r
                h = _halves(x1, x2)
                if h is None or h[1] != "interleaved" or h[0].shape != n.shape:
                    raise Miss("the rotated pair is not the even/odd lanes of one array")
                return h[0], c, s, "interleaved", [x1, x2, c, s]
    if n.op == "add":
        for p, q in operands(n, "add"):
            for rot, st in operands(q, "mul"):
                if rot.op != "concat" or len(rot.inputs) != 2:
                    continue
                neg = _neg_of(rot.inputs[0])
                if neg is None:
                    continue
                h = _halves(rot.inputs[1], neg)
                if h is None or h[1] != "half":
                    continue
                x = h[0]
                for xx, ct in operands(p, "mul"):
                    if xx is not x:
                        continue
                    cos, sin = _half_table(ct), _half_table(st)
                    if cos is None or sin is None:
                        raise Miss("cos/sin are full-width tables not built from two equal "
                                   "halves (pass [seq, head_dim/2] tables, or concatenate "
                                   "[c, c])")  # fmt: skip
                    return x, cos, sin, "half", [x, ct, st]
    return None


def fuse_rope(graph: Graph) -> Graph:
    m = Matcher(graph, "rope", "fuse_rope")
    for n in graph.nodes:
        if n.op not in ("concat", "reshape", "add"):
            continue
        try:
            r = _match(n)
            if r is None:
                continue
            x, c, s, layout, ops_ = r
            try:
                fused = Node.make("rope", (x, c, s), {"layout": layout}, n.loc)
            except (ValueError, TypeError) as e:
                raise Miss(str(e)) from None
            if (fused.shape, fused.dtype) != (n.shape, n.dtype):
                got = f"{fused.dtype.short}{list(fused.shape)}"
                raise Miss(f"rope gives {got}, the program {n.dtype.short}{list(n.shape)}")
        except Miss as e:
            m.missed(n, str(e))
            continue
        m.matched(n, fused, [x, c, s] + ops_)
    return m.finish()
