"""A small layered layout for drawing a graph: each node gets a layer (its depth) and a
column within the layer, with a few barycenter sweeps to keep edges short and uncrossed.

Enough for the graphs PyGPUkit's passes leave (tens to a few hundred nodes); no edge
routing: an edge is drawn from its source to its target directly.
"""

from __future__ import annotations

from collections.abc import Sequence

SWEEPS = 4


def assign_layers(names: Sequence[str], inputs: dict[str, list[str]]) -> dict[str, int]:
    """Layer of each node: one below its deepest input. `names` is in topological order.
    A node without inputs (a graph input, a constant) sits just above its first user,
    not at the top, so a weight read late does not stretch an edge over the whole page."""
    layer: dict[str, int] = {}
    for n in names:
        layer[n] = 1 + max((layer[i] for i in inputs[n]), default=-1)
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for i in inputs[n]:
            users[i].append(n)
    for n in names:
        if not inputs[n] and users[n]:
            layer[n] = max(0, min(layer[u] for u in users[n]) - 1)
    return layer


def _sweep(rows: list[list[str]], neighbours: dict[str, list[str]], order: range) -> None:
    # Sort each row by the mean column of the node's neighbours (inputs going down, users
    # going up); a node without any keeps its column (list.sort is stable).
    col = {n: float(c) for row in rows for c, n in enumerate(row)}
    for r in order:

        def key(n: str) -> float:
            near = [col[m] for m in neighbours[n]]
            return sum(near) / len(near) if near else col[n]

        rows[r].sort(key=key)
        for c, n in enumerate(rows[r]):
            col[n] = float(c)


def layered_layout(
    names: Sequence[str], inputs: dict[str, list[str]]
) -> dict[str, tuple[int, float]]:
    """name -> (layer, column); columns of a row are centred on 0 (they may be halves)."""
    layer = assign_layers(names, inputs)
    rows: list[list[str]] = [[] for _ in range(1 + max(layer.values(), default=-1))]
    for n in names:
        rows[layer[n]].append(n)
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for i in inputs[n]:
            users[i].append(n)
    for _ in range(SWEEPS):
        _sweep(rows, inputs, range(1, len(rows)))  # down: follow the inputs
        _sweep(rows, users, range(len(rows) - 2, -1, -1))  # up: follow the users
    return {n: (r, c - (len(row) - 1) / 2) for r, row in enumerate(rows)
            for c, n in enumerate(row)}  # fmt: skip
