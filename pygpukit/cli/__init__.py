"""The `pygpukit` command line.

Each subcommand is a module here with `add_parser(subparsers)` that registers itself
and sets `func` to its entry point. The list below is the whole command set.
Errors end as one line on stderr and a non-zero exit code (--debug: the traceback too).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pygpukit import __version__

from .console import debug_requested, log_level, logging_to_stderr, run_command

SUBCOMMANDS = ["demo", "info", "cache", "graph", "generate", "serve", "chat", "launch"]


def _add_common(parser: argparse.ArgumentParser, top: bool) -> None:
    """-v/-q/--debug on every parser, so they may come before or after the subcommand.
    Below the top they default to SUPPRESS: a subcommand must not reset what was given
    before it."""
    suppress = argparse.SUPPRESS
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else suppress,
        help="more log output: progress and timings (-vv: debug records)",
    )
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if top else suppress,
        help="errors only: no warnings, no progress line",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=False if top else suppress,
        help="print the traceback of an error (also PYGPUKIT_DEBUG=1)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_common(child, top=False)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the top-level options and every subcommand's parser."""
    parser = argparse.ArgumentParser(prog="pygpukit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pygpukit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"pygpukit.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"pygpukit.cli.{name}":
                raise
            continue
        module.add_parser(sub)
    _add_common(parser, top=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `pygpukit ARGV...`; returns the exit code (argparse's own errors exit with 2)."""
    args = build_parser().parse_args(argv)
    with logging_to_stderr(log_level(args.verbose or 0, args.quiet)):
        return run_command(args.func, args, debug_requested(args.debug),
                           getattr(args, "error_status", 1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
