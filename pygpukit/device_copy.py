"""Copying an array between devices (GPUArray.to, gpk.copy_to).

CUDA: peer to peer (cuMemcpyPeerAsync after cuCtxEnablePeerAccess) when the driver says
the target can reach the source (cuDeviceCanAccessPeer), else through host memory. The
CPU backend's simulated devices are host memory each with its own pool: a host copy.
"""

from __future__ import annotations

from typing import Any

from . import runtime
from .backends import devices


def copy_between(x: Any, source: int, target: int) -> Any:
    """A new array on device `target` holding x's value (x is on `source`)."""
    from .array import GPUArray

    value = x._live_value("to")
    src_backend = devices.backend_for(source)
    if src_backend.name == "cuda" and _peer_ok(target, source):
        with devices.using(source):
            value = _contiguous(src_backend, value)
            src_backend.synchronize()  # the source's queued writes land before the copy
        with devices.using(target):
            dst = devices.backend_for(target).empty(x.shape, x.dtype)  # type: ignore[attr-defined]
            from pygpukit import _native

            nbytes = x.size * x.dtype.itemsize
            # Synchronous: the source block may be reused as soon as this returns.
            _native.memcpy_peer(dst.ptr, target, value.ptr, source, nbytes, None, True)
            return GPUArray(runtime.leaf(dst, x.shape, x.dtype))
    with devices.using(source):
        host = src_backend.to_numpy(value)
    with devices.using(target):
        dst = devices.backend_for(target).from_numpy(host)
        return GPUArray(runtime.leaf(dst, x.shape, x.dtype))


_peer_enabled: dict[tuple[int, int], bool] = {}


def _peer_ok(target: int, source: int) -> bool:
    """Whether `target` can reach `source`'s memory directly; access is enabled on the
    first ask (once per pair)."""
    key = (target, source)
    ok = _peer_enabled.get(key)
    if ok is None:
        from pygpukit import _native

        ok = bool(_native.device_can_access_peer(target, source))
        if ok:
            _native.enable_peer_access(target, source)
        _peer_enabled[key] = ok
    return ok


def peer_path(target: int, source: int) -> str:
    """'peer' or 'host': how a copy from `source` to `target` goes (CPU backend: 'host')."""
    if devices.kind() != "cuda":
        return "host"
    return "peer" if _peer_ok(target, source) else "host"


def _contiguous(backend: Any, value: Any) -> Any:
    from .backends.cuda.layout import is_contiguous

    if is_contiguous(value.shape, value.strides):
        return value
    return backend._copy_contiguous(value)
