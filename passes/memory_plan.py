"""Memory planning: every value of a compiled graph gets an offset in one arena.

Liveness-based reuse: a buffer is live from the step that writes it to the last step that
reads it (or reads a view of it); buffers whose lifetimes do not overlap share bytes.
Views (permute, expand, static index, `after`, and a reshape NumPy could do without a copy
over the strides its input has) get no bytes of their own: they alias their base, and keep it
alive. A setitem whose base buffer dies at that step writes in place (never into an
input's, an output's or an external's). Outputs (and the buffers they view) stay live to
the end of the run; inputs copied in are live from before the first step (the copies
happen before any step runs) to their last reader, after which their bytes are reused;
external slots (persistent arrays the caller owns) are never placed in the arena.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pygpukit.ir.shapes import contiguous_strides
from pygpukit.ir.strides import Strides, broadcast_strides, index_view, reshape_strides

from .lower import Schedule

ALIGN = 256  # bytes; the alignment cuBLASLt and vectorised kernels want

_VIEWS = ("reshape", "permute", "expand", "index", "after")
# Scatters: a copy of ins[0] with some elements stored; in place when ins[0] dies there.
STORES = ("setitem", "paged_write")


@dataclass
class MemoryPlan:
    offsets: dict[int, int]  # slot -> byte offset of its buffer in the arena
    nbytes: dict[int, int]  # slot -> bytes of its buffer
    alias: dict[int, int]  # view slot -> the slot it views (views chain to a buffer)
    inplace: set[int] = field(default_factory=set)  # step indices writing into input 0
    external: set[int] = field(default_factory=set)  # slots bound to caller memory
    writeback: list[tuple[int, int]] = field(default_factory=list)  # (value, external) copies
    arena_bytes: int = 0
    naive_bytes: int = 0

    def root(self, slot: int) -> int:
        while slot in self.alias:
            slot = self.alias[slot]
        return slot


def _aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def _view_strides(step: Any, shape: tuple[int, ...], strides: Strides) -> Strides | None:
    """The element strides of a view step over its input (shape, strides), or None when
    the step must copy (a dynamic index reads device memory; a reshape that NumPy's rule
    cannot express over these strides)."""
    if step.op == "reshape":
        return reshape_strides(shape, strides, step.shape)
    if step.op == "permute":
        return tuple(strides[p] for p in step.attrs["perm"])
    if step.op == "expand":
        return broadcast_strides(shape, strides, step.shape)
    if step.op == "after":  # the buffer an sdpa_append or rope_kv_write wrote into, as it is now
        return strides
    if step.op == "index" and len(step.ins) == 1:
        return index_view(shape, strides, step.attrs["spec"])[1]
    return None


def plan_memory(
    schedule: Schedule,
    external: set[int] | None = None,
    writeback: list[tuple[int, int]] | None = None,
) -> MemoryPlan:
    """Plan the arena of `schedule`; writeback lists (value slot, external slot) pairs whose
    value must land in the caller's array after the run."""
    external = set(external or ())
    writeback = list(writeback or [])
    steps = schedule.steps
    end = len(steps)
    alias: dict[int, int] = {}
    nodes = schedule.graph.nodes
    # Element strides of every slot over its root buffer (roots are contiguous).
    strides: dict[int, Strides] = {}

    def root(s: int) -> int:
        while s in alias:
            s = alias[s]
        return s

    inputs = {s for s in schedule.input_slots if s >= 0}
    for s in inputs:
        strides[s] = contiguous_strides(nodes[s].shape)
    # Pass 1: views alias their base; each buffer's lifetime covers its views' uses.
    for st in steps:
        view = None
        if st.op in _VIEWS:
            base = st.ins[0]
            base_strides = strides.get(base) or contiguous_strides(nodes[base].shape)
            view = _view_strides(st, nodes[base].shape, base_strides)
        if view is not None:
            alias[st.out] = st.ins[0]
            strides[st.out] = view
        else:
            strides[st.out] = contiguous_strides(st.shape)
    group_last: dict[int, int] = {s: -1 for s in inputs}
    for k, st in enumerate(steps):
        group_last.setdefault(root(st.out), k)
        for i in st.ins:
            r = root(i)
            group_last[r] = max(group_last.get(r, k), k)
    for s in list(schedule.output_slots) + [v for v, _ in writeback]:
        group_last[root(s)] = end
    # Pass 2: a store whose old contents nobody reads later writes in place.
    wb_targets = {v: e for v, e in writeback}
    inplace: set[int] = set()
    for k, st in enumerate(steps):
        if st.op not in STORES or st.ins[0] in alias:
            continue
        base = st.ins[0]
        own = base not in external and base not in inputs and base not in schedule.output_slots
        if group_last.get(base) == k and (own or wb_targets.get(st.out) == base):
            alias[st.out] = base
            inplace.add(k)
            group_last[base] = max(group_last.get(st.out, k), k)
    writeback = [(v, e) for v, e in writeback if root(v) != e]

    size: dict[int, int] = {}
    start: dict[int, int] = {}
    for s in inputs - external:
        n = schedule.graph.nodes[s]
        size[s], start[s] = math.prod(n.shape) * n.dtype.itemsize, -1
    for k, st in enumerate(steps):
        if st.out not in alias:
            size[st.out], start[st.out] = math.prod(st.shape) * st.dtype.itemsize, k

    offsets: dict[int, int] = {}
    live: list[tuple[int, int, int]] = []  # (offset, bytes, last step)
    arena = 0
    for s in sorted(size, key=lambda x: (start[x], x)):
        nb = _aligned(size[s])
        live = [b for b in live if b[2] >= start[s]]
        off = 0
        for o, b, _ in sorted(live):
            if off + nb <= o:
                break
            off = max(off, o + b)
        offsets[s] = off
        live.append((off, nb, group_last.get(s, start[s])))
        arena = max(arena, off + nb)
    naive = sum(_aligned(b) for b in size.values())
    return MemoryPlan(offsets, size, alias, inplace, external, writeback, arena, naive)
