"""Where a node came from in the user's code."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import CodeType

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
    _INTERNAL.clear()
    LIBRARY_GENERATION[0] += 1


# filename -> whether it is library code. A plain dict read inline by user_frame(): the
# walk runs for every frame of every recorded op, and a dict lookup on the (hash-cached)
# filename string is the cheapest test there is. The recording fast paths read it too
# (LIBRARY_FILES), for the frame they expect to be the user's, and call user_frame() only
# when it is not known to be.
_INTERNAL: dict[str, bool] = {}
LIBRARY_FILES = _INTERNAL  # one dict: register_library clears it in place
# Bumped by every register_library: what was learnt from LIBRARY_FILES before (the native
# record's call sites found to be the user's, rust/pygpukit-py/src/frames.rs) holds while
# it is unchanged, since between registrations a file's entry, once made, never changes.
LIBRARY_GENERATION = [0]


def _is_internal(filename: str) -> bool:
    known = _INTERNAL.get(filename)
    if known is None:
        known = _INTERNAL[filename] = _classify(filename)
    return known


def _classify(filename: str) -> bool:
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


# A captured location not yet made into a SourceLoc: the code object and the offset of the
# instruction the user's frame was at (f_lasti), cheap to take at every recorded op. Its line
# is found only when something prints it: f_lineno scans the code's line table on every
# read, which was 3% of recording a node.
Frame = tuple[CodeType, int]
Where = SourceLoc | Frame | None


def user_frame(skip: int = 0) -> Frame | None:
    """The innermost stack frame outside PyGPUkit as (code, offset): what recording keeps;
    resolve() turns it into a SourceLoc when an error, a dump or a profile needs one.
    skip: frames above the caller's known to be the library's (not looked at)."""
    f = sys._getframe(1 + skip)
    known = _INTERNAL
    while f is not None:
        code = f.f_code
        internal = known.get(code.co_filename)
        if internal is None:
            internal = _is_internal(code.co_filename)
        if not internal:
            return (code, f.f_lasti)
        f = f.f_back  # type: ignore[assignment]
    return None


def resolve(where: Where) -> SourceLoc | None:
    """The SourceLoc of a captured location (a SourceLoc or None as it is)."""
    if where is None or type(where) is SourceLoc:
        return where
    code, offset = where  # type: ignore[misc]
    return SourceLoc(code.co_filename, line_at(code, offset), code.co_name)


def line_at(code: CodeType, offset: int) -> int:
    """The source line of the instruction at byte offset `offset` of code (what the frame's
    f_lineno reads at that f_lasti); the first line for an instruction without one."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return code.co_firstlineno if line is None else line
    return code.co_firstlineno


def user_location() -> SourceLoc | None:
    """The innermost stack frame outside PyGPUkit: the line the user wrote."""
    return resolve(user_frame())
