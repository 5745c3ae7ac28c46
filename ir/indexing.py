"""NumPy basic indexing normalised into a static spec the IR can carry.

An index becomes one entry per resulting position:
  ("slice", start, stop, step)  keeps the dim
  ("int", i)                    drops the dim (static integer)
  ("dyn", k)                    drops the dim; the integer is dynamic input k (a 0-d array)
  ("dslice", k, length)         keeps the dim, `length` long from dynamic input k's value
  ("new",)                      inserts a dim of size 1 (None)
"""

from __future__ import annotations

from typing import Any

from .shapes import Shape, ShapeRuleError

IndexSpec = tuple[tuple[Any, ...], ...]


class IndexRuleError(IndexError):
    pass


class DynamicIndex:
    """Placeholder for a 0-d integer array in an index; `k` numbers the dynamic inputs."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


class DynamicSlice:
    """Placeholder for `length` elements from the value of dynamic input `k` (a 0-d array):
    a slice of static length whose start is read on the device."""

    __slots__ = ("k", "length")

    def __init__(self, k: int, length: int) -> None:
        self.k, self.length = k, length


def dslice_starts(size: int, length: int) -> int:
    """How many starts a dynamic slice of `length` has in a dim of `size` (0..size-length);
    a start is wrapped and checked against this count as a dynamic index against a size."""
    return size - length + 1


def normalize_index(shape: Shape, index: Any) -> tuple[IndexSpec, Shape]:
    """Spec and result shape of `x[index]` for x of `shape`."""
    if not isinstance(index, tuple):
        index = (index,)
    n_consuming = sum(1 for i in index if i is not None and i is not Ellipsis)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexRuleError("an index can only have a single ellipsis ('...')")
    if n_consuming > len(shape):
        raise IndexRuleError(
            f"too many indices for array: array is {len(shape)}-dimensional, "
            f"but {n_consuming} were indexed"
        )
    expanded: list[Any] = []
    for i in index:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - n_consuming))
        else:
            expanded.append(i)
    consumed = sum(1 for i in expanded if i is not None)
    expanded.extend([slice(None)] * (len(shape) - consumed))

    spec: list[tuple[Any, ...]] = []
    out: list[int] = []
    dim = 0
    for i in expanded:
        if i is None:
            spec.append(("new",))
            out.append(1)
            continue
        size = shape[dim]
        if isinstance(i, slice):
            if i.step == 0:  # NumPy's is a ValueError, not an IndexError
                raise ShapeRuleError("slice step cannot be zero")
            try:
                start, stop, step = i.indices(size)
            except TypeError:
                raise IndexRuleError(f"slice indices must be integers or None, got {i}") from None
            spec.append(("slice", start, stop, step))
            out.append(len(range(start, stop, step)))
        elif isinstance(i, DynamicIndex):
            spec.append(("dyn", i.k))
        elif isinstance(i, DynamicSlice):
            if not 0 <= i.length <= size:
                raise IndexRuleError(
                    f"a dynamic slice of length {i.length} does not fit axis {dim} with size {size}"
                )
            spec.append(("dslice", i.k, i.length))
            out.append(i.length)
        elif isinstance(i, int) and not isinstance(i, bool):
            if not -size <= i < size:
                raise IndexRuleError(f"index {i} is out of bounds for axis {dim} with size {size}")
            spec.append(("int", i % size))
        else:
            raise IndexRuleError(
                f"unsupported index {i!r} (ints, slices, None, ..., 0-d integer arrays "
                "and one integer array are supported)"
            )
        dim += 1
    return tuple(spec), tuple(out)


def region_shape(shape: Shape, spec: IndexSpec) -> Shape:
    """Shape of the region `x[spec]` selects, without inserted dims (for setitem)."""
    out = []
    for e in spec:
        if e[0] == "slice":
            out.append(len(range(e[1], e[2], e[3])))
        elif e[0] == "dslice":
            out.append(e[2])
    return tuple(out)


def check_spec(shape: Shape, spec: IndexSpec) -> Shape:
    dims = [e for e in spec if e[0] != "new"]
    if len(dims) != len(shape):
        raise ShapeRuleError(f"index spec {spec} does not fit shape {shape}")
    out = []
    for e, d in zip(spec, _sizes(shape, spec), strict=True):
        if e[0] == "new":
            out.append(1)
        elif e[0] == "slice":
            out.append(len(range(e[1], e[2], e[3])))
        elif e[0] == "dslice":
            if not 0 <= e[2] <= d:
                raise ShapeRuleError(f"a dynamic slice of length {e[2]} does not fit size {d}")
            out.append(e[2])
    return tuple(out)


def _sizes(shape: Shape, spec: IndexSpec) -> list[int]:
    """The input size each spec entry indexes (1 for an inserted dim)."""
    dims = iter(shape)
    return [1 if e[0] == "new" else next(dims) for e in spec]
