"""Structure keys of pending subgraphs, built as nodes are recorded.

A lazy realize of a graph whose structure was seen before runs the cached schedule on the
new leaves. runtime.structure_key finds that structure by walking and hashing the whole
pending graph on every realize; here each recorded node carries it instead (`Node.sub`),
made from its inputs' in O(inputs), so a realize of one node that hits looks up one small
key and collects the leaves, with no Python per node.

A node's summary is the tuple (kid, epoch, size, where, input trails...), its leaves
beside it (`Node.leaves`):
- kid: an int standing for the structure of the pending subgraph under the node, as a tree
  (op, canonical attrs, and per input its kid and where its leaves sit among the node's;
  a leaf's kid is its shape and dtype). Structures are interned: equal kids mean equal
  structure. Two pending nodes of one structure are the same function of the same leaves
  (the ops are pure; collectives and `after`, whose order or count matters, are never
  summarised), so a schedule made for a graph that shared a pending node serves one that
  recomputes it and back.
- leaves (the node's `leaves`): the distinct realised nodes it reads, in first-use order
  (left to right).
- epoch: EPOCH when it was made. The summary holds while EPOCH is unchanged: realizing
  or freeing a pending node that a summary includes (a `used` one) bumps it, since the
  summaries made since may have it inside a subgraph that now stops at it. Such a node
  realizes by the walk.
- size: its tree's node count. Above MAX_TREE (a graph reusing pending nodes a lot, where
  the tree is exponentially larger than the graph) or MAX_LEAVES the node has no summary.
- where and the input trails: the summary is its node's trail too, the captured source
  locations of that tree in pre-order (Trail flattens it), resolved only when an error
  names a line of the run (errors.note_run). A pending input's trail is its summary; a
  leaf's, `(where,)`. Summaries hold no leaves, so what holds one as a trail (the last
  run's, errors.note_run) keeps no array alive.

A tuple, made once: whether a summarised node took the node as an input (so some summary
includes it) is the node's own `used`, the one thing that changes later.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from pygpukit.ir import Node

EPOCH = [0]
MAX_TREE = 4096
MAX_LEAVES = 64
# Ops whose count or order is observable (device collectives, ordering edges): a tree
# structure standing for a graph that shares them would not be the same program.
UNSUMMARISED = frozenset({"all_gather", "all_reduce", "reduce_scatter", "broadcast", "after"})
_INTERN_LIMIT = 1 << 18

_kids: dict[Any, int] = {}
_next_kid = itertools.count(1).__next__  # kids are never reused, so a stale one stays exact


def kid_of(part: Any) -> int:
    """The interned id of a structure part (a hashable tuple)."""
    k = _kids.get(part)
    if k is None:
        if len(_kids) >= _INTERN_LIMIT:
            _kids.clear()  # later equal parts get new kids: caches miss once, never mix
        k = _kids[part] = _next_kid()
    return k


def leaf_kid(n: Node) -> int:
    """The kid of a realised node read as a leaf: its shape and dtype. Kept in the node's
    `sub`, which a realised node has no other use for."""
    k = n.sub
    if k is None:
        k = n.sub = kid_of(("L", n.shape, n.dtype.name))
    return k  # type: ignore[no-any-return]


def summarise(node: Node) -> None:
    """Set node.sub (or leave it None) from its inputs: a realised input is a leaf, a
    pending one brings its own summary, which must be current. The node's shape and dtype
    are not in its part: its op's rules make them from the attrs and the inputs'."""
    if node.op in UNSUMMARISED:
        return
    epoch = EPOCH[0]
    leaves: tuple[Node, ...] = ()
    items = node._canon
    parts: list[Any] = [node.op, node.canonical_attrs() if items is None else items]
    trails: list[Any] = [node.where]  # the summary's where and input trails
    size = 1
    for i in node.inputs:
        s = i.sub
        if i.realized is not None:
            pos = _find(leaves, i)
            if pos < 0:
                pos = len(leaves)
                leaves += (i,)
            parts.append((leaf_kid(i) if s is None else s, pos))
            trails.append((i.where,))
            size += 1
            continue
        if s is None or s[1] != epoch:
            return
        i.used = True
        theirs = i.leaves
        size += s[2]
        if not theirs or theirs is leaves:
            at = None
        elif not leaves:
            leaves, at = theirs, None
        else:
            at, leaves = _merge(leaves, theirs)
        parts.append((s[0], at))
        trails.append(s)
    if size > MAX_TREE or len(leaves) > MAX_LEAVES:
        return
    node.sub = (kid_of(tuple(parts)), epoch, size, *trails)
    node.leaves = leaves


def drop(node: Node) -> None:
    """Node is realised (or freed) now: its summary goes, and those that include it stop
    holding."""
    s = node.sub
    node.sub = node.leaves = None
    if type(s) is tuple and node.used:
        EPOCH[0] += 1


def _find(leaves: Sequence[Node], node: Node) -> int:
    """Where node is among leaves (by identity: nodes compare by it), or -1."""
    for pos, seen in enumerate(leaves):
        if seen is node:
            return pos
    return -1


def _merge(leaves: tuple[Node, ...], theirs: tuple[Node, ...]
           ) -> tuple[tuple[int, ...] | None, tuple[Node, ...]]:  # fmt: skip
    """Where each of an input's leaves sits in the node's (None: at its own index) and the
    node's leaves with the input's new ones appended."""
    merged = list(leaves)
    at: list[int] = []
    for leaf in theirs:
        pos = _find(merged, leaf)
        if pos < 0:
            pos = len(merged)
            merged.append(leaf)
        at.append(pos)
    if at == list(range(len(theirs))):
        return None, tuple(merged)
    return tuple(at), tuple(merged)


def tree_nodes(root: Node) -> list[Node]:
    """The nodes of root's pending subgraph in its trail's order (pre-order, each use of a
    shared node again, realised nodes not entered)."""
    out: list[Node] = []
    stack = [root]
    while stack:
        n = stack.pop()
        out.append(n)
        if n.realized is None:
            stack.extend(reversed(n.inputs))
    return out


class Trail(Sequence[Any]):
    """A summary's trail (the summary itself) as the flat list of captured locations
    errors.note_run takes, flattened only if an error reads it."""

    __slots__ = ("_trail", "_flat")

    def __init__(self, trail: Any) -> None:
        self._trail = trail
        self._flat: list[Any] | None = None

    def _items(self) -> list[Any]:
        flat = self._flat
        if flat is None:
            flat = self._flat = []
            stack = [self._trail]
            while stack:
                t = stack.pop()
                if len(t) == 1:  # a leaf's (where,)
                    flat.append(t[0])
                else:  # a summary: (kid, epoch, size, where, input trails...)
                    flat.append(t[3])
                    stack.extend(reversed(t[4:]))
        return flat

    def __getitem__(self, i: Any) -> Any:
        return self._items()[i]

    def __len__(self) -> int:
        return len(self._items())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())
