"""The precision each dtype computes in, like the GPU kernels do.

The rule is the IR's (constant folding rounds by it too); this backend's kernels take it
from here.
"""

from __future__ import annotations

from pygpukit.ir.evaluate import compute_dtype, down, up

__all__ = ["compute_dtype", "down", "up"]
