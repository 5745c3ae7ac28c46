"""`pygpukit info`: the device, driver, NVRTC, cuBLASLt and the backend that would be chosen.

`--json` prints the same facts as one JSON object (absent things are null).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pygpukit.backends import select_backend
from pygpukit.errors import GPUKitError, SettingError


def _devices(facts: dict[str, Any]) -> None:
    from pygpukit import _native

    reason = _native.driver_unavailable_reason()
    facts["driver_unavailable"] = reason or None
    facts["driver"] = None if reason else _format_cuda_version(_native.driver_version())
    facts["devices"] = []
    for ordinal in range(0 if reason else _native.device_count()):
        info = _native.device_info(ordinal)
        major, minor = info["compute_capability"]
        facts["devices"].append({"ordinal": ordinal, "name": info["name"],
                                 "sm": f"sm_{major}{minor}", "sm_count": info["sm_count"],
                                 "total_memory": info["total_memory"]})  # fmt: skip


def _format_cuda_version(v: int) -> str:
    return f"CUDA {v // 1000}.{(v % 1000) // 10}"


def gather() -> dict[str, Any]:
    """What `info` shows, as a dict; `backend_error` is set when PYGPUKIT_BACKEND is bad."""
    from pygpukit.backends.cuda import toolchain

    facts: dict[str, Any] = {}
    _devices(facts)
    try:
        path = toolchain.load_nvrtc()
        major, minor = toolchain.nvrtc_version()
        facts["nvrtc"] = {"version": f"{major}.{minor}", "path": path}
    except GPUKitError as e:
        facts["nvrtc"] = None
        facts["nvrtc_error"] = str(e).splitlines()[0]
    # An NVRTC newer than the driver: a CUDA major newer than the driver's makes CUDA
    # unusable (the backend falls back and says why), a newer minor is only noted.
    fatal, said = toolchain.nvrtc_driver_check()
    facts["nvrtc_vs_driver"] = {"fatal": fatal, "message": said} if said else None
    facts["cuda_headers"] = list(toolchain.include_dirs())
    facts["cublaslt"] = toolchain.cublaslt_path() or None
    try:
        backend, why = select_backend()
    except SettingError as e:
        facts["backend"], facts["backend_error"] = None, str(e)
        return facts
    facts["backend"] = backend
    facts["cuda_unusable"] = why if backend == "cuda" and why else None
    return facts


def _text(facts: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, object]] = []
    if facts["driver_unavailable"]:
        rows.append(("device", f"none ({facts['driver_unavailable']})"))
    else:
        rows.append(("driver", facts["driver"]))
    for d in facts["devices"]:
        rows.append((f"device {d['ordinal']}", d["name"]))
        rows.append(("  SM", f"{d['sm']} ({d['sm_count']} SMs)"))
        rows.append(("  memory", f"{d['total_memory'] / 2**30:.1f} GiB"))
    nv = facts["nvrtc"]
    rows.append(("NVRTC", f"{nv['version']} ({nv['path']})" if nv
                 else f"not found ({facts['nvrtc_error']})"))  # fmt: skip
    if facts["nvrtc_vs_driver"]:
        rows.append(("  vs driver", facts["nvrtc_vs_driver"]["message"]))
    rows.append(("CUDA headers", ", ".join(facts["cuda_headers"]) or "not found"))
    rows.append(("cuBLASLt", facts["cublaslt"] or "not found"))
    if facts["backend"] is None:
        rows.append(("backend", f"invalid ({facts['backend_error']})"))
    else:
        why = facts["cuda_unusable"]
        rows.append(("backend", facts["backend"] + (f" (but CUDA is unusable: {why})"
                                                    if why else "")))  # fmt: skip
    return [f"{label:<18} {value}" for label, value in rows]


def run(args: argparse.Namespace) -> int:
    """Print the facts (a table, or JSON); 1 when the backend setting is invalid."""
    facts = gather()
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        print("\n".join(_text(facts)))
    return 1 if facts["backend"] is None else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("info", help="show the GPU, driver, NVRTC and chosen backend")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=run)
