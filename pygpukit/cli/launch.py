"""`pygpukit launch -n N script.py [args]`: one process per GPU (pygpukit.distributed.launch)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch",
        help="run a script as N processes, one per GPU, with a communicator between them",
        description="Start N processes of `python script.py args...` with RANK, WORLD_SIZE, "
        "LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (as torchrun does); in the script, "
        "gpk.distributed.init() takes GPU LOCAL_RANK and joins the NCCL communicator.",
    )
    p.add_argument("-n", "--nproc", type=int, required=True, help="processes (GPUs)")
    p.add_argument("-m", "--module", action="store_true",
                   help="script is a module, run as `python -m script` (e.g. -m pygpukit "
                   "generate ... --tp N)")  # fmt: skip
    p.add_argument("script", help="the Python script (or with -m, module) each rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Launch and wait; the exit status is the first failed rank's."""
    from pygpukit.distributed.launch import launch

    return launch(args.nproc, args.script, args.args, module=args.module)
