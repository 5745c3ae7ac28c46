"""Reading a model directory's files without trusting them.

A checkpoint is data from elsewhere: names in its index may point outside the directory,
a "file" may be a FIFO that blocks open() forever, and a JSON document may be deeply
nested, huge, or hold the same key twice. Everything here reads only regular files
inside the model directory (symlinks resolved first), opens them without blocking and
checks what was opened, and parses JSON with bounds on size and nesting and with
duplicate keys refused. Every failure is a LoadError naming the file and the field.
"""

from __future__ import annotations

import json
import os
import stat
from typing import IO, Any

import numpy as np

from pygpukit.errors import LoadError

MAX_JSON_BYTES = 64 << 20  # config.json, the shard index: far above any real one
MAX_JSON_DEPTH = 64  # real configs nest 3 deep, safetensors headers 3
_CHUNK = 1 << 22  # bytes the nesting scan takes at a time


def open_regular(path: str, field: str | None = None) -> IO[bytes]:
    """Open `path` for binary reading if it is a regular file (never blocks on a FIFO).

    The file is opened non-blocking and checked with fstat, so what is checked is what is
    read: a FIFO, device or directory swapped in after a check is refused all the same.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise LoadError(f"cannot open: {e.strerror or e}", file=path, field=field) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LoadError(f"not a regular file ({_kind(mode)})", file=path, field=field)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


class ModelDir:
    """A model directory: names inside it resolve to regular files that stay inside it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.given = os.fspath(path)
        if not os.path.isdir(self.given):
            raise LoadError("not a model directory", file=self.given)
        self.root = os.path.realpath(self.given)

    def has(self, name: str) -> bool:
        """Whether the directory has an entry `name` (a broken symlink counts: it is refused
        when read, not silently skipped)."""
        return os.path.lexists(os.path.join(self.root, name))

    def path(self, name: object, source: str | None = None, field: str | None = None) -> str:
        """The resolved path of `name`, refused unless it is a relative name whose target
        (symlinks followed) is inside the directory. `source`/`field`: where the name was
        read (the index and its weight_map entry), for the error."""
        where = {"file": source or os.path.join(self.given, str(name)), "field": field}
        if not isinstance(name, str) or not name or "\0" in name:
            raise LoadError(f"bad file name {name!r} (expected a file name)", **where)
        if os.path.isabs(name) or os.path.splitdrive(name)[0]:
            raise LoadError(
                f"{name!r} is an absolute path; files must be inside the model "
                f"directory {self.given}",
                **where,
            )
        real = os.path.realpath(os.path.join(self.root, name))
        if os.path.commonpath([self.root, real]) != self.root:
            raise LoadError(
                f"{name!r} resolves to {real}, outside the model directory {self.given}", **where
            )
        return real

    def open(self, name: str, source: str | None = None, field: str | None = None) -> IO[bytes]:
        """Open `name` (see path) if it is a regular file."""
        real = self.path(name, source, field)
        if not os.path.lexists(real):
            missing = "no such file" if source is None else f"names {name!r}, which does not exist"
            raise LoadError(missing, file=source or real, field=field)
        return open_regular(real, None if source else field)


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside strings, vectorised over chunks (a 100 MB
    header is scanned in well under a second, in bounded memory).

    A quote opens or closes a string unless an odd run of backslashes precedes it; a
    bracket counts where an even number of such quotes precede it.
    """
    data = np.frombuffer(raw, np.uint8)
    deepest = level = quotes = slashes = 0  # carried across chunks
    for start in range(0, len(data), _CHUNK):
        c = data[start : start + _CHUNK]
        pos = np.arange(len(c))
        # The index of the last non-backslash at or before each byte; a run carried in
        # from the previous chunk sits before index 0.
        last = np.maximum.accumulate(np.where(c != ord("\\"), pos, -1 - slashes))
        before = np.concatenate(([-1 - slashes], last[:-1]))
        real = (c == ord('"')) & ((pos - 1 - before) % 2 == 0)
        inside = (np.cumsum(real) + quotes) % 2 == 1
        opens = (c == ord("[")) | (c == ord("{"))
        closes = (c == ord("]")) | (c == ord("}"))
        step = np.where(inside, 0, opens.astype(np.int32) - closes)
        run = np.cumsum(step) + level
        deepest, level = max(deepest, int(run.max())), int(run[-1])
        quotes = int(inside[-1])
        slashes = len(c) - 1 - int(last[-1])
        if deepest > MAX_JSON_DEPTH:
            break
    return deepest


def parse_json(raw: bytes, path: str, what: str) -> Any:
    """Decode and parse one JSON document read from `path` (`what` names it in errors)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LoadError(f"{what} is not UTF-8 (byte {e.start}: {e.reason})", file=path) from None
    depth = _depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise LoadError(f"{what} nests {depth} levels deep (at most {MAX_JSON_DEPTH})", file=path)
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Duplicate as e:
        raise LoadError(f"{what} has the key {e.key!r} twice", file=path, field=e.key) from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise LoadError(f"{what} is not valid JSON ({e})", file=path) from None


def read_json(f: IO[bytes], path: str, what: str) -> Any:
    """Parse the JSON document in the open file `f` (at most MAX_JSON_BYTES)."""
    try:
        raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise LoadError(f"cannot read: {e.strerror or e}", file=path) from None
    if len(raw) > MAX_JSON_BYTES:
        raise LoadError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB", file=path)
    return parse_json(raw, path, what)


def load_json_file(path: str, what: str) -> Any:
    """read_json of the regular file at `path`."""
    with open_regular(path) as f:
        return read_json(f, path, what)
