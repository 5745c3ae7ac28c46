"""Algebraic simplification: identities that leave the value (and its rounding) unchanged."""

from __future__ import annotations

from pygpukit.ir import DType, Graph, Node

from .rewrite import const_value, is_const, rewrite

# Casts a -> b that represent every value of a exactly: cast(cast(x, b), c) == cast(x, c).
_VIEWS_AND_INPUTS = ("input", "reshape", "permute", "expand", "index")
_EXACT = {
    "bool": {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "int8": {"int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "uint8": {"int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "int32": {"int64", "float64"},
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
}


def exact_cast(src: DType, dst: DType) -> bool:
    return src == dst or dst.name in _EXACT.get(src.name, ())


def _same(n: Node, x: Node) -> bool:
    """x can stand for n: same shape and dtype."""
    return bool(x.shape == n.shape and x.dtype == n.dtype)


def _identity_operand(n: Node) -> Node | None:
    """x for x+0, 0+x, x-0, x*1, 1*x, x/1, x**1 (the constant may broadcast into x)."""
    a, b = n.inputs
    if n.op in ("add", "sub") and is_const(b, 0) and _same(n, a):
        return a
    if n.op == "add" and is_const(a, 0) and _same(n, b):
        return b
    if n.op in ("mul", "div", "pow") and is_const(b, 1) and _same(n, a):
        return a
    if n.op == "mul" and is_const(a, 1) and _same(n, b):
        return b
    return None


def _compose(outer: tuple[int, ...], inner: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(inner[p] for p in outer)


def algebraic_simplification(graph: Graph) -> Graph:
    def rule(n: Node) -> Node | None:
        op = n.op
        if op in ("add", "sub", "mul", "div", "pow"):
            return _identity_operand(n)
        x = n.inputs[0] if n.inputs else None
        if x is None:
            return None
        if op == "permute":
            perm = tuple(n.attrs["perm"])
            if x.op == "permute":
                perm = _compose(perm, tuple(x.attrs["perm"]))
                x = x.inputs[0]
            if perm == tuple(range(len(perm))):
                return x
            if x is not n.inputs[0]:
                return Node.make("permute", (x,), {"perm": perm}, n.loc, n.origin)
            return None
        if op in ("reshape", "expand"):
            while x.op == op:
                x = x.inputs[0]
            if x.shape == n.shape:
                return x
            if x is not n.inputs[0]:
                return Node.make(op, (x,), {"shape": n.shape}, n.loc, n.origin)
            return None
        if op == "cast":
            # Dropping a copy of a buffer the caller holds would alias it: keep those.
            if x.dtype == n.dtype and x.op not in _VIEWS_AND_INPUTS:
                return x
            if x.op == "cast" and exact_cast(x.inputs[0].dtype, x.dtype):
                inner = x.inputs[0]
                if inner.dtype == n.dtype:
                    return inner if inner.op != "input" else None
                return Node.make("cast", (inner,), {"dtype": n.dtype.name}, n.loc, n.origin)
            return None
        if op == "neg" and x.op == "neg":
            return x.inputs[0]
        if op == "concat" and len(n.inputs) == 1:
            return x
        if op == "where":
            c = const_value(x)
            if c is not None:
                pick = n.inputs[1] if c else n.inputs[2]
                if pick.dtype != n.dtype:
                    pick = Node.make("cast", (pick,), {"dtype": n.dtype.name}, n.loc, n.origin)
                if pick.shape != n.shape:
                    pick = Node.make("expand", (pick,), {"shape": n.shape}, n.loc, n.origin)
                return pick
        return None

    return rewrite(graph, rule)
