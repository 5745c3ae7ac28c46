"""A decode-only serving step's cache store and its paged attention -> one
`paged_sdpa_append` node.

    pool2 = paged_write(pool, new_kv, slots, cos, sin, rope, rope_heads=KV)
    o = paged_sdpa(q, pool2[:, :KV], pool2[:, KV:], table, lens, cos, sin, rope,
                   pieces=False)

becomes o = paged_sdpa_append(q, pool, new_kv, slots, table, lens, cos, sin) and the
pool's new value after(pool, o): the attention kernel stores each row's new key and value
itself (pieces False: every row is a sequence of its own, so no row reads what another
stores), one launch a layer fewer. A step with prompt pieces keeps the store: a piece's
rows read keys the same launch stores.

As fuse_kv_append, the store lands in the pool's own memory, so the pass fuses only where
the pool is a graph input whose new value the caller takes back into that memory
(graph.writeback: the serving engine's compiled step and its captured pools) and nothing
else reads its old value.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, own_memory
from .rewrite import users


def _half(view: Node, kv: int, lo: int) -> Node:
    """The pool a view pool[:, lo:lo + kv] is of (every other axis whole)."""
    if view.op != "index" or len(view.inputs) != 1:
        raise Miss("the attention's pools are not views of one stored pool")
    pool = view.inputs[0]
    spec = view.attrs["spec"]
    want = tuple(("slice", 0, s, 1) for s in pool.shape)
    want = (want[0], ("slice", lo, lo + kv, 1), *want[2:])
    if tuple(spec) != want:
        raise Miss(f"the attention's pool view {spec} is not the pool's half {want}")
    return pool


def _written_pool(graph: Graph, w: Node, use: dict[int, list[Node]], views: set[int]) -> Node:
    """The pool `w` (a paged_write) stores into, checked to be the caller's own memory."""
    pool = w.inputs[0]
    own_memory(graph, pool, w, use, "pool")
    if not {u.id for u in use[w.id]} <= views:
        raise Miss("the stored pool feeds more than this attention")
    return pool


def fuse_paged_append(graph: Graph) -> Graph:
    m = Matcher(graph, "paged_append", "fuse_paged_append")
    if not graph.writeback:  # no caller memory to write into: nothing to find, no report
        return m.finish()
    use = users(graph)
    for n in graph.nodes:
        if n.op != "paged_sdpa" or n.attrs.get("pieces", True) or len(n.inputs) != 7:
            continue
        q, k_view, v_view, table, lens, cos, sin = n.inputs
        try:
            kv = k_view.shape[1]
            w = _half(k_view, kv, 0)
            if _half(v_view, kv, kv) is not w or w.op != "paged_write":
                raise Miss("the keys and values are not one paged_write's pool")
            if w.shape[1] != 2 * kv:
                raise Miss(f"the pool {list(w.shape)} holds more than these keys and values")
            rope = n.attrs.get("rope", "none")
            if w.attrs.get("rope", "none") != rope or w.attrs.get("rope_heads") != kv:
                raise Miss("the store does not rotate the keys as the attention rotates q")
            if len(w.inputs) != 5 or w.inputs[3] is not cos or w.inputs[4] is not sin:
                raise Miss("the store and the attention rotate by different tables")
            if w.inputs[1].dtype != w.dtype:
                raise Miss(f"the new rows {w.inputs[1].dtype.short} are not the pool's "
                           f"{w.dtype.short}")  # fmt: skip
            views = {k_view.id, v_view.id}
            if not all({u.id for u in use[x.id]} == {n.id} for x in (k_view, v_view)):
                raise Miss("the pool's views feed more than this attention")
            pool = _written_pool(graph, w, use, views)
        except Miss as e:
            m.missed(n, str(e))
            continue
        ins = (q, pool, w.inputs[1], w.inputs[2], table, lens, cos, sin)
        attrs = {k: v for k, v in n.attrs.items() if k != "pieces"}
        fused = Node.make("paged_sdpa_append", ins, attrs, n.loc)
        m.matched(n, fused, list(ins))
        m.replace[w.id] = Node.make("after", (pool, fused), None, w.loc, fused.origin)
    return m.finish()
