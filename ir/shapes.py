"""Shape rules (NumPy semantics). Each returns a shape or raises ShapeRuleError."""

from __future__ import annotations

import math
from collections.abc import Sequence

Shape = tuple[int, ...]


class ShapeRuleError(ValueError):
    pass


class AxisRuleError(ShapeRuleError):
    pass


def broadcast_shapes(*shapes: Shape) -> Shape:
    ndim = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeRuleError(
                "shapes " + ", ".join(str(tuple(s)) for s in shapes) + " cannot be broadcast"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def normalize_axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise AxisRuleError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise AxisRuleError(f"axis {axis} is out of bounds for an array of dimension {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise AxisRuleError(f"repeated axis in {axis!r}")
    return tuple(sorted(out))


def reduce_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def reshape_shape(shape: Shape, new: Sequence[int]) -> Shape:
    size = math.prod(shape)
    new = tuple(int(d) for d in new)
    if new.count(-1) > 1:
        raise ShapeRuleError(f"can only specify one unknown dimension in {new}")
    if any(d < -1 for d in new):
        raise ShapeRuleError(f"negative dimension in {new}")
    if -1 in new:
        known = math.prod(d for d in new if d != -1)
        if known == 0 or size % known:
            raise ShapeRuleError(f"cannot reshape array of shape {shape} into {new}")
        new = tuple(size // known if d == -1 else d for d in new)
    if math.prod(new) != size:
        raise ShapeRuleError(f"cannot reshape array of size {size} {shape} into shape {new}")
    return new


def permute_shape(shape: Shape, perm: Sequence[int]) -> Shape:
    if sorted(perm) != list(range(len(shape))):
        raise AxisRuleError(f"axes {tuple(perm)} are not a permutation of {len(shape)} dims")
    return tuple(shape[p] for p in perm)


def expand_shape(shape: Shape, target: Shape) -> Shape:
    if len(target) < len(shape):
        raise ShapeRuleError(f"cannot broadcast {shape} to fewer dims {target}")
    for s, t in zip(reversed(shape), reversed(target), strict=False):
        if s != t and s != 1:
            raise ShapeRuleError(f"cannot broadcast shape {shape} to {target}")
    return tuple(target)


def matmul_shape(a: Shape, b: Shape) -> Shape:
    if len(a) == 0 or len(b) == 0:
        raise ShapeRuleError("matmul does not take 0-d operands")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeRuleError(f"matmul: inner dimensions differ: {a} @ {b} ({a2[-1]} != {b2[-2]})")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def concat_shape(shapes: Sequence[Shape], axis: int) -> Shape:
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or any(
            x != y for i, (x, y) in enumerate(zip(s, first, strict=True)) if i != axis
        ):
            raise ShapeRuleError(
                "all input shapes must match except on axis "
                f"{axis}: " + ", ".join(str(tuple(x)) for x in shapes)
            )
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1 :]


def contiguous_strides(shape: Shape) -> Shape:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))
