"""A decode step's KV-cache stores and its attention -> one `sdpa_append` node.

    q = rope(q_raw, cos, sin)                              [B, H, 1, D]
    cache_k[:, :, pos] = rope(k_raw, cos, sin)[:, :, 0]    cache [B, KV, S, D]
    cache_v[:, :, pos] = v[:, :, 0]
    o = sdpa(q, cache_k, cache_v, kv_len, kv_start)

becomes o = sdpa_append(q_raw, cache_k, cache_v, k_raw, v, pos, cos, sin, kv_len, kv_start)
and the caches' new values after(cache, o): one kernel instead of four a layer (the rope,
two stores, the attention); the attention kernel rotates q and k itself and stores the
new row before it reads the cache. Where q and k do not both go through one rope (same
tables and layout), the ropes stay and the node takes rope="none".

The stores land in the caches' own memory, so the pass fuses only where a cache is a
graph input whose new value the caller takes back into that same memory
(graph.writeback: a compiled function's captured KV cache) and nothing else reads its old
value. Lazy graphs, whose inputs are never overwritten, keep the separate stores.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, own_memory
from .rewrite import users


def _full(e: tuple[object, ...], size: int) -> bool:
    return e == ("slice", 0, size, 1)


def _store(graph: Graph, st: Node, use: dict[int, list[Node]], n: Node) -> tuple[Node, Node]:
    """(cache, new value [B, KV, D]) of `cache[:, :, pos] = value` feeding attention `n`."""
    if st.op != "setitem" or len(st.inputs) != 3:
        raise Miss("the keys/values are not a cache with this step's row stored at a position")
    cache, value, _ = st.inputs
    spec = st.attrs["spec"]
    b, kv, _, d = cache.shape
    if (
        len(spec) != 4
        or spec[2] != ("dyn", 0)
        or not all(
            _full(e, s) for e, s in zip((spec[0], spec[1], spec[3]), (b, kv, d), strict=True)
        )
    ):
        raise Miss(f"the cache store is not cache[:, :, pos] (spec {spec})")
    if value.shape != (b, kv, d) or value.dtype != cache.dtype:
        raise Miss(f"the stored row {value.dtype.short}{list(value.shape)} is not the cache's "
                   f"{cache.dtype.short}[{b}, {kv}, {d}]")  # fmt: skip
    own_memory(graph, cache, st, use, "cache")
    if [u.id for u in use[st.id]] != [n.id]:
        raise Miss("the stored cache feeds more than this attention")
    return cache, value


def _step_row(value: Node) -> Node:
    """value [B, KV, D] as this step's [B, KV, 1, D] (the x[:, :, 0] it came from)."""
    if value.op == "index" and len(value.inputs) == 1:
        x = value.inputs[0]
        spec = value.attrs["spec"]
        if (
            len(x.shape) == 4 and x.shape[2] == 1 and len(spec) == 4 and spec[2] == ("int", 0)
            and all(_full(e, s) for e, s in zip((spec[0], spec[1], spec[3]),
                                                (x.shape[0], x.shape[1], x.shape[3]),
                                                strict=True))
        ):  # fmt: skip
            return x
    b, kv, d = value.shape
    return Node.make("reshape", (value,), {"shape": (b, kv, 1, d)}, value.loc)


def _shared_rope(q: Node, k: Node, use: dict[int, list[Node]], n: Node,
                 k_row: Node) -> tuple[Node, Node, tuple[Node, Node], str] | None:  # fmt: skip
    """(q_raw, k_raw, (cos, sin), layout) when q and k are one rope's two uses, read only
    here, with one table row (a single position); else None (the ropes stay)."""
    if q.op != "rope" or k.op != "rope" or q.attrs != k.attrs:
        return None
    if q.inputs[1] is not k.inputs[1] or q.inputs[2] is not k.inputs[2]:
        return None
    if [u.id for u in use[q.id]] != [n.id] or [u.id for u in use[k.id]] != [k_row.id]:
        return None
    cos, sin = q.inputs[1], q.inputs[2]
    if cos.shape != sin.shape or cos.shape[-2] != 1:
        return None
    return q.inputs[0], k.inputs[0], (cos, sin), q.attrs["layout"]


def fuse_kv_append(graph: Graph) -> Graph:
    m = Matcher(graph, "kv_append", "fuse_kv_append")
    if not graph.writeback:  # no caller memory to write into: nothing to find, no report
        return m.finish()
    use = users(graph)
    for n in graph.nodes:
        if n.op != "sdpa" or len(n.shape) != 4 or n.shape[2] != 1:
            continue
        q, k_st, v_st = n.inputs[:3]
        if k_st.op != "setitem" and v_st.op != "setitem":
            continue  # attention over arrays, not a cache being appended to
        try:
            k_cache, k_val = _store(graph, k_st, use, n)
            v_cache, v_val = _store(graph, v_st, use, n)
            if k_cache is v_cache:
                raise Miss("keys and values share one cache")
            if k_st.inputs[2] is not v_st.inputs[2]:
                raise Miss("keys and values are stored at different positions")
        except Miss as e:
            m.missed(n, str(e))
            continue
        pos = k_st.inputs[2]
        k_new, v_new = _step_row(k_val), _step_row(v_val)
        rope = _shared_rope(q, k_new, use, n, k_val)
        tables: tuple[Node, ...] = ()
        layout = "none"
        if rope is not None:
            q, k_new, tables, layout = rope
        ins = (q, k_cache, v_cache, k_new, v_new, pos, *tables, *n.inputs[3:])
        fused = Node.make("sdpa_append", ins, {**n.attrs, "rope": layout}, n.loc)
        m.matched(n, fused, list(ins))
        m.replace[k_st.id] = Node.make("after", (k_cache, fused), None, k_st.loc, fused.origin)
        m.replace[v_st.id] = Node.make("after", (v_cache, fused), None, v_st.loc, fused.origin)
    return m.finish()
