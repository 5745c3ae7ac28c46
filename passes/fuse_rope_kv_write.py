"""A prefill chunk's rotary embedding and its two KV-cache stores -> one `rope_kv_write`.

    both = rope(x, cos, sin)                      x [B, Hq + KV, T, D] (merge_rope's q + k)
    cache_k[:, :, pos:pos + T] = both[:, Hq:]     caches [B, KV, S, D], pos read on the device
    cache_v[:, :, pos:pos + T] = v                v [B, KV, T, D]
    o = sdpa(both[:, :Hq], cache_k, cache_v, ...)

becomes q = rope_kv_write(x, cos, sin, cache_k, cache_v, v, pos) with the caches' new
values after(cache, q): one kernel instead of three a layer (the rope and two stores of a
few hundred KB each, launch-bound). The kernel rotates the query heads into its result
and stores the rotated keys and the values straight into the caches; the attention
reads them there as before. A decode step (one row stored at ("dyn", pos)) is
fuse_kv_append's.

The stores land in the caches' own memory, so the pass fuses only where a cache is a
graph input whose new value the caller takes back into that same memory
(graph.writeback: a compiled function's captured KV cache) and nothing else reads its old
value. Lazy graphs, whose inputs are never overwritten, keep the separate stores.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .patterns import Matcher, Miss, collect, event, origin
from .rewrite import users


def _full(e: tuple[object, ...], size: int) -> bool:
    return e == ("slice", 0, size, 1)


def _store(graph: Graph, st: Node, use: dict[int, list[Node]]) -> tuple[Node, Node, Node]:
    """(cache, value [B, KV, T, D], pos) of `cache[:, :, pos:pos + T] = value`."""
    if st.op != "setitem" or len(st.inputs) != 3:
        raise Miss("the keys/values are not a cache with this chunk's rows stored at a "
                   "position")  # fmt: skip
    cache, value, pos = st.inputs
    spec = st.attrs["spec"]
    if len(cache.shape) != 4:
        raise Miss(f"the cache {list(cache.shape)} is not [batch, kv_heads, seq, dim]")
    b, kv, _, d = cache.shape
    if (
        len(spec) != 4
        or spec[2][:2] != ("dslice", 0)
        or not all(
            _full(e, s) for e, s in zip((spec[0], spec[1], spec[3]), (b, kv, d), strict=True)
        )
    ):
        raise Miss(f"the cache store is not cache[:, :, pos:pos + T] (spec {spec})")
    t = spec[2][2]
    if value.shape != (b, kv, t, d) or value.dtype != cache.dtype:
        raise Miss(f"the stored rows {value.dtype.short}{list(value.shape)} are not the "
                   f"cache's {cache.dtype.short}[{b}, {kv}, {t}, {d}]")  # fmt: skip
    if cache.op != "input" or cache not in graph.inputs:
        raise Miss("the cache is not a graph input")
    if [u.id for u in use[cache.id]] != [st.id]:
        raise Miss("something else reads the cache's old value")
    outs = [k for k, o in enumerate(graph.outputs) if o is st]
    if not outs or graph.writeback.get(outs[0]) != graph.inputs.index(cache):
        raise Miss("the cache is not written back to its own memory (not a compiled "
                   "function's captured array)")  # fmt: skip
    return cache, value, pos


def _heads(n: Node) -> tuple[Node, int, int] | None:
    """(x, lo, hi) for n = x[:, lo:hi] over a [B, H, T, D] x (full slices elsewhere)."""
    if n.op != "index" or len(n.inputs) != 1 or len(n.shape) != 4:
        return None
    x = n.inputs[0]
    spec = n.attrs["spec"]
    if len(x.shape) != 4 or len(spec) != 4 or any(e[0] != "slice" for e in spec):
        return None
    if not all(_full(spec[i], x.shape[i]) for i in (0, 2, 3)) or spec[1][3] != 1:
        return None
    return x, spec[1][1], spec[1][2]


def _rope_keys(k_val: Node, use: dict[int, list[Node]], k_st: Node) -> tuple[Node, int]:
    """(the rope, q_heads) when the stored keys are the last heads of one rope whose other
    uses all read heads before them (the query)."""
    h = _heads(k_val)
    if h is None or h[0].op != "rope":
        raise Miss("the stored keys are not the last heads of a rope")
    rope, lo, hi = h
    if hi != rope.shape[1] or lo < 1:
        raise Miss(f"the stored keys are heads {lo}:{hi} of a rope of {rope.shape[1]}, not "
                   "its last heads after the query's")  # fmt: skip
    if [u.id for u in use[k_val.id]] != [k_st.id]:
        raise Miss("the rotated keys are read elsewhere too")
    for u in use[rope.id]:
        if u is k_val:
            continue
        uh = _heads(u)
        if uh is None or uh[2] > lo:
            raise Miss("the rope's result is read other than as the query's heads")
    return rope, lo


def fuse_rope_kv_write(graph: Graph) -> Graph:
    m = Matcher(graph, "rope_kv_write", "fuse_rope_kv_write")
    if not graph.writeback:  # no caller memory to write into: nothing to find, no report
        return m.finish()
    use: dict[int, list[Node]] | None = None  # built at the first candidate
    done: set[int] = set()
    for n in graph.nodes:
        if n.op != "sdpa" or len(n.inputs) < 3:
            continue
        k_st, v_st = n.inputs[1:3]
        if k_st.op != "setitem" or v_st.op != "setitem" or k_st.id in done:
            continue
        if any(e[0] == "dyn" for e in k_st.attrs["spec"]):
            continue  # one decode row: fuse_kv_append's form
        if use is None:
            use = users(graph)
        try:
            k_cache, k_val, pos = _store(graph, k_st, use)
            v_cache, v_val, v_pos = _store(graph, v_st, use)
            if k_cache is v_cache:
                raise Miss("keys and values share one cache")
            if pos is not v_pos or k_st.attrs["spec"] != v_st.attrs["spec"]:
                raise Miss("keys and values are stored at different positions")
            rope, hq = _rope_keys(k_val, use, k_st)
        except Miss as e:
            m.missed(n, str(e))
            continue
        x, cos, sin = rope.inputs
        ins = (x, cos, sin, k_cache, v_cache, v_val, pos)
        attrs = {"layout": rope.attrs["layout"], "q_heads": hq}
        fused = Node.make("rope_kv_write", ins, attrs, rope.loc)
        stop = {i.id for i in ins}
        body = {b.id: b for st in (k_st, v_st) for b in collect(st, stop)}
        fused.origin = origin(m.pass_name, list(body.values()))
        m.events.append(event(m.pattern, "matched", rope, ops=len(body)))
        # The query's head reads now read the fused result (heads 0..hq-1 of it); the
        # rope and the rotated keys are then read by nothing.
        for u in use[rope.id]:
            if u is not k_val:
                m.replace[u.id] = (fused if u.shape == fused.shape else
                                   Node.make("index", (fused,), dict(u.attrs), u.loc))  # fmt: skip
        m.replace[k_st.id] = Node.make("after", (k_cache, fused), None, k_st.loc, fused.origin)
        m.replace[v_st.id] = Node.make("after", (v_cache, fused), None, v_st.loc, fused.origin)
        done.add(k_st.id)
    return m.finish()
