"""Collectives on the CUDA backend: NCCL calls enqueued on the step's stream (so a compiled
function's collectives are captured into its CUDA graph with its kernels).

NCCL gathers and scatters whole rank-sized blocks of a flat buffer. A gather or scatter
along an inner axis goes through a scratch buffer with the ranks' blocks outermost: one
strided copy kernel rearranges it before a reduce-scatter or after an all-gather.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pygpukit.errors import DistributedError
from pygpukit.passes import Step

from . import ew
from .context import Context, contiguous
from .layout import is_contiguous
from .value import DeviceValue

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
COPY = ("in", 0)


def _communicator(step: Step) -> Any:
    """The NCCL communicator the step runs through, read at each run (init may change it)."""
    from pygpukit.distributed.comm import current
    from pygpukit.distributed.nccl import NcclCommunicator

    comm = current(step.op)
    if not isinstance(comm, NcclCommunicator):
        raise DistributedError(f"{step.op}: the CUDA backend runs collectives through NCCL "
                               f"(gpk.distributed.init()), not {type(comm).__name__}")  # fmt: skip
    if step.attrs["world_size"] != comm.world_size:
        raise DistributedError(f"{step.op} was recorded for a world of "
                               f"{step.attrs['world_size']} ranks, but runs in one of "
                               f"{comm.world_size}")  # fmt: skip
    return comm


def plan_collective(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Any:
    x = ins[0]
    op, attrs, shape, dtype = step.op, step.attrs, step.shape, step.dtype
    n = attrs["world_size"]
    ax = attrs.get("axis", 0)
    inner = op in ("all_gather", "reduce_scatter") and math.prod(x.shape[:ax]) > 1
    # The buffer NCCL sends: x itself when contiguous, else a contiguous copy; for an
    # inner-axis reduce-scatter, x with its rank blocks moved outermost.
    pack = None
    if op == "reduce_scatter" and inner:
        m = x.shape[ax] // n
        s = x.strides
        packed_shape = (n, *x.shape[:ax], m, *x.shape[ax + 1 :])
        view = x.view(packed_shape, (m * s[ax], *s[:ax], s[ax], *s[ax + 1 :]), x.offset)
        pack = (ew.make(ctx, COPY, [view], packed_shape, contiguous(packed_shape), dtype, 256,
                        tag=tag), packed_shape)  # fmt: skip
    elif not is_contiguous(x.shape, x.strides):
        pack = (ew.make(ctx, COPY, [x], x.shape, contiguous(x.shape), dtype, 256, tag=tag),
                x.shape)  # fmt: skip
    # An inner-axis all-gather lands in [n, *x.shape] and is copied into place.
    unpack = None
    if op == "all_gather" and inner:
        gathered = (n, *x.shape)
        cs = contiguous(gathered)
        placed = (*x.shape[:ax], n, x.shape[ax], *x.shape[ax + 1 :])
        view = x.view(placed, (*cs[1 : 1 + ax], cs[0], *cs[1 + ax :]), 0)
        unpack = (ew.make(ctx, COPY, [view], placed, contiguous(placed), dtype, 256, tag=tag),
                  gathered)  # fmt: skip
    count = x.size

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        comm = _communicator(step)
        src = v[0].ptr
        if pack is not None:
            launch, pshape = pack
            tmp = ctx.alloc(pshape, dtype, op)
            if count:
                launch(tmp.ptr, [v[0].ptr])
            src = tmp.ptr
        out = ctx.alloc_out(shape, dtype, op)
        if count:
            if unpack is None:
                comm.launch(op, attrs, src, out.ptr, count, dtype.name, ctx.stream)
            else:
                copy, gshape = unpack
                buf = ctx.alloc(gshape, dtype, op)
                comm.launch(op, attrs, src, buf.ptr, count, dtype.name, ctx.stream)
                copy(out.ptr, [buf.ptr])
        return out

    return run


PLANNERS = {op: plan_collective for op in COLLECTIVE_OPS}
