"""Lowering: a Graph becomes a Schedule, a flat list of steps over numbered slots.

Slot k holds the value of the k-th node in topological order. Each step lists the
slots that die after it, so a backend can return their memory at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pygpukit.ir import DType, Graph, SourceLoc


@dataclass(frozen=True)
class Step:
    op: str
    attrs: dict[str, Any]
    ins: tuple[int, ...]
    out: int
    shape: tuple[int, ...]
    dtype: DType
    loc: SourceLoc | None
    origin: str = ""
    frees: tuple[int, ...] = ()


@dataclass
class Schedule:
    steps: list[Step]
    n_slots: int
    input_slots: list[int]
    output_slots: list[int]
    graph: Graph
    info: dict[str, Any] = field(default_factory=dict)


def lower(graph: Graph) -> Schedule:
    slot = {n.id: k for k, n in enumerate(graph.nodes)}
    keep = {slot[o.id] for o in graph.outputs} | {slot[n.id] for n in graph.inputs if n.id in slot}
    last_use: dict[int, int] = {}
    body = [n for n in graph.nodes if n.op != "input"]
    for k, n in enumerate(body):
        for i in n.inputs:
            last_use[slot[i.id]] = k
    dies_at: dict[int, list[int]] = {}
    for s, k in last_use.items():
        if s not in keep:
            dies_at.setdefault(k, []).append(s)
    steps = [
        Step(
            op=n.op,
            attrs=n.attrs,
            ins=tuple(slot[i.id] for i in n.inputs),
            out=slot[n.id],
            shape=n.shape,
            dtype=n.dtype,
            loc=n.loc,
            origin=n.origin,
            frees=tuple(sorted(dies_at.get(k, ()))),
        )
        for k, n in enumerate(body)
    ]
    return Schedule(
        steps=steps,
        n_slots=len(graph.nodes),
        input_slots=[slot.get(n.id, -1) for n in graph.inputs],
        output_slots=[slot[o.id] for o in graph.outputs],
        graph=graph,
    )
