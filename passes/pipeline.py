"""The pass pipeline: a list of named Graph -> Graph functions, each graph validated after
each pass where settings.validate_passes() says so (debug runs and the test suite): a
validation costs about a third of the pipeline's time, and the passes keep graphs valid."""

from __future__ import annotations

import time
from collections.abc import Callable

from pygpukit import settings
from pygpukit.errors import SettingError
from pygpukit.ir import Graph

from .cse import common_subexpression_elimination
from .dce import dead_code_elimination
from .fold import constant_folding
from .fold_into_linear import fold_into_linear
from .fuse_elementwise import fuse_elementwise
from .fuse_gated_linear import fuse_gated_linear
from .fuse_gelu import fuse_gelu
from .fuse_kv_append import fuse_kv_append
from .fuse_linear import fuse_linear
from .fuse_paged_append import fuse_paged_append
from .fuse_rms_norm import fuse_rms_norm
from .fuse_rope import fuse_rope
from .fuse_rope_kv_write import fuse_rope_kv_write
from .fuse_sdpa import fuse_sdpa
from .fuse_softmax import fuse_softmax
from .fuse_swiglu import fuse_swiglu
from .merge_rope import merge_rope
from .sdpa_seq_major import sdpa_seq_major
from .simplify import algebraic_simplification

Pass = Callable[[Graph], Graph]

# In pipeline order. Each entry is a plain function in its own file under passes/.
# - softmax before attention: sdpa matches the softmax node;
# - a decode step's cache stores join its attention (with the ropes of q and k) before
#   merge_rope pairs up the ropes that are left; a decode-only serving step's paged store
#   joins its paged attention;
# - a prefill chunk's merged rope then takes its two cache stores (fuse_rope_kv_write);
# - a prefill's attention writes its output with the heads already swapped back to the
#   sequence-major layout (sdpa_seq_major, after the sdpa forms are settled);
# - SwiGLU before linear, so a gate projection stays a plain GEMM feeding swiglu;
# - written-out GELU before linear, so the GELU lands in the GEMM epilogue;
# - then a gate/up projection takes its SwiGLU as an epilogue, and norms, gates and
#   residual adds around a linear fold into it;
# - generic elementwise fusion takes what is left.
PIPELINE: list[Pass] = [
    dead_code_elimination,
    constant_folding,
    algebraic_simplification,
    common_subexpression_elimination,
    fuse_softmax,
    fuse_sdpa,
    fuse_rms_norm,
    fuse_rope,
    fuse_kv_append,
    fuse_paged_append,
    merge_rope,
    fuse_rope_kv_write,
    sdpa_seq_major,
    fuse_swiglu,
    fuse_gelu,
    fuse_linear,
    fuse_gated_linear,
    fold_into_linear,
    fuse_elementwise,
    dead_code_elimination,
]


def pass_named(name: str) -> Pass:
    for p in PIPELINE:
        if p.__name__ == name:
            return p
    raise KeyError(f"no pass named {name!r}; passes: {', '.join(p.__name__ for p in PIPELINE)}")


def default_passes() -> list[Pass]:
    """PIPELINE less the passes named by gpk.set_skip_passes or PYGPUKIT_SKIP_PASSES, to
    measure or debug a program with and without a fusion."""
    skip = settings.skip_passes()
    unknown = skip - {p.__name__ for p in PIPELINE}
    if unknown:
        raise SettingError(f"{settings.skip_passes_source()} names no pass {sorted(unknown)}; "
                           f"passes: {', '.join(p.__name__ for p in PIPELINE)}")  # fmt: skip
    return [p for p in PIPELINE if p.__name__ not in skip]


def run_pipeline(graph: Graph, passes: list[Pass] | None = None, validate: bool | None = None,
                 on_pass: Callable[[str, Graph], None] | None = None) -> Graph:  # fmt: skip
    """Run passes in order (default_passes() unless given); record per-pass time and node
    counts in graph.provenance.

    `on_pass(name, graph)` sees the graph after each pass (for `pygpukit graph dump`).
    validate: check the graph after each pass; None: settings.validate_passes().
    """
    if validate is None:
        validate = settings.validate_passes()
    for p in default_passes() if passes is None else passes:
        before = len(graph.nodes)
        t0 = time.perf_counter()
        out = p(graph)
        dt_ms = (time.perf_counter() - t0) * 1e3
        if validate:
            out.validate()
        if out is graph:
            out = graph.rebuild(graph.outputs)
        out.provenance = list(graph.provenance) + [
            {"pass": p.__name__, "ms": dt_ms, "nodes_before": before, "nodes_after": len(out.nodes)}
        ]
        graph = out
        if on_pass is not None:
            on_pass(p.__name__, graph)
    return graph
