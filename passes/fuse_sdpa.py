"""Attention written out -> one `sdpa` node.

softmax(q @ k^T * scale [masked]) @ v, where scale is `* c`, `/ c` or absent, and the mask
is where(causal, -inf, s), where(~causal, s, -inf), or s + where(causal, -inf, 0); `causal`
must be provably the bottom-right causal mask, i.e. built from arange comparisons
(col > row + (Sk - Sq)). A mask that comes in as an array cannot be proved causal and is
reported. The softmax may run in fp32 (cast up before, down after).

Grouped-query attention as a model writes it (the G query heads of a kv head folded into
the rows: q.reshape(B, KV, G*T, D) @ k^T, scores viewed as [B, KV, G, T, S]) matches too,
and so does the mask of a decode step over a static cache: `where(visible, s, -inf)` with
visible = (j <= pos) & (j >= start[b]) for key index j = arange(S), a device position `pos`
and per-row left-padding offsets `start`; it becomes sdpa's kv_len (pos + 1) and kv_start
inputs, read on the device.
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


class _Mask:
    """What a mask hides: causal (bottom-right), keys at or past kv_len, keys before
    kv_start[b]. The device-value bounds are nodes made once per pass and shared by every
    attention in the graph (one `pos + 1` for all layers)."""

    def __init__(self, made: dict[tuple[int, int, tuple[int, ...]], Node], loc: Any) -> None:
        self.causal = False
        self.kv_len: Node | None = None
        self.kv_start: Node | None = None
        self._made = made  # the pass's bounds, shared by every attention it fuses
        self.loc = loc  # the attention's line, for bounds made from graph inputs

    def shifted(self, x: Node, by: int, shape: tuple[int, ...]) -> Node:
        """x (a broadcastable integer) reshaped to `shape`, plus `by`, made once."""
        key = (x.id, by, shape)
        if key not in self._made:
            loc = x.loc or self.loc
            n = x if x.shape == shape else Node.make("reshape", (x,), {"shape": shape}, loc)
            if by:
                one = Node.make("full", (), {"shape": (), "dtype": n.dtype.name, "value": by})
                n = Node.make("add", (n, one), None, loc)
            self._made[key] = n
        return self._made[key]


def _strip_reshapes(n: Node) -> Node:
    while n.op in ("reshape", "expand"):
        n = n.inputs[0]
    return n


def _clauses(cond: Node) -> list[Node]:
    cond = _strip_reshapes(cond)
    if cond.op == "logical_and":
        return [c for i in cond.inputs for c in _clauses(i)]
    return [cond]


def _key_bound(c: Node, sk: int, batch: int, made: _Mask) -> bool:
    """Record `j OP x` (j the key index, x a device bound) in `made`; False if c is not
    such a clause. x is a 0-d position (an upper bound: kv_len) or one offset per batch
    row (a lower bound: kv_start)."""
    if c.op not in _FLIP:
        return False
    a, b = c.inputs
    op = c.op
    ga = _grid(a)
    if ga is None or _axis_of(a, sk) != -1:
        a, b, op, ga = b, a, _FLIP[op], _grid(b)
    if ga is None or ga[1] != 0 or ga[2] != sk or _axis_of(a, sk) != -1 or _grid(b) is not None:
        return False
    x = _strip_reshapes(b)
    if not x.dtype.is_int or x.dtype.name == "bool":
        return False
    n = math.prod(x.shape)
    if op in ("le", "lt") and n == 1 and made.kv_len is None:
        made.kv_len = made.shifted(x, 1 if op == "le" else 0, ())
        return True
    if op in ("ge", "gt") and made.kv_start is None and (n == batch or n == 1):
        # One offset per batch row: the mask's batch axis must be the scores' first.
        if n == batch and batch > 1 and (b.shape[0] != batch or math.prod(b.shape) != n):
            return False
        x1 = made.shifted(x, 1 if op == "gt" else 0, (n,))
        if n != batch:
            x1 = Node.make("expand", (x1,), {"shape": (batch,)}, x.loc or made.loc)
        made.kv_start = x1
        return True
    return False


def _mask_of(cond: Node, sq: int, sk: int, batch: int, made: _Mask) -> None:
    """Fill `made` from a visibility condition (True where a query may see a key)."""
    for c in _clauses(cond):
        h = _hide_offset(c)
        if h is not None:
            if h[0] or h[1] != sk - sq:
                raise Miss("the where() mask is not the causal mask built from arange")
            made.causal = True
        elif not _key_bound(c, sk, batch, made):
            raise Miss(f"the mask clause `{c.op}` is neither causal nor a bound of the keys "
                       "by a device position or per-row offsets")  # fmt: skip


def _unmask(s: Node, sq: int, sk: int, batch: int, made: _Mask) -> Node:
    """The scores before masking; what the mask hides goes into `made`."""
    if s.op == "where":
        cond, a, b = s.inputs
        if _neg_inf(a) or _neg_inf(b):
            hides = _neg_inf(a)
            h = _hide_offset(cond)
            if h is not None:
                if h[0] != hides or h[1] != sk - sq:
                    raise Miss("the where() mask is not the causal mask built from arange")
                made.causal = True
            elif hides:
                raise Miss("the where() mask is not the causal mask built from arange")
            else:
                _mask_of(cond, sq, sk, batch, made)
            return b if hides else a
    for t, mask in operands(s, "add"):
        if t.op != "mul" and t.op != "div" and t.op != "matmul":
            continue
        if mask.op == "where" and (_neg_inf(mask.inputs[1]) or _neg_inf(mask.inputs[2])):
            other = mask.inputs[2] if _neg_inf(mask.inputs[1]) else mask.inputs[1]
            h = _hide_offset(mask.inputs[0])
            if scalar_const(other) != 0 or h is None or h[0] != _neg_inf(mask.inputs[1]) \
                    or h[1] != sk - sq:  # fmt: skip
                raise Miss("the added mask is not the causal mask built from arange")
            made.causal = True
            return t
        raise Miss("the added mask is an array; it cannot be proved causal")
    return s


def _rows_view(n: Node) -> Node:
    """n without the casts and reshapes that keep the last axis (score rows regrouped,
    e.g. [B, KV, G*T, S] <-> [B, KV, G, T, S], or cast to float32 for the softmax)."""
    while n.op in ("cast", "reshape") and n.inputs[0].shape[-1:] == n.shape[-1:]:
        if n.op == "cast" and not (n.dtype.is_float and n.inputs[0].dtype.is_float):
            break
        n = n.inputs[0]
    return n


def _grouped_q(q: Node, k: Node) -> Node:
    """The [..., H, T, D] queries behind q.reshape(..., KV, G*T, D) (grouped-query heads
    folded into rows), else q itself."""
    if q.op != "reshape":
        return q
    q4 = q.inputs[0]
    if len(q4.shape) != len(q.shape) or q4.shape[:-3] != q.shape[:-3]:
        return q
    h, t = q4.shape[-3], q4.shape[-2]
    kv = k.shape[-3]
    if q.shape[-3] != kv or h % kv or (h // kv) * t != q.shape[-2]:
        return q
    return q4


def _scaled(t: Node) -> tuple[Node, float | None]:
    for r, c in operands(t, "mul"):
        v = scalar_const(c)
        if v is not None and _rows_view(r).op == "matmul":
            return _rows_view(r), float(v)
    if t.op == "div" and _rows_view(t.inputs[0]).op == "matmul":
        v = scalar_const(t.inputs[1])
        if v is not None and v != 0:
            return _rows_view(t.inputs[0]), 1.0 / float(v)
    return _rows_view(t), None


def _k_of(kt: Node) -> Node | None:
    if kt.op != "permute":
        return None
    p = tuple(kt.attrs["perm"])
    nd = len(p)
    want = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    return kt.inputs[0] if p == want else None


def fuse_sdpa(graph: Graph) -> Graph:
    m = Matcher(graph, "sdpa", "fuse_sdpa")
    bounds: dict[tuple[int, int, tuple[int, ...]], Node] = {}
    for n in graph.nodes:
        if n.op != "matmul":
            continue
        p, v = n.inputs
        sm = _rows_view(p)
        if sm.op != "softmax":
            continue
        try:
            if sm.attrs["axis"] != len(sm.shape) - 1:
                raise Miss("the softmax is not over the last axis")
            s = _rows_view(sm.inputs[0]) if sm.inputs[0].op == "cast" else sm.inputs[0]
            sq, sk = s.shape[-2], s.shape[-1]
            mask = _Mask(bounds, n.loc)
            t = _unmask(s, sq, sk, s.shape[0] if len(s.shape) > 3 else 1, mask)
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
            q = _grouped_q(q, k)
            if q.shape[-2] != sq and (mask.causal or q.shape[-3] == k.shape[-3]):
                raise Miss(f"the scores' rows ({sq}) are not the queries ({q.shape[-2]})")
            attrs: dict[str, Any] = {"causal": mask.causal, "scale": scale}
            extra = [b for b in (mask.kv_len, mask.kv_start) if b is not None]
            attrs["kv_len"] = mask.kv_len is not None
            attrs["kv_start"] = mask.kv_start is not None
            try:
                fused = Node.make("sdpa", (q, k, v, *extra), attrs, n.loc)
                if fused.shape != n.shape:
                    fused = Node.make("reshape", (fused,), {"shape": n.shape}, n.loc)
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
        m.matched(n, fused, [q, k, v, *extra])
    return m.finish()
