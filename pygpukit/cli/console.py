"""How the `pygpukit` command talks to the terminal: log records, error lines, exit codes.

Every error a command raises ends as one line on stderr, `pygpukit: error: ...`, and a
non-zero exit code; the traceback is printed only with `--debug` (or PYGPUKIT_DEBUG).
Library modules log to the `pygpukit` logger; while a command runs, a handler prints
those records on stderr, at the level -v / -q choose.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pygpukit import settings
from pygpukit.errors import GPUKitError, SettingError

LOGGER = "pygpukit"
# Exit codes: argparse already uses 2 for a bad command line, and a shell reports
# 128 + the signal for a program ended by SIGINT (Ctrl-C) or SIGPIPE.
USAGE_STATUS = 2
INTERRUPTED_STATUS = 130
BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE


class UsageError(GPUKitError, ValueError):
    """The command line names something that cannot be used: a missing file or function,
    an --arg that is not dtype[shape] nor a literal, an unknown pass."""


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is when the record comes (tests and callers swap it)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> object:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def log_level(verbose: int, quiet: bool) -> int:
    """-q: errors only; none: warnings; -v: progress and timings; -vv: everything."""
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


@contextmanager
def logging_to_stderr(level: int) -> Iterator[None]:
    """Print the `pygpukit` logger's records at `level` and above on stderr while the
    block runs; the logger is left as it was afterwards (main() may run many times in
    one process, as in the tests)."""
    logger = logging.getLogger(LOGGER)
    handler = _StderrHandler()
    fmt = "pygpukit: %(name)s: %(message)s" if level <= logging.DEBUG else "pygpukit: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def debug_requested(flag: bool) -> bool:
    """--debug, or PYGPUKIT_DEBUG set to anything but 0 (it also profiles each realize)."""
    try:
        return flag or settings.debug()
    except SettingError:
        return True  # a malformed PYGPUKIT_DEBUG still asks for detail


def one_line(e: BaseException) -> str:
    """The message of `e` on one line. A gpk error's `at FILE:LINE` line is kept (it names
    the user's line); other continuation lines (an NVRTC log) are left to --debug."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    kept = [lines[0]] + [ln for ln in lines[1:] if ln.startswith("at ")]
    dropped = len(lines) - len(kept)
    more = f" (+{dropped} more lines; --debug shows them)" if dropped else ""
    return " ".join(kept) + more


def error_line(e: BaseException) -> str:
    """`pygpukit: error: ...` for any exception a command let out."""
    if isinstance(e, UsageError):
        return f"pygpukit: error: {one_line(e)}"
    text = f"pygpukit: error: {type(e).__name__}: {one_line(e)}"
    if not isinstance(e, GPUKitError | OSError):
        text += " (run with --debug for the traceback)"
    return text


def run_command(
    func: Callable[[argparse.Namespace], int | None],
    args: argparse.Namespace,
    debug: bool,
    error_status: int = 1,
) -> int:
    """Run a subcommand; turn what it raises into one stderr line and an exit code:
    UsageError 2, Ctrl-C 130, a closed stdout pipe 141 (silently), anything else
    `error_status` (1; `graph diff` uses 2, as diff(1) keeps 1 for "they differ")."""
    try:
        status = int(func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        # `pygpukit ... | head`: the reader has gone; end quietly, as a tool killed by
        # SIGPIPE does, and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("pygpukit: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(error_line(e), file=sys.stderr)
        return USAGE_STATUS if isinstance(e, UsageError) else error_status
