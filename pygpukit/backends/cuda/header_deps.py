"""The headers a CUDA source includes from its own include directories, for the cache key.

NVRTC reads included files itself, so a key made of the source text and the options would
stay the same when an included header changes, and the kernel cache would serve the CUBIN
built from the old header. The digests listed here are hashed into the key.

Only the directories the caller names are searched (the source's directory for quoted
includes, then each -I / --include-path option), recursively through the headers found.
Toolkit headers come from the toolchain's include directories, which the key already names
along with the NVRTC version. An #include inside a disabled #if still counts: a header hashed
needlessly only makes the key change more often, never serve a stale kernel.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)


def option_include_dirs(options: Sequence[str]) -> list[str]:
    """The include directories NVRTC options name (-I<dir>, -I <dir>, --include-path=<dir>)."""
    dirs: list[str] = []
    pending = False
    for opt in options:
        if pending:
            dirs.append(opt)
            pending = False
        elif opt in ("-I", "--include-path"):
            pending = True
        elif opt.startswith("--include-path="):
            dirs.append(opt.split("=", 1)[1])
        elif opt.startswith("-I"):
            dirs.append(opt[2:])
    return dirs


def _resolve(name: str, quoted: bool, here: Path, dirs: list[Path]) -> Path | None:
    for d in ([here] if quoted else []) + dirs:
        path = d / name
        if path.is_file():
            return path
    return None


def header_dependencies(source: str, options: Sequence[str], name: str = "kernel.cu") -> list[str]:
    """'<path> <sha256>' of each header `source` includes from its directories, in include order.

    `name` is the source's file name as NVRTC gets it; its directory is searched first for
    quoted includes, as NVRTC does.
    """
    dirs = [Path(d) for d in option_include_dirs(options)]
    out: list[str] = []
    seen: set[str] = set()

    def visit(text: bytes, here: Path) -> None:
        for m in _INCLUDE.finditer(text):
            include = m.group(2).decode("utf-8", "surrogateescape").strip()
            path = _resolve(include, m.group(1) == b'"', here, dirs)
            if path is None:
                continue
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                data = path.read_bytes()
            except OSError:
                continue  # NVRTC cannot read it either and reports the error itself
            out.append(f"{path} {hashlib.sha256(data).hexdigest()}")
            visit(data, path.parent)

    visit(source.encode("utf-8", "surrogateescape"), Path(os.path.dirname(name) or "."))
    return out


__all__ = ["header_dependencies", "option_include_dirs"]
