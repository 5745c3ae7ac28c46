"""The pass pipeline: a list of named Graph -> Graph functions, validated after each."""

from __future__ import annotations

import time
from collections.abc import Callable

from pygpukit.ir import Graph

Pass = Callable[[Graph], Graph]

# In pipeline order. Each entry is a plain function in its own file under passes/.
PIPELINE: list[Pass] = []


def run_pipeline(graph: Graph, passes: list[Pass] | None = None, validate: bool = True) -> Graph:
    """Run passes in order; record per-pass time and node counts in graph.provenance."""
    for p in PIPELINE if passes is None else passes:
        before = len(graph.nodes)
        t0 = time.perf_counter()
        out = p(graph)
        dt_ms = (time.perf_counter() - t0) * 1e3
        if validate:
            out.validate()
        out.provenance = list(graph.provenance) + [
            {"pass": p.__name__, "ms": dt_ms, "nodes_before": before, "nodes_after": len(out.nodes)}
        ]
        graph = out
    return graph
