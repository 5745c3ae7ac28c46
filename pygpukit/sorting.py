"""sort, argsort and topk: the IR's sort op along one axis.

Every sort is stable (equal values keep their index order), whatever `kind` asks: a
quicksort or heapsort gives the same values, and the indices of a stable sort are one of
the orders an unstable one may give. NaN sorts last, as in NumPy (first for topk's
largest, as torch.topk).
"""

from __future__ import annotations

import operator
from typing import Any

from pygpukit import errors
from pygpukit.ir import shapes, user_location

from . import runtime
from .array import ArrayLike, GPUArray, _ints, _operand

_KINDS = (None, "quicksort", "quick", "mergesort", "merge", "heapsort", "heap", "stable")


def _check_kind(op: str, kind: Any, order: Any, stable: Any) -> None:
    if kind not in _KINDS:
        raise errors.user_error(errors.GPUKitValueError, op, f"sort kind must be one of "
                                f"'quick', 'heap', or 'stable' (got {kind!r})")  # fmt: skip
    if kind is not None and stable is not None:
        raise errors.user_error(errors.GPUKitValueError, op, "`kind` and keyword parameters "
                                "can't be provided at the same time")  # fmt: skip
    if stable not in (None, True, False):
        raise errors.user_error(errors.DTypeError, op, f"stable must be a bool or None, got "
                                f"{stable!r}")  # fmt: skip
    if order is not None:
        raise errors.user_error(errors.GPUKitValueError, op, "order applies to structured "
                                "arrays only, which GPUArrays are not")  # fmt: skip


def _sort(op: str, x: ArrayLike, axis: int | None, attrs: dict[str, Any]) -> GPUArray:
    xa = x if isinstance(x, GPUArray) else _operand(x, op)
    if axis is None:
        xa, axis = xa.reshape(-1), 0
    (ax,) = _ints(op, (axis,))
    try:
        ax = shapes.normalize_axis(ax, xa.ndim)
        if xa.ndim == 0:
            raise shapes.AxisRuleError(f"axis {axis} is out of bounds for array of dimension 0")
    except shapes.AxisRuleError as e:
        raise errors.op_error(op, e, [(xa.shape, xa.dtype)], user_location()) from None
    return GPUArray(runtime.record("sort", (xa._node,), {"axis": ax, **attrs}, op))


def sort(x: ArrayLike, axis: int | None = -1, kind: str | None = None, order: Any = None,
         *, stable: bool | None = None) -> GPUArray:  # fmt: skip
    """A sorted copy of x along axis (None: of the flattened array), as np.sort: ascending,
    NaN last, stable. On CUDA one block sorts a row in shared memory: 16384 elements on an
    H100/H200 (8192 of 8-byte dtypes on an A100); a longer row raises
    gpk.errors.UnsupportedError (a NotImplementedError). The same holds for argsort and
    topk."""
    _check_kind("sort", kind, order, stable)
    return _sort("sort", x, axis, {"descending": False, "indices": False, "k": None})


def argsort(x: ArrayLike, axis: int | None = -1, kind: str | None = None, order: Any = None,
            *, stable: bool | None = None) -> GPUArray:  # fmt: skip
    """The int64 indices that sort x along axis (None: of the flattened array), as
    np.argsort(kind="stable"): ascending, NaN last, equal values in index order."""
    _check_kind("argsort", kind, order, stable)
    return _sort("argsort", x, axis, {"descending": False, "indices": True, "k": None})


def topk(x: ArrayLike, k: int, axis: int = -1, largest: bool = True) -> tuple[GPUArray, GPUArray]:
    """The k largest (largest=False: smallest) elements along axis and their int64 indices,
    as torch.topk: (values, indices), best first; equal values in index order, NaN counts
    as the largest. 0 <= k <= the axis's length."""
    try:
        kk = operator.index(k)
    except TypeError:
        raise errors.user_error(errors.DTypeError, "topk", f"k must be an int, got "
                                f"{k!r}") from None  # fmt: skip
    if axis is None:
        raise errors.user_error(errors.DTypeError, "topk", "axis must be an int, got None")
    attrs = {"descending": bool(largest), "k": kk}
    values = _sort("topk", x, axis, {**attrs, "indices": False})
    indices = _sort("topk", x, axis, {**attrs, "indices": True})
    return values, indices
