"""Finding what a function reads without taking it as an argument.

Closures, the globals its code names, bound `self` and opaque object arguments are
walked (depth-limited) for GPUArrays; each found array is referenced by the compiled
graph, and its identity is part of the cache key. The walk also collects (Values) every
Python scalar it passes (int, float, bool, str, bytes, complex, None, NumPy scalars) with
where it came from (`SCALE`, `coefs[1]`, `self.eps`): their values are part of the cache
key, since tracing may have read any of them (a constant in the graph, a loop count). Host
NumPy arrays are collected too: those the function names (a global or closure variable, an
attribute its code reads) are refused, and so are the others whose contents became a
constant of the graph (function._compile compares): an in-place change could not be seen
without comparing their contents on every call.

A scan can also record what it read (a Watch): every mutable container whose items it
walked (dicts, instance __dict__s, lists, closure cells) and the globals it looked up.
The walk is a function of those items alone, so while each container still holds the
same objects, a rescan would find the same arrays: a compiled function's hit compares the
identities of those items (one C-level pass) instead of walking the objects again.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

_SKIP = (int, float, bool, str, bytes, type(None), complex, np.ndarray, np.generic,
         types.ModuleType, type, types.BuiltinFunctionType)  # fmt: skip
_MAX_DEPTH = 8
SCALARS = (int, float, bool, str, bytes, type(None), complex, np.generic)


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


class Values:
    """The Python scalars and host NumPy arrays a scan passed, with their paths."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, Any]] = []
        self.host_arrays: list[tuple[str, np.ndarray]] = []  # named by the code: refused
        self.host_items: list[tuple[str, np.ndarray]] = []  # inside containers: compared
        # The class of every object walked and the code of every function, by path: with
        # the arrays' shapes and the scalars, what a trace shared across instances is
        # keyed on (CompiledFunction's share).
        self.kinds: list[tuple[str, Any]] = []

    def key(self) -> tuple[tuple[str, str], ...]:
        """The scalars for a cache key: by type and spelling (0.0 == -0.0, nan != nan)."""
        return tuple((p, f"{type(v).__name__} {v!r}") for p, v in self.scalars)


class Watch:
    """The containers and global names a scan read."""

    def __init__(self) -> None:
        self.containers: list[Any] = []  # dicts, lists, cells: gc.get_referents reads them
        self.globals: list[tuple[dict[str, Any], tuple[str, ...]]] = []


def scan(fn: Any, objects: list[tuple[str, Any]], watch: Watch | None = None,
         values: Values | None = None) -> list[tuple[str, Any]]:  # fmt: skip
    """[(path, GPUArray)] reachable from fn and the opaque argument objects; `watch`, if
    given, records the containers walked; `values`, the scalars and host arrays passed."""
    from pygpukit.array import GPUArray

    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    read = watch.containers if watch is not None else []
    scalars = values.scalars if values is not None else None
    kinds: list[tuple[str, Any]] = values.kinds if values is not None else []
    # (path, the attribute it is the value of, the array, whether a container's item)
    hosts: list[tuple[str, str | None, np.ndarray, bool]] = []
    names_read: set[str] = set()

    def visit(obj: Any, path: str, depth: int, attr: str | None = None,
              item: bool = False) -> None:  # fmt: skip
        if depth > _MAX_DEPTH:
            return
        if isinstance(obj, _SKIP):
            if scalars is not None:
                if isinstance(obj, SCALARS):
                    scalars.append((path, obj))  # a leaf: every path to it is kept
                elif isinstance(obj, np.ndarray):
                    hosts.append((path, attr, obj, item))
            return
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, GPUArray):
            found.append((path, obj))
        elif isinstance(obj, list | tuple):
            if isinstance(obj, list):
                read.append(obj)
            for i, v in enumerate(obj):
                visit(v, f"{path}[{i}]", depth + 1, item=True)
        elif isinstance(obj, dict):
            read.append(obj)
            for k, v in list(obj.items()):
                visit(v, f"{path}[{k!r}]", depth + 1, item=True)
        elif isinstance(obj, types.FunctionType):
            kinds.append((path, obj.__code__))
            visit_function(obj, depth + 1)
        elif isinstance(obj, types.MethodType):
            visit(obj.__self__, "self", depth + 1)
            visit(obj.__func__, path, depth + 1)
        elif hasattr(obj, "__wrapped_fn__"):
            visit(obj.__wrapped_fn__, path, depth + 1)
        elif hasattr(obj, "__dict__"):
            kinds.append((path, type(obj)))
            d = vars(obj)
            read.append(d)
            for k, v in list(d.items()):
                visit(v, f"{path}.{k}", depth + 1, k)

    def visit_function(f: types.FunctionType, depth: int) -> None:
        if f.__module__ and f.__module__.startswith("pygpukit"):
            return
        cells = f.__closure__ or ()
        read.extend(cells)
        for name, cell in zip(f.__code__.co_freevars, cells, strict=True):
            try:
                visit(cell.cell_contents, name, depth)
            except ValueError:  # an empty cell
                pass
        g = f.__globals__
        names = sorted(_code_names(f.__code__))
        names_read.update(names)
        if watch is not None:
            watch.globals.append((g, tuple(names)))
        for name in names:
            if name in g:
                visit(g[name], name, depth)

    visit(fn, getattr(fn, "__name__", "fn"), 0)
    for path, obj in objects:
        visit(obj, path, 1)
    if values is not None:
        for p, attr, a, item in hosts:
            named = not item and (attr is None or attr in names_read)
            (values.host_arrays if named else values.host_items).append((p, a))
    return found
