"""`pygpukit info`: the device, driver, NVRTC, cuBLASLt and the backend that would be chosen."""

from __future__ import annotations

import argparse

from pygpukit.backends import select_backend
from pygpukit.errors import GPUKitError, SettingError


def _line(label: str, value: object) -> None:
    print(f"{label:<18} {value}")


def _device_lines() -> None:
    from pygpukit import _native

    reason = _native.driver_unavailable_reason()
    if reason:
        _line("device", f"none ({reason})")
        return
    _line("driver", _format_cuda_version(_native.driver_version()))
    for ordinal in range(_native.device_count()):
        info = _native.device_info(ordinal)
        major, minor = info["compute_capability"]
        _line(f"device {ordinal}", info["name"])
        _line("  SM", f"sm_{major}{minor} ({info['sm_count']} SMs)")
        _line("  memory", f"{info['total_memory'] / 2**30:.1f} GiB")


def _format_cuda_version(v: int) -> str:
    return f"CUDA {v // 1000}.{(v % 1000) // 10}"


def run(args: argparse.Namespace) -> int:
    from pygpukit.backends.cuda import toolchain

    _device_lines()
    try:
        path = toolchain.load_nvrtc()
        major, minor = toolchain.nvrtc_version()
        _line("NVRTC", f"{major}.{minor} ({path})")
    except GPUKitError as e:
        _line("NVRTC", f"not found ({str(e).splitlines()[0]})")
    _line("CUDA headers", ", ".join(toolchain.include_dirs()) or "not found")
    _line("cuBLASLt", toolchain.cublaslt_path() or "not found")
    try:
        backend, why = select_backend()
    except SettingError as e:
        _line("backend", f"invalid ({e})")
        return 1
    note = f" (but CUDA is unusable: {why})" if backend == "cuda" and why else ""
    _line("backend", backend + note)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("info", help="show the GPU, driver, NVRTC and chosen backend")
    p.set_defaults(func=run)
