"""The backend's name for the stride rules, which live in pygpukit.ir.strides."""

from pygpukit.ir.strides import (
    Strides,
    broadcast_strides,
    collapse,
    index_view,
    is_contiguous,
    reshape_strides,
)

__all__ = [
    "Strides",
    "broadcast_strides",
    "collapse",
    "index_view",
    "is_contiguous",
    "reshape_strides",
]
