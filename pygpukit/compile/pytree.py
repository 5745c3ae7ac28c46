"""Pytrees of arguments and results: tuples, lists and dicts of arrays and static values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

STATIC = (int, float, bool, str, bytes, type(None), complex)

TreeDef = tuple[Any, ...]


def is_array(x: Any) -> bool:
    from pygpukit.array import GPUArray

    return isinstance(x, GPUArray | np.ndarray)


def flatten(x: Any, path: str, arrays: list[tuple[str, Any]],
            objects: list[tuple[str, Any]]) -> TreeDef:  # fmt: skip
    """The structure of x (hashable, static values inside); arrays and opaque objects are
    appended to `arrays` / `objects` with their paths (`arg 1[0]['k']`)."""
    if is_array(x):
        arrays.append((path, x))
        return ("*",)
    if isinstance(x, float):
        return ("=", "float", repr(x))  # 0.0 == -0.0 and nan != nan: key on the spelling
    if isinstance(x, STATIC):
        return ("=", type(x).__name__, x)
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return ("tuple",) + tuple(
            flatten(v, f"{path}[{i}]", arrays, objects) for i, v in enumerate(x)
        )
    if isinstance(x, list):
        return ("list",) + tuple(
            flatten(v, f"{path}[{i}]", arrays, objects) for i, v in enumerate(x)
        )
    if isinstance(x, dict):
        keys = tuple(x)
        return ("dict", keys) + tuple(
            flatten(x[k], f"{path}[{k!r}]", arrays, objects) for k in keys
        )
    objects.append((path, x))
    return ("obj", id(x))


def flatten_call(args: tuple[Any, ...], kwargs: dict[str, Any], arrays: list[tuple[str, Any]],
                 objects: list[tuple[str, Any]]) -> TreeDef:  # fmt: skip
    """The structure of a call's arguments; unflatten gives back (args, kwargs)."""
    a = ("tuple",) + tuple(flatten(v, f"arg {i}", arrays, objects) for i, v in enumerate(args))
    k = ("dict", tuple(kwargs)) + tuple(
        flatten(kwargs[n], f"kwarg {n}", arrays, objects) for n in kwargs
    )
    return ("tuple", a, k)


def unflatten(tree: TreeDef, leaves: Iterator[Any], objects: Iterator[Any]) -> Any:
    head = tree[0]
    if head == "*":
        return next(leaves)
    if head == "=":
        return float(tree[2]) if tree[1] == "float" else tree[2]
    if head == "tuple":
        return tuple(unflatten(t, leaves, objects) for t in tree[1:])
    if head == "list":
        return [unflatten(t, leaves, objects) for t in tree[1:]]
    if head == "dict":
        return {k: unflatten(t, leaves, objects) for k, t in zip(tree[1], tree[2:], strict=True)}
    return next(objects)


def describe(tree: TreeDef, path: str, out: dict[str, str]) -> None:
    """path -> what a cache key holds there, for miss reasons."""
    head = tree[0]
    if head == "=":
        out[path] = f"value {tree[2] if tree[1] == 'float' else repr(tree[2])}"
    elif head == "obj":
        out[path] = f"object id {tree[1]:#x}"
    elif head in ("tuple", "list"):
        out[path] = f"{head} of {len(tree) - 1}"
        for i, t in enumerate(tree[1:]):
            describe(t, f"{path}[{i}]", out)
    elif head == "dict":
        out[path] = f"dict with keys {list(tree[1])}"
        for k, t in zip(tree[1], tree[2:], strict=True):
            describe(t, f"{path}[{k!r}]", out)
