"""Stride arithmetic for views and kernels (element strides, NumPy semantics): one owner
for the layout rules the memory planner and the backends share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .indexing import dslice_starts
from .shapes import contiguous_strides

Strides = tuple[int, ...]


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    expect = 1
    for d, s in zip(reversed(shape), reversed(strides), strict=True):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def broadcast_strides(shape: Sequence[int], strides: Sequence[int],
                      target: Sequence[int]) -> Strides:  # fmt: skip
    """Strides of a view broadcast to `target` (0 along broadcast dims)."""
    pad = len(target) - len(shape)
    out = [0] * pad
    for d, s, t in zip(shape, strides, target[pad:], strict=True):
        out.append(s if d == t and d != 1 else 0)
    return tuple(out)


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drops size-1 dims and merges neighbours that are contiguous for every operand."""
    dims: list[int] = []
    out: list[list[int]] = [[] for _ in strides]
    for i, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(o[-1] == s[i] * size for o, s in zip(out, strides, strict=True)):
            dims[-1] *= size
            for o, s in zip(out, strides, strict=True):
                o[-1] = s[i]
            continue
        dims.append(size)
        for o, s in zip(out, strides, strict=True):
            o.append(s[i])
    return dims, out


def reshape_strides(shape: Sequence[int], strides: Sequence[int],
                    new: Sequence[int]) -> Strides | None:  # fmt: skip
    """Strides of `new` over the same memory, or None when a copy is needed (NumPy's rule)."""
    if is_contiguous(shape, strides) or 0 in shape:  # an empty array: any layout is a view
        return tuple(contiguous_strides(tuple(new)))
    old = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    out: list[int] = []
    i = 0
    for n in new:
        if n == 1:
            out.append(0)
            continue
        if i >= len(old):
            return None
        # Take old dims until their product reaches n; they must be contiguous to merge.
        prod, j = old[i][0], i
        while prod < n and j + 1 < len(old):
            if old[j][1] != old[j + 1][1] * old[j + 1][0]:
                return None
            j += 1
            prod *= old[j][0]
        if prod == n:
            out.append(old[j][1])
            i = j + 1
        elif prod > n and old[j][0] % (prod // n) == 0 and j == i:
            # Split one old dim into several new ones.
            sub = prod // n
            out.append(old[j][1] * sub)
            old[j] = (sub, old[j][1])
        else:
            return None
    return tuple(out) if i >= len(old) else None


def index_view(shape: Sequence[int], strides: Sequence[int], spec: Any,
               ) -> tuple[tuple[int, ...], Strides, int, list[tuple[int, int, int]]]:  # fmt: skip
    """Shape, strides and element offset of x[spec]; dynamic entries come back as
    (k, size, stride) for offsets read on the device."""
    out_shape: list[int] = []
    out_strides: list[int] = []
    offset = 0
    dyn: list[tuple[int, int, int]] = []
    dim = 0
    for e in spec:
        if e[0] == "new":
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, st = shape[dim], strides[dim]
        if e[0] == "slice":
            start, stop, step = e[1], e[2], e[3]
            n = len(range(start, stop, step))
            out_shape.append(n)
            out_strides.append(st * step)
            if n:
                offset += start * st
        elif e[0] == "int":
            offset += e[1] * st
        elif e[0] == "dslice":  # the dim stays; its start is one of size - length + 1
            out_shape.append(e[2])
            out_strides.append(st)
            dyn.append((e[1], dslice_starts(size, e[2]), st))
        else:
            dyn.append((e[1], size, st))
        dim += 1
    return tuple(out_shape), tuple(out_strides), offset, dyn
