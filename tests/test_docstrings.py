"""Every public callable has a docstring: the functions and classes `import pygpukit` exposes,
the public names of the documented submodules, and the public methods and properties of the
public classes (every GPUArray member included). The API is walked at run time, so a public
function added later without a docstring fails here; the API reference (docs/api/) renders
these docstrings."""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterator

import pygpukit as gpk

# The submodules whose public names the API reference documents.
MODULES = [
    "pygpukit.nn",
    "pygpukit.random",
    "pygpukit.llm",
    "pygpukit.scheduler",
    "pygpukit.quant",
    "pygpukit.errors",
    "pygpukit.settings",
    "pygpukit.compile",
    "pygpukit.jit",
    "pygpukit.streams",
]


def public_names(module: types.ModuleType) -> list[str]:
    """`__all__` where the module has one, else its names without a leading underscore
    (imports of other modules left out)."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    return sorted(names)


def members(cls: type) -> Iterator[tuple[str, object]]:
    """The public methods and properties a class defines itself or inherits from a class
    of this project (not those of builtins such as Exception or tuple)."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("pygpukit"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, property) or inspect.isfunction(value):
                yield name, value


def documented(value: object) -> bool:
    """Whether the object has its own docstring (a property: its getter's)."""
    if isinstance(value, property):
        value = value.fget
    doc = getattr(value, "__doc__", None)
    if inspect.isclass(value):
        doc = value.__dict__.get("__doc__")
    return bool(doc and doc.strip())


def public_api() -> Iterator[tuple[str, object]]:
    """(qualified name, object) of every public callable, with class members."""
    roots: list[tuple[str, object]] = []
    for name in sorted(n for n in dir(gpk) if not n.startswith("_")):
        value = getattr(gpk, name)
        if inspect.ismodule(value) or not callable(value):
            continue
        roots.append((f"pygpukit.{name}", value))
    for modname in MODULES:
        module = importlib.import_module(modname)
        for name in public_names(module):
            value = getattr(module, name)
            if inspect.ismodule(value) or not callable(value):
                continue
            roots.append((f"{modname}.{name}", value))
    seen: set[int] = set()
    for qualname, value in roots:
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield qualname, value
        if inspect.isclass(value) and value.__module__.startswith("pygpukit"):
            for member, attr in members(value):
                yield f"{qualname}.{member}", attr


def test_the_walk_finds_the_api() -> None:
    names = {q for q, _ in public_api()}
    # A sample of what must be walked: functions, a class, its methods and properties.
    for q in ["pygpukit.zeros", "pygpukit.GPUArray", "pygpukit.GPUArray.to_numpy",
              "pygpukit.GPUArray.shape", "pygpukit.nn.gelu", "pygpukit.llm.load",
              "pygpukit.Scheduler.submit", "pygpukit.compile"]:  # fmt: skip
        assert q in names, q
    assert len(names) > 150


def test_every_public_callable_has_a_docstring() -> None:
    missing = [q for q, v in public_api() if not documented(v)]
    assert not missing, f"{len(missing)} public callables without a docstring: {missing}"
