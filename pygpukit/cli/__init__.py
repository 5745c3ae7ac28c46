"""The `pygpukit` command line.

Each subcommand is a module here with `add_parser(subparsers)` that registers itself
and sets `func` to its entry point. The list below is the whole command set.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ["demo", "info", "cache", "graph", "generate"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pygpukit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"pygpukit.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"pygpukit.cli.{name}":
                raise
            continue
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
