"""`pygpukit cache ls|clear`: the on-disk cache of compiled kernels (`ls --json`: as JSON)."""

from __future__ import annotations

import argparse
import datetime
import json


def _ls(args: argparse.Namespace) -> int:
    from pygpukit import _native
    from pygpukit.backends.cuda.toolchain import configure_kernel_cache

    configure_kernel_cache()
    entries = _native.kernel_cache_list()
    total = sum(size for _, size, _ in entries)
    limit = _native.kernel_cache_max_bytes()
    if args.json:
        rows = [{"key": key, "bytes": size, "mtime": mtime} for key, size, mtime in entries]
        print(json.dumps({"dir": _native.kernel_cache_dir(), "entries": rows,
                          "total_bytes": total, "limit_bytes": limit}, indent=1))  # fmt: skip
        return 0
    print(f"cache dir: {_native.kernel_cache_dir()}")
    for key, size, mtime in entries:
        when = datetime.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{key}  {size:>10}  {when}")
    print(f"{len(entries)} entries, {total} bytes (limit {limit})")
    return 0


def _clear(args: argparse.Namespace) -> int:
    from pygpukit import _native
    from pygpukit.backends.cuda import dry_runs, lt_choices
    from pygpukit.backends.cuda.toolchain import configure_kernel_cache

    configure_kernel_cache()
    removed = _native.kernel_cache_clear()
    # The cuBLASLt choices and the dry-run marks kept beside the kernels go with them.
    dry_runs.forget()
    kept = " and the kept cuBLASLt choices" if lt_choices.forget() else ""
    print(f"removed {removed} entries{kept} from {_native.kernel_cache_dir()}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("cache", help="list or clear the compiled-kernel cache")
    sub = p.add_subparsers(dest="cache_command", required=True)
    ls = sub.add_parser("ls", help="list cached kernels, newest first")
    ls.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ls.set_defaults(func=_ls)
    sub.add_parser("clear", help="delete every cached kernel").set_defaults(func=_clear)
