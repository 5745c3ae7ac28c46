"""Finding persistent arrays a function reads without taking them as arguments.

Closures, the globals its code names, bound `self` and opaque object arguments are
walked (depth-limited) for GPUArrays; each found array is referenced by the compiled
graph, and its identity is part of the cache key.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

_SKIP = (int, float, bool, str, bytes, type(None), complex, np.ndarray, np.generic,
         types.ModuleType, type, types.BuiltinFunctionType)  # fmt: skip
_MAX_DEPTH = 8


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def scan(fn: Any, objects: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """[(path, GPUArray)] reachable from fn and the opaque argument objects."""
    from pygpukit.array import GPUArray

    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def visit(obj: Any, path: str, depth: int) -> None:
        if depth > _MAX_DEPTH or isinstance(obj, _SKIP) or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, GPUArray):
            found.append((path, obj))
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                visit(v, f"{path}[{i}]", depth + 1)
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                visit(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(obj, types.FunctionType):
            visit_function(obj, depth + 1)
        elif isinstance(obj, types.MethodType):
            visit(obj.__self__, "self", depth + 1)
            visit(obj.__func__, path, depth + 1)
        elif hasattr(obj, "__wrapped_fn__"):
            visit(obj.__wrapped_fn__, path, depth + 1)
        elif hasattr(obj, "__dict__"):
            for k, v in list(vars(obj).items()):
                visit(v, f"{path}.{k}", depth + 1)

    def visit_function(f: types.FunctionType, depth: int) -> None:
        if f.__module__ and f.__module__.startswith("pygpukit"):
            return
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True):
            try:
                visit(cell.cell_contents, name, depth)
            except ValueError:  # an empty cell
                pass
        g = f.__globals__
        for name in sorted(_code_names(f.__code__)):
            if name in g:
                visit(g[name], name, depth)

    visit(fn, getattr(fn, "__name__", "fn"), 0)
    for path, obj in objects:
        visit(obj, path, 1)
    return found
