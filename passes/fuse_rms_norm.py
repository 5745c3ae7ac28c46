"""RMSNorm written out: x * rsqrt(mean(x*x, -1, keepdims=True) + eps) * g -> `rms_norm`.

Forms: x*x or x.pow(2); rsqrt(v), 1/sqrt(v) or x / sqrt(v); with or without a gain; with
or without an fp32 upcast of x and a downcast before or after the gain. Refused (reported):
eps that is not a constant, a mean not over the last axis, a gain that is not per-feature.

With the residual add: rms_norm(x + r) -> rms_norm(x, g, r; has_residual), one kernel
(pgk_rms_norm_add) when the sum has no other user and x, r, the sum share shape and dtype.
Otherwise the add stays its own node and the report says why: the sum is used elsewhere
(a transformer's residual stream), it broadcasts or promotes, or it is a linear's result
plus r (fold_into_linear takes that add as the linear's residual epilogue instead).
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, collect, operands, scalar_const
from .rewrite import const_value, users


def _denominator(v: Node) -> tuple[Node, float]:
    """(the array whose mean of squares is taken, eps) from mean(x*x) + eps."""
    for mn, e in operands(v, "add"):
        if mn.op != "mean":
            continue
        eps = scalar_const(e)
        if eps is None:
            raise Miss("eps is a tensor")
        if not mn.attrs["keepdims"] or tuple(mn.attrs["axes"]) != (len(mn.shape) - 1,):
            raise Miss("the mean is not over the last axis with keepdims=True")
        sq = mn.inputs[0]
        if sq.op == "mul" and sq.inputs[0] is sq.inputs[1]:
            return sq.inputs[0], float(eps)
        if sq.op == "pow" and const_value(sq.inputs[1]) == 2:
            return sq.inputs[0], float(eps)
        raise Miss("the mean is not of x*x or x.pow(2)")
    raise Miss("no mean(x*x) + eps under the rsqrt")


def _normalised(y: Node) -> tuple[Node, Node] | None:
    """(x, v) for x * rsqrt(v), x * (1/sqrt(v)), x / sqrt(v); None if y is none of them."""
    for x, r in operands(y, "mul"):
        if r.op == "rsqrt":
            return x, r.inputs[0]
        if r.op == "div" and const_value(r.inputs[0]) == 1 and r.inputs[1].op == "sqrt":
            return x, r.inputs[1].inputs[0]
    if y.op == "div" and y.inputs[1].op == "sqrt" and const_value(y.inputs[0]) is None:
        return y.inputs[0], y.inputs[1].inputs[0]
    return None


def _per_feature(g: Node, d: int) -> bool:
    return g.shape == () or (g.shape[-1] in (1, d) and all(s == 1 for s in g.shape[:-1]))


def _residual(h: Node, root: Node, gain: Node | None, use: dict[int, list[Node]],
              outs: set[int]) -> tuple[Node, Node] | str:  # fmt: skip
    """(x, r) of the sum h = x + r that only the norm at root reads, else why not."""
    body = {n.id for n in collect(root, {h.id} | ({gain.id} if gain is not None else set()))}
    if h.id in outs or any(u.id not in body for u in use.get(h.id, [])):
        return "the sum x + r is used elsewhere (kept as its own add)"
    a, b = h.inputs
    if any((t.shape, t.dtype) != (h.shape, h.dtype) for t in (a, b)):
        return (f"the sum x + r ({a.dtype.short}{list(a.shape)} + {b.dtype.short}"
                f"{list(b.shape)}) broadcasts or promotes (kept as its own add)")  # fmt: skip
    for t in (a, b):
        if t.op in ("linear", "matmul") and [u.id for u in use.get(t.id, [])] == [h.id]:
            return "the sum x + r adds to a linear's result (left to fold into the linear)"
    return a, b


def fuse_rms_norm(graph: Graph) -> Graph:
    m = Matcher(graph, "rms_norm", "fuse_rms_norm")
    use = users(graph)
    outs = {o.id for o in graph.outputs}

    def only_user(n: Node) -> Node | None:
        us = use.get(n.id, [])
        return us[0] if len(us) == 1 and n.id not in outs else None

    done: set[int] = set()
    for y in graph.nodes:
        parts = _normalised(y)
        if parts is None or y.id in done:
            continue
        xn, v = parts
        if v.op != "add" or not any(a.op == "mean" for a in v.inputs):
            continue
        try:
            xs, eps = _denominator(v)
            if xs is not xn:
                raise Miss("the squared array is not the one normalised")
            d = xn.shape[-1]
            root, gain = y, None
            u = only_user(root)
            if u is not None and u.op == "cast":
                root, u = u, only_user(u)
            if u is not None and u.op == "mul":
                g = u.inputs[1] if u.inputs[0] is root else u.inputs[0]
                if not _per_feature(g, d):
                    raise Miss(f"gain of shape {g.shape} is not per-feature [{d}]")
                root, gain, u = u, g, only_user(u)
                if u is not None and u.op == "cast":
                    root = u
            base = xn.inputs[0] if xn.op == "cast" else xn
            x = base if root.dtype == base.dtype else xn
            if not root.dtype.is_float:
                raise Miss(f"result is {root.dtype.name}")
            if x.dtype != root.dtype:
                x = Node.make("cast", (x,), {"dtype": root.dtype.name}, root.loc)
            gain_in = gain
            if gain is None:
                gain = Node("full", (), {"shape": (), "dtype": x.dtype.name, "value": 1.0}, (),
                            x.dtype, root.loc)  # fmt: skip
            elif gain.shape not in ((), (d,)):
                gain = Node.make("reshape", (gain,), {"shape": (gain.shape[-1],)}, root.loc)
            if root.shape != xn.shape:
                raise Miss(f"the result {list(root.shape)} is broadcast beyond x {list(xn.shape)}")
            res = _residual(x, root, gain_in, use, outs) if x is base and x.op == "add" else None
            stop = [xn, base, gain]
            if isinstance(res, tuple):
                fused = Node.make("rms_norm", (res[0], gain, res[1]),
                                  {"eps": eps, "has_residual": True}, root.loc)  # fmt: skip
                stop = [*res, gain] + ([gain_in] if gain_in is not None else [])
            else:
                fused = Node.make("rms_norm", (x, gain), {"eps": eps}, root.loc)
        except Miss as e:
            m.missed(y, str(e))
            continue
        if isinstance(res, str):
            m.missed(base, res)
        m.matched(root, fused, stop)
        done.add(root.id)
    return m.finish()
