"""Where a node came from in the user's code."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

# Library code whose frames user_location() steps past. The IR knows only its own
# directory; the layers above register theirs (register_library), since the IR imports
# nothing above it.
_TREES: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
# Directories whose files, but not their subdirectories, are library code.
_FLAT: tuple[str, ...] = ()
# File names in _FLAT directories that are user-level programs written with the API:
# graph lines should point into them, not past them.
_USER_LEVEL: frozenset[str] = frozenset()


def register_library(trees: Iterable[str] = (), flat: Iterable[str] = (),
                     user_level: Iterable[str] = ()) -> None:  # fmt: skip
    """Mark code as library code, which user_location() steps past: every file under
    `trees`; the files directly in `flat` (not in its subdirectories) except those named in
    `user_level`."""
    global _TREES, _FLAT, _USER_LEVEL
    _TREES += tuple(os.path.abspath(d) + os.sep for d in trees)
    _FLAT += tuple(os.path.abspath(d) + os.sep for d in flat)
    _USER_LEVEL |= frozenset(user_level)
    _is_internal.cache_clear()


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    # Cached: this runs for every frame of every recorded op.
    if filename.startswith("<frozen") or filename.startswith(_TREES):
        return True
    for d in _FLAT:
        if filename.startswith(d) and os.sep not in filename[len(d) :]:
            return os.path.basename(filename) not in _USER_LEVEL
    return False


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
