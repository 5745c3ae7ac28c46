"""Dead code elimination: unreachable nodes and stores that are overwritten before a read."""

from __future__ import annotations

from pygpukit.ir import Graph, Node

from .rewrite import rewrite, users


def _covers_all(spec: tuple[tuple[object, ...], ...], shape: tuple[int, ...]) -> bool:
    dims = [e for e in spec if e[0] != "new"]
    return len(dims) == len(shape) and all(
        e[0] == "slice" and e[1:] == (0, d, 1) for e, d in zip(dims, shape, strict=True)
    )


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop what no output reads, including the old contents under a covering store.

    `x[:] = v` kills every earlier value of x; `x[s] = a; x[s] = b` (same static region)
    kills the first store. Graph.rebuild keeps only nodes reachable from the outputs.
    """
    use = users(graph)
    # A covering store into an input the caller takes back (graph.writeback: a compiled
    # function's captured array) stays a store: replaced by its value, it would leave the
    # input unreachable, so lowering gives it no slot and the new value has nowhere to land.
    written_back = {graph.inputs[i].id for i in graph.writeback.values()}

    def rule(n: Node) -> Node | None:
        if n.op != "setitem" or len(n.inputs) != 2:
            return None
        base, value = n.inputs
        if _covers_all(n.attrs["spec"], n.shape) and base.id not in written_back:
            # The whole array is overwritten: the result is the value broadcast and cast.
            out = value
            if out.dtype != n.dtype:
                out = Node.make("cast", (out,), {"dtype": n.dtype.name}, n.loc, "dce")
            if out.shape != n.shape:
                out = Node.make("expand", (out,), {"shape": n.shape}, n.loc, "dce")
            return out
        if (
            base.op == "setitem"
            and len(base.inputs) == 2
            and base.attrs["spec"] == n.attrs["spec"]
            and len(use.get(base.id, ())) == 1
        ):
            return Node.make("setitem", (base.inputs[0], value), n.attrs, n.loc, n.origin)
        return None

    out = rewrite(graph, rule)
    return out if out is not graph else graph.rebuild(graph.outputs)
