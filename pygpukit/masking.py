"""Boolean-mask indexing: `a[mask]` and `a[mask] = v`, as NumPy's.

The mask is a bool array of a's shape or of a leading part of it. Reading selects the
elements (rows) where it is True into a new array whose length depends on the data: the
count of True elements is computed on the device and read back (a sync, as in CuPy), then
their positions are found on the device (the `flatnonzero` op) and gathered (`take`); the
data never goes to the host. Writing a scalar, or a value that broadcasts over the selected
rows, is `where(mask, v, a)` with no sync, so it works inside @gpk.compile; a value with one
row per selected element gathers its rows by each element's rank among the selected ones
(the `mask_rank` op) after checking the count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit import errors, runtime

from .array import GPUArray, _assign, _check_writable, _store_value, take


def mask_of(index: Any) -> GPUArray | None:
    """The bool mask an index is (a bool GPUArray, NumPy array or list, alone or as a
    1-tuple), or None when the index is no mask."""
    if isinstance(index, tuple):
        if len(index) != 1:
            if any(_is_mask(i) for i in index):
                raise errors.user_error(errors.IndexError_, "index", "a boolean mask with "
                                        "other indices is not supported; index with the mask "
                                        "alone")  # fmt: skip
            return None
        index = index[0]
    if not _is_mask(index):
        return None
    if isinstance(index, GPUArray):
        return index
    from .creation import asarray

    return asarray(np.asarray(index, dtype=np.bool_))


def _is_mask(i: Any) -> bool:
    if isinstance(i, GPUArray):
        return i.dtype.kind == "b"
    if isinstance(i, np.ndarray):
        return i.dtype == np.bool_
    if isinstance(i, list) and i:
        return np.asarray(i).dtype == np.bool_
    return False


def _check(op: str, x: GPUArray, m: GPUArray) -> None:
    if m.ndim == 0:
        raise errors.user_error(errors.IndexError_, op, "a 0-d boolean index is not "
                                "supported")  # fmt: skip
    if m.ndim > x.ndim:
        raise errors.user_error(errors.IndexError_, op, f"too many indices for array: array "
                                f"is {x.ndim}-dimensional, but {m.ndim} were indexed")  # fmt: skip
    for axis, (n, k) in enumerate(zip(x.shape, m.shape, strict=False)):
        if n != k:
            raise errors.user_error(errors.IndexError_, op, f"boolean index did not match "
                                    f"indexed array along axis {axis}; size of axis is {n} "
                                    f"but size of corresponding boolean axis is {k}")  # fmt: skip


def _not_traced(op: str, what: str) -> None:
    from threading import get_ident

    from .compile.trace import TRACING

    if get_ident() in TRACING:
        raise errors.user_error(errors.TraceError, op, f"{what} depends on how many mask "
                                "elements are True, which tracing cannot know; inside "
                                "@gpk.compile use gpk.where(mask, a, fill) (same shape) or "
                                "call it outside the compiled function")  # fmt: skip


def _count(m: GPUArray) -> int:
    """The number of True elements, read from the device (the mask is realised with it, so
    the positions are found in the same values)."""
    total = m.sum()
    runtime.realize([m._node, total._node])
    return int(total.item())


def _flat(m: GPUArray) -> GPUArray:
    return m.reshape(-1)


def select(x: GPUArray, m: GPUArray) -> GPUArray:
    """x[m]: the selected elements (rows), in C order, as a new array."""
    _check("index", x, m)
    _not_traced("index", "a[mask]'s shape")
    n = _count(m)
    rest = x.shape[m.ndim :]
    flat = x.reshape((math.prod(m.shape),) + rest)
    pos = GPUArray(runtime.record("flatnonzero", (_flat(m)._node,), {"count": n}))
    return take(flat, pos, axis=0)


def assign(x: GPUArray, m: GPUArray, value: Any) -> None:
    """x[m] = value: a scalar, a value broadcasting over the selected rows, or one row per
    selected element."""
    _check("setitem", x, m)
    _check_writable(x)
    rest = x.shape[m.ndim :]
    keep = m.reshape(m.shape + (1,) * len(rest))  # broadcasts against x
    if isinstance(value, GPUArray | np.ndarray | list | tuple):
        from .creation import asarray

        v = value if isinstance(value, GPUArray) else asarray(np.asarray(value))
        if v.ndim == len(rest) + 1 and v.shape[0] == 1:
            v = v.reshape(v.shape[1:])  # one row for every selected element
        if v.ndim > len(rest):
            rows = _per_element_rows(x, m, v, rest)
            if rows is None:
                return  # nothing selected, nothing given
            v = rows
        elif not _broadcasts(v.shape, rest):
            raise errors.user_error(errors.ShapeError, "setitem", f"could not broadcast input "
                                    f"array from shape {v.shape} into the selected elements' "
                                    f"shape (n, {', '.join(map(str, rest))})")  # fmt: skip
        node = _store_value(v, x)
    else:
        node = _store_value(value, x)
    new = runtime.record("where", (keep._node, node, x._node))
    if new.dtype != x.dtype:
        new = runtime.record("cast", (new,), {"dtype": x.dtype.name})
    _assign(x, new)


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], to[::-1], strict=False))


def _per_element_rows(x: GPUArray, m: GPUArray, v: GPUArray,
                      rest: tuple[int, ...]) -> GPUArray | None:  # fmt: skip
    """v of shape [count, *rest] spread over x's shape: row k goes where the k-th True
    element is (None when nothing is selected)."""
    _not_traced("setitem", "assigning one value per selected element")
    n = _count(m)
    if v.ndim != len(rest) + 1 or v.shape[0] != n or not _broadcasts(v.shape[1:], rest):
        raise errors.user_error(errors.ShapeError, "setitem", f"NumPy boolean array indexing "
                                f"assignment cannot assign an array of shape {v.shape} to the "
                                f"{n} selected elements of shape {rest}")  # fmt: skip
    if n == 0:
        return None
    from .ops import minimum

    rank = GPUArray(runtime.record("mask_rank", (_flat(m)._node,)))
    rows = take(v, minimum(rank, n - 1), axis=0)  # unselected elements clipped into range
    return rows.reshape(m.shape + rows.shape[1:])
