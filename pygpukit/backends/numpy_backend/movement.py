"""Views and data movement. Views stay views of the input (no copy), as on the GPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.indexing import dslice_starts


def index_tuple(spec: Any, dyn: list[int]) -> tuple[Any, ...]:
    out: list[Any] = []
    for e in spec:
        if e[0] == "slice":
            start, stop, step = e[1], e[2], e[3]
            if not len(range(start, stop, step)):
                out.append(slice(0, 0, 1))
            else:
                # slice.indices() yields -1 as the stop of a reversed run to index 0
                out.append(slice(start, None if stop < 0 else stop, step))
        elif e[0] == "int":
            out.append(e[1])
        elif e[0] == "dyn":
            out.append(dyn[e[1]])
        elif e[0] == "dslice":
            out.append(slice(dyn[e[1]], dyn[e[1]] + e[2]))
        else:
            out.append(None)
    return tuple(out)


def check_dynamic(spec: Any, shape: tuple[int, ...], dyn: list[int]) -> list[int]:
    """Dynamic indices wrap like NumPy's and must lie in range; a dynamic slice's start is
    an index into its size - length + 1 possible starts (as on the GPU)."""
    dims = [e for e in spec if e[0] != "new"]
    fixed = list(dyn)
    for d, e in zip(shape, dims, strict=True):
        if e[0] in ("dyn", "dslice"):
            v = dyn[e[1]]
            n = d if e[0] == "dyn" else dslice_starts(d, e[2])
            if not -n <= v < n:
                what = "index" if e[0] == "dyn" else f"dynamic slice start (length {e[2]})"
                raise IndexError(f"{what} {v} is out of bounds for axis with size {d}")
            fixed[e[1]] = v % n
    return fixed


def movement(op: str, ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    x = ins[0]
    if op == "reshape":
        return x.reshape(attrs["shape"])
    if op == "permute":
        return x.transpose(attrs["perm"])
    if op == "expand":
        return np.broadcast_to(x, attrs["shape"])
    if op == "index":
        dyn = check_dynamic(attrs["spec"], x.shape, [int(d) for d in ins[1:]])
        return x[index_tuple(attrs["spec"], dyn)]
    if op == "after":  # the caches sdpa_append or rope_kv_write wrote: as they now are
        return x
    if op == "concat":
        return np.concatenate([i.astype(dtype.np, copy=False) for i in ins], axis=attrs["axis"])
    raise KeyError(op)


def take(x: np.ndarray, idx: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    axis = attrs["axis"]
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].flat[0]
        raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {n}")
    return np.take(x, idx, axis=axis)


def setitem(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, v, *dyn_arrays = ins
    dyn = check_dynamic(attrs["spec"], x.shape, [int(d) for d in dyn_arrays])
    out = x.copy()
    with np.errstate(all="ignore"):
        out[index_tuple(attrs["spec"], dyn)] = v
    return out


def setitem_into(ins: list[np.ndarray], attrs: dict[str, Any]) -> None:
    """x[spec] = v in x's own memory (a compiled KV-cache update)."""
    x, v, *dyn_arrays = ins
    dyn = check_dynamic(attrs["spec"], x.shape, [int(d) for d in dyn_arrays])
    with np.errstate(all="ignore"):
        x[index_tuple(attrs["spec"], dyn)] = v


def flatnonzero(mask: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The positions of a 1-D mask's True elements; attrs["count"] of them, as the CUDA
    kernel writes (the count was read from this mask before the op was recorded)."""
    return np.flatnonzero(mask)[: attrs["count"]].astype(np.int64)


def mask_rank(mask: np.ndarray) -> np.ndarray:
    """How many True elements come before each element of a 1-D mask."""
    m = mask.astype(np.int64)
    return np.cumsum(m) - m
