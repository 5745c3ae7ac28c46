"""Where a node came from in the user's code."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

_PKG_DIRS: tuple[str, ...] = ()


def _package_dirs() -> tuple[str, ...]:
    global _PKG_DIRS
    if not _PKG_DIRS:
        here = os.path.dirname(os.path.abspath(__file__))
        import pygpukit

        pkg = os.path.dirname(os.path.abspath(pygpukit.__file__))
        _PKG_DIRS = tuple({here + os.sep, pkg + os.sep})
    return _PKG_DIRS


@dataclass(frozen=True)
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
    dirs = _package_dirs()
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(dirs) and not fn.startswith("<frozen"):
            return SourceLoc(fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back  # type: ignore[assignment]
    return None
