"""A gate/up projection and its SwiGLU -> one `linear` node with glu="swiglu".

    gu = linear(x, w_gate_up)                   linear(x, w_gate_up; glu=swiglu)
    swiglu(gu[..., :I], gu[..., I:])      ->    (width I)

The GEMV then writes silu(gate) * up straight from its sums: the decode step loses the
SwiGLU kernel and the round trip of both halves. The two slices must split the last axis
exactly in half and be the projection's only users (the halves are never materialised).
Runs before fold_into_linear, which then folds the RMSNorm feeding the projection.
"""

from __future__ import annotations

from pygpukit.ir import Graph, Node
from pygpukit.ir.linear import LinearSpec

from .patterns import Matcher
from .rewrite import users


def _half(s: Node) -> tuple[Node, int, int] | None:
    """(base, start, stop) for s = base[..., start:stop] (unit step, full leading axes)."""
    if s.op != "index" or len(s.inputs) != 1:
        return None
    base, spec = s.inputs[0], s.attrs["spec"]
    if len(spec) != len(base.shape) or any(e[0] != "slice" for e in spec):
        return None
    if any(e[1:] != (0, d, 1) for e, d in zip(spec[:-1], base.shape[:-1], strict=True)):
        return None
    start, stop, step = spec[-1][1:]
    return (base, start, stop) if step == 1 else None


def fuse_gated_linear(graph: Graph) -> Graph:
    m = Matcher(graph, "gated_linear", "fuse_gated_linear")
    use = users(graph)
    outputs = {o.id for o in graph.outputs}

    def only_users(n: Node, allowed: set[int]) -> bool:
        return n.id not in outputs and {u.id for u in use.get(n.id, [])} <= allowed

    for n in graph.nodes:
        if n.op != "swiglu":
            continue
        gate, up = _half(n.inputs[0]), _half(n.inputs[1])
        if gate is None or up is None or gate[0] is not up[0] or gate[0].op != "linear":
            continue
        lin, width = gate[0], gate[0].shape[-1]
        if (gate[1], gate[2], up[1], up[2]) != (0, width // 2, width // 2, width) or width % 2:
            m.missed(n, f"gate {gate[1]}:{gate[2]} and up {up[1]}:{up[2]} are not the two "
                        f"halves of the projection's {width} columns")  # fmt: skip
            continue
        spec = LinearSpec.of(lin.attrs, len(lin.inputs))
        if (spec.activation, spec.has_residual, spec.prologue, spec.glu) != (
            "none", False, "none", "none"
        ):  # fmt: skip
            m.missed(n, "the projection already has an activation, residual or prologue")
            continue
        halves = {n.inputs[0].id, n.inputs[1].id}
        if not only_users(lin, halves) or not all(only_users(h, {n.id}) for h in n.inputs):
            m.missed(n, "the projection or a half has another user")
            continue
        fused = Node.make("linear", lin.inputs, dict(lin.attrs, glu="swiglu"), lin.loc)
        if (fused.shape, fused.dtype) != (n.shape, n.dtype):
            m.missed(n, f"gated linear would give {fused.dtype.short}{list(fused.shape)}, "
                        f"the program {n.dtype.short}{list(n.shape)}")  # fmt: skip
            continue
        m.matched(n, fused, list(lin.inputs))
    return m.finish()
