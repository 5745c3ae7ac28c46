"""A node of the graph: one op applied to input nodes."""

from __future__ import annotations

import itertools
from typing import Any

from . import ops
from .dtypes import DType
from .shapes import Shape
from .source import SourceLoc, Where, resolve

_ids = itertools.count()
_new = object.__new__
# Attribute values that are hashable and canonical as they are (no float inside).
_PLAIN = frozenset({int, str, bool, type(None)})
# Attribute values freeze() leaves as they are.
_ATOMS = _PLAIN | {float}
# The attrs of nodes made without any (known_scalar_op's op nodes): one dict, as node attrs
# are never changed in place.
_NO_ATTRS: dict[str, Any] = {}


def freeze(value: Any) -> Any:
    """Attrs must be hashable: lists become tuples, dicts sorted item tuples."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


def canon(v: Any) -> Any:
    """A frozen attr value with floats by repr, so 0.0 and -0.0 (and NaNs) are told apart
    in keys: equal canonical values mean equal attributes."""
    # Module level, not a closure: a recursive closure is a reference cycle, and one made
    # per node left the garbage collector running every few lazy realizes.
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, tuple):
        return tuple(canon(x) for x in v)
    return v


def canonical_items(attrs: dict[str, Any]) -> tuple[Any, ...]:
    """Frozen attrs as sorted (name, canon(value)) pairs: the attrs' part of every key."""
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        t = type(v)
        if t in _PLAIN:
            out.append((k, v))
        elif t is float:
            out.append((k, ("f", repr(v))))
        else:
            out.append((k, canon(v)))
    return tuple(out)


class Node:
    """op(inputs; attrs) -> dtype[shape], recorded at `loc`.

    `realized` is opaque to the IR: the front end stores the backend value there once
    the node has been computed, and from then on treats the node as a leaf.
    `origin` says, for fused nodes, which pass made them and from which ops.
    `loc` is kept as captured (a code object and offset, see source.user_frame) and made a
    SourceLoc the first time something reads it.
    `sub`, like `realized`, is the front end's: a summary of the pending subgraph under the
    node (its structure key, leaves and locations), made when it is recorded, so a realize
    of a structure seen before need not walk the graph; `leaves`, the realised nodes that
    summary reads (kept beside it, so that what holds a summary as a trail holds no
    leaf); `used`, whether a summarised node took this one as an input (some summary
    includes it).
    """

    __slots__ = ("id", "op", "inputs", "attrs", "shape", "dtype", "where", "origin",
                 "realized", "_canon", "sub", "leaves", "used", "__weakref__")  # fmt: skip

    def __init__(
        self,
        op: str,
        inputs: tuple[Node, ...],
        attrs: dict[str, Any],
        shape: Shape,
        dtype: DType,
        loc: Where = None,
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
        self.where = loc
        self.origin = origin
        self.realized: Any = None
        self._canon: tuple[Any, ...] | None = None
        self.sub: Any = None
        self.leaves: Any = None
        self.used = False

    @classmethod
    def make(
        cls,
        op: str,
        inputs: tuple[Node, ...],
        attrs: dict[str, Any] | None = None,
        loc: Where = None,
        origin: str = "",
    ) -> Node:
        """Create a node, inferring shape and dtype from the op's rule."""
        if attrs:
            attrs = {k: v if type(v) in _ATOMS else freeze(v) for k, v in attrs.items()}
            items = canonical_items(attrs)
        else:
            attrs, items = {}, ()
        shape, dtype = ops.infer(op, [(i.shape, i.dtype) for i in inputs], attrs, items)
        node = cls(op, inputs, attrs, tuple(shape), dtype, loc, origin, frozen=True)
        node._canon = items
        return node

    @classmethod
    def known(
        cls,
        op: str,
        inputs: tuple[Node, ...],
        attrs: dict[str, Any],
        items: tuple[Any, ...],
        shape: Shape,
        dtype: DType,
        loc: Where,
    ) -> Node:
        """A node whose shape and dtype the caller already has from an earlier make() of the
        same op, input specs and attrs (frozen, with `items` their canonical_items): the
        recording fast paths, which skip the rule lookup."""
        node = _new(cls)
        node.id = next(_ids)
        node.op = op
        node.inputs = inputs
        node.attrs = attrs
        node.shape = shape
        node.dtype = dtype
        node.where = loc
        node.origin = ""
        node.realized = None
        node._canon = items
        node.sub = None
        node.leaves = None
        node.used = False
        return node

    @classmethod
    def known_scalar_op(
        cls,
        op: str,
        x: Node,
        first: bool,
        items: tuple[Any, ...],
        dtype: DType,
        const_attrs: dict[str, Any],
        const_items: tuple[Any, ...],
        const_dtype: DType,
        loc: Where,
    ) -> Node:
        """op(x, c) (op(c, x) when `first`) of a 0-d `full` node c of const_attrs, both as
        Node.known makes them: what an earlier make() of this op, x's spec and that constant
        gave. One call for the two nodes of a lazy `x + 0.5`, whose op has no attrs."""
        const = _new(cls)
        const.id = next(_ids)
        const.op = "full"
        const.inputs = ()
        const.attrs = const_attrs
        const.shape = ()
        const.dtype = const_dtype
        const.where = loc
        const.origin = ""
        const.realized = None
        const._canon = const_items
        const.sub = None
        const.leaves = None
        const.used = False
        node = _new(cls)
        node.id = next(_ids)
        node.op = op
        node.inputs = (const, x) if first else (x, const)
        node.attrs = _NO_ATTRS
        node.shape = x.shape
        node.dtype = dtype
        node.where = loc
        node.origin = ""
        node.realized = None
        node._canon = items
        node.sub = None
        node.leaves = None
        node.used = False
        return node

    @property
    def loc(self) -> SourceLoc | None:
        """Where the node was recorded in the user's code (None where unknown)."""
        where = self.where
        if where is None or type(where) is SourceLoc:
            return where
        loc = self.where = resolve(where)
        return loc

    @loc.setter
    def loc(self, value: Where) -> None:
        self.where = value

    def canonical_attrs(self) -> tuple[Any, ...]:
        """attr_key with floats by repr (see canon()); computed once per node."""
        items = self._canon
        if items is None:
            items = self._canon = canonical_items(self.attrs)
        return items

    @property
    def kind(self) -> str:
        return ops.OPS[self.op].kind

    def attr_key(self) -> tuple[Any, ...]:
        return tuple(sorted(self.attrs.items()))

    def __repr__(self) -> str:
        return f"Node(%{self.id} = {self.op} {self.dtype.short}{list(self.shape)})"
