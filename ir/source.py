"""Where a node came from in the user's code."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass

_INTERNAL: tuple[str, ...] = ()
# Modules of the package that are user-level programs written with the API: graph lines
# should point into them, not past them.
_USER_LEVEL = ("demo.py",)


def _internal_prefixes() -> tuple[str, ...]:
    global _INTERNAL
    if not _INTERNAL:
        import pygpukit

        ir_dir = os.path.dirname(os.path.abspath(__file__))
        pkg = os.path.dirname(os.path.abspath(pygpukit.__file__))
        passes_dir = os.path.dirname(
            os.path.abspath(importlib.import_module("pygpukit.passes").__file__ or "")
        )
        _INTERNAL = (ir_dir + os.sep, passes_dir + os.sep, os.path.join(pkg, "backends") + os.sep,
                     os.path.join(pkg, "compile") + os.sep, pkg + os.sep)  # fmt: skip
    return _INTERNAL


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    # Cached: this runs for every frame of every recorded op.
    if filename.startswith("<frozen"):
        return True
    prefixes = _internal_prefixes()
    if not filename.startswith(prefixes):
        return False
    pkg = prefixes[-1]
    if filename.startswith(pkg) and os.sep not in filename[len(pkg) :]:
        return os.path.basename(filename) not in _USER_LEVEL
    return any(filename.startswith(p) for p in prefixes[:-1])


@dataclass(frozen=True, slots=True)
class SourceLoc:
    file: str
    line: int
    func: str = ""

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def full(self) -> str:
        return f"{self.file}:{self.line}"


def user_location() -> SourceLoc | None:
    """The innermost stack frame outside PyGPUkit: the line the user wrote."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not _is_internal(fn):
            return SourceLoc(fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back  # type: ignore[assignment]
    return None
