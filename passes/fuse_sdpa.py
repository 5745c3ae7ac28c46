"""Causal attention written out -> one `sdpa` node.

softmax(q @ k^T * scale [masked]) @ v, where scale is `* c`, `/ c` or absent, and the mask
is where(causal, -inf, s), where(~causal, s, -inf), or s + where(causal, -inf, 0); `causal`
must be provably the bottom-right causal mask, i.e. built from arange comparisons
(col > row + (Sk - Sq)). A mask that comes in as an array cannot be proved causal and is
reported. The softmax may run in fp32 (cast up before, down after).
"""

from __future__ import annotations

import math
from typing import Any

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, operands, scalar_const

_FLIP = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge"}


def _grid(n: Node) -> tuple[int, int, int] | None:
    """(axis from the end, start, length) for an integer arange laid along one axis."""
    offset = 0
    while n.op == "add":
        a, b = n.inputs
        c = scalar_const(b) if scalar_const(a) is None else scalar_const(a)
        if not isinstance(c, int) or isinstance(c, bool):
            return None
        offset += c
        n = a if scalar_const(a) is None else b
    while n.op in ("reshape", "expand", "cast") or (n.op == "index" and len(n.inputs) == 1):
        if n.op == "cast" and not n.dtype.is_int:
            return None
        base = n.inputs[0]
        if n.op == "index" and any(e[0] != "new" and e[0] != "slice" for e in n.attrs["spec"]):
            return None
        if n.op == "index" and any(e[0] == "slice" and e[1:] != (0, d, 1)
                                   for e, d in zip([e for e in n.attrs["spec"] if e[0] != "new"],
                                                   base.shape, strict=True)):  # fmt: skip
            return None
        if n.op == "expand":
            n = base
            continue
        big = [i for i, d in enumerate(n.shape) if d != 1]
        if len(big) > 1:
            return None
        n = base
    if n.op != "arange" or n.attrs["step"] != 1 or not isinstance(n.attrs["start"], int):
        return None
    return None if len(n.shape) != 1 else (-1, n.attrs["start"] + offset, n.shape[0])


def _axis_of(n: Node, length: int) -> int | None:
    """Which axis (from the end) of n's broadcast shape the grid's values vary along."""
    big = [i - len(n.shape) for i, d in enumerate(n.shape) if d == length and d != 1]
    return big[-1] if len(big) == 1 else None


def _hide_offset(cond: Node) -> tuple[bool, int] | None:
    """(hides_when_true, d): cond is `j - i > d` (hides) or `j - i <= d` (keeps)."""
    op = cond.op
    if op not in _FLIP:
        return None
    a, b = cond.inputs
    ga, gb = _grid(a), _grid(b)
    if ga is None or gb is None:
        return None
    ax_a, ax_b = _axis_of(a, ga[2]), _axis_of(b, gb[2])
    if ax_a == -2 and ax_b == -1:  # row OP col -> col FLIP(OP) row
        a, b, ga, gb, op = b, a, gb, ga, _FLIP[op]
    elif not (ax_a == -1 and ax_b == -2):
        return None
    # a = j + sa (columns), b = i + sb (rows): j - i OP sb - sa
    d = gb[1] - ga[1]
    if op == "gt":
        return True, d
    if op == "ge":
        return True, d - 1
    if op == "le":
        return False, d
    return False, d - 1  # lt


def _neg_inf(n: Node) -> bool:
    v = scalar_const(n)
    return isinstance(v, float) and v <= -1e9


def _unmask(s: Node, sq: int, sk: int) -> tuple[Node, bool]:
    """(scores before masking, causal?)."""
    if s.op == "where":
        cond, a, b = s.inputs
        if _neg_inf(a) or _neg_inf(b):
            h = _hide_offset(cond)
            hides = _neg_inf(a)
            if h is None or h[0] != hides or h[1] != sk - sq:
                raise Miss("the where() mask is not the causal mask built from arange")
            return (b if hides else a), True
    for t, mask in operands(s, "add"):
        if t.op != "mul" and t.op != "div" and t.op != "matmul":
            continue
        if mask.op == "where" and (_neg_inf(mask.inputs[1]) or _neg_inf(mask.inputs[2])):
            other = mask.inputs[2] if _neg_inf(mask.inputs[1]) else mask.inputs[1]
            h = _hide_offset(mask.inputs[0])
            if scalar_const(other) != 0 or h is None or h[0] != _neg_inf(mask.inputs[1]) \
                    or h[1] != sk - sq:  # fmt: skip
                raise Miss("the added mask is not the causal mask built from arange")
            return t, True
        raise Miss("the added mask is an array; it cannot be proved causal")
    return s, False


def _scaled(t: Node) -> tuple[Node, float | None]:
    for r, c in operands(t, "mul"):
        v = scalar_const(c)
        if v is not None and r.op == "matmul":
            return r, float(v)
    if t.op == "div" and t.inputs[0].op == "matmul":
        v = scalar_const(t.inputs[1])
        if v is not None and v != 0:
            return t.inputs[0], 1.0 / float(v)
    return t, None


def _k_of(kt: Node) -> Node | None:
    if kt.op != "permute":
        return None
    p = tuple(kt.attrs["perm"])
    nd = len(p)
    want = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    return kt.inputs[0] if p == want else None


def fuse_sdpa(graph: Graph) -> Graph:
    m = Matcher(graph, "sdpa", "fuse_sdpa")
    for n in graph.nodes:
        if n.op != "matmul":
            continue
        p, v = n.inputs
        inner = p.inputs[0] if p.op == "cast" else p
        sm = inner
        if sm.op != "softmax" and sm.op == "cast":
            sm = sm.inputs[0]
        if sm.op != "softmax":
            continue
        try:
            if sm.attrs["axis"] != len(sm.shape) - 1:
                raise Miss("the softmax is not over the last axis")
            s = sm.inputs[0]
            if s.op == "cast":
                s = s.inputs[0]
            sq, sk = s.shape[-2], s.shape[-1]
            t, causal = _unmask(s, sq, sk)
            r, scale = _scaled(t)
            if r.op != "matmul":
                raise Miss("the scores are not q @ k^T (times a constant)")
            q, kt = r.inputs
            k = _k_of(kt)
            if k is None:
                raise Miss("the scores are not q @ k.swapaxes(-1, -2)")
            if scale is None:
                scale = 1.0
                for qq, c in operands(q, "mul"):  # (q * scale) @ k^T
                    v_ = scalar_const(c)
                    if v_ is not None and qq.shape == q.shape and qq.dtype == q.dtype:
                        q, scale = qq, float(v_)
                        break
            attrs: dict[str, Any] = {"causal": causal, "scale": scale}
            try:
                fused = Node.make("sdpa", (q, k, v), attrs, n.loc)
            except (ValueError, TypeError) as e:
                raise Miss(str(e)) from None
            if (fused.shape, fused.dtype) != (n.shape, n.dtype):
                raise Miss(f"sdpa gives {fused.dtype.short}{list(fused.shape)}, the program "
                           f"{n.dtype.short}{list(n.shape)}")  # fmt: skip
            if not math.isfinite(scale):
                raise Miss("the scale is not finite")
        except Miss as e:
            m.missed(n, str(e))
            continue
        m.matched(n, fused, [q, k, v])
    return m.finish()
