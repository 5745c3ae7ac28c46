"""A node of the graph: one op applied to input nodes."""

from __future__ import annotations

import itertools
from typing import Any

from . import ops
from .dtypes import DType
from .shapes import Shape
from .source import SourceLoc

_ids = itertools.count()


def freeze(value: Any) -> Any:
    """Attrs must be hashable: lists become tuples, dicts sorted item tuples."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


class Node:
    """op(inputs; attrs) -> dtype[shape], recorded at `loc`.

    `realized` is opaque to the IR: the front end stores the backend value there once
    the node has been computed, and from then on treats the node as a leaf.
    `origin` says, for fused nodes, which pass made them and from which ops.
    """

    __slots__ = ("id", "op", "inputs", "attrs", "shape", "dtype", "loc", "origin", "realized",
                 "__weakref__")  # fmt: skip

    def __init__(
        self,
        op: str,
        inputs: tuple[Node, ...],
        attrs: dict[str, Any],
        shape: Shape,
        dtype: DType,
        loc: SourceLoc | None = None,
        origin: str = "",
        *,
        frozen: bool = False,
    ) -> None:
        self.id = next(_ids)
        self.op = op
        self.inputs = inputs
        # `frozen`: the caller already froze the attrs (make() does, to infer with them).
        self.attrs = attrs if frozen else {k: freeze(v) for k, v in attrs.items()}
        self.shape = shape
        self.dtype = dtype
        self.loc = loc
        self.origin = origin
        self.realized: Any = None

    @classmethod
    def make(
        cls,
        op: str,
        inputs: tuple[Node, ...],
        attrs: dict[str, Any] | None = None,
        loc: SourceLoc | None = None,
        origin: str = "",
    ) -> Node:
        """Create a node, inferring shape and dtype from the op's rule."""
        attrs = {k: freeze(v) for k, v in (attrs or {}).items()}
        shape, dtype = ops.infer(op, [(i.shape, i.dtype) for i in inputs], attrs)
        return cls(op, inputs, attrs, tuple(shape), dtype, loc, origin, frozen=True)

    @property
    def kind(self) -> str:
        return ops.OPS[self.op].kind

    def attr_key(self) -> tuple[Any, ...]:
        return tuple(sorted(self.attrs.items()))

    def __repr__(self) -> str:
        return f"Node(%{self.id} = {self.op} {self.dtype.short}{list(self.shape)})"
