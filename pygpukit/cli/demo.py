"""`pygpukit demo`: run a transformer block lazily and eagerly and check it."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a small transformer block and check it against NumPy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pygpukit.demo import run_demo

    run_demo(seed=args.seed, repeats=args.repeats)
    return 0
