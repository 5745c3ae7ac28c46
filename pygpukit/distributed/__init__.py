"""gpk.distributed: collectives across ranks, as ops in the graph.

    # pygpukit launch -n 2 script.py   (one process per GPU)
    import pygpukit as gpk
    gpk.distributed.init()                       # RANK, WORLD_SIZE, LOCAL_RANK from launch
    y = gpk.distributed.all_reduce(x)            # recorded, fused around, captured by compile

The four collectives are IR ops (all_reduce, all_gather, reduce_scatter, broadcast): the
passes never fuse across them, and inside @gpk.compile they are recorded into the CUDA
graph with the kernels (NCCL, on the step's stream). Without GPUs,
gpk.distributed.simulate(n, fn) runs fn as n ranks (threads) on the NumPy backend.
"""

from __future__ import annotations

import os

from pygpukit import runtime
from pygpukit.array import ArrayLike, GPUArray, _node_of
from pygpukit.errors import DistributedError, user_error

from .comm import Communicator, current, current_or_none, nccl_environment
from .rendezvous import exchange_unique_id
from .simulated import SimulatedCommunicator, simulate

__all__ = [
    "Communicator", "SimulatedCommunicator", "all_gather", "all_reduce", "broadcast",
    "destroy", "init", "is_initialized", "rank", "reduce_scatter", "simulate", "world_size",
]  # fmt: skip


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"init: ${name} must be an integer, got {raw!r}") from None


def init(rank: int | None = None, world_size: int | None = None) -> Communicator:
    """Set up this process's communicator and return it.

    rank and world_size default to $RANK and $WORLD_SIZE (set by `pygpukit launch` and
    torchrun), else 0 and 1. On the CUDA backend the process takes GPU $LOCAL_RANK (call
    init before the first array) and joins an NCCL communicator whose unique id rank 0
    hands out (pygpukit.distributed.rendezvous). On the NumPy backend only a world of one
    exists per process (simulated worlds: gpk.distributed.simulate)."""
    from .comm import bind_process

    if current_or_none() is not None:
        raise DistributedError("init: a communicator is already set up (destroy() it first)")
    nccl_environment()
    rank = _env_int("RANK", 0) if rank is None else rank
    world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
    assert rank is not None and world_size is not None
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedError(f"init: rank {rank} is not a rank of a world of {world_size}")
    from pygpukit.backends import active_backend_name, select_backend

    name = active_backend_name() or select_backend()[0]
    comm: Communicator
    if name == "cpu":
        if world_size != 1:
            raise DistributedError(
                f"init: a world of {world_size} processes needs one GPU each (the NumPy "
                f"backend simulates ranks in one process: gpk.distributed.simulate)"
            )
        from .simulated import _Meeting

        comm = SimulatedCommunicator(_Meeting(1), 0)
    else:
        local_rank = _env_int("LOCAL_RANK", None)
        _select_gpu(local_rank)
        from pygpukit.device import Device

        from .nccl import NcclCommunicator, new_unique_id

        uid = new_unique_id() if world_size == 1 else exchange_unique_id(rank, world_size,
                                                                         new_unique_id)  # fmt: skip
        device = None if local_rank is None else Device(local_rank)  # rank -> its GPU
        comm = NcclCommunicator(rank, world_size, uid, device)
    bind_process(comm)
    return comm


def _select_gpu(local_rank: int | None) -> None:
    """Make GPU local_rank current before the backend starts on it."""
    if local_rank is None:
        return
    from pygpukit import _native
    from pygpukit.backends import active_backend_name

    if active_backend_name() is not None:
        if _native.get_device() != local_rank:
            raise DistributedError(
                f"init: LOCAL_RANK {local_rank} asks for GPU {local_rank}, but arrays were "
                f"already made on GPU {_native.get_device()}: call gpk.distributed.init() "
                f"before the first array"
            )
        return
    _native.set_device(local_rank)


def destroy() -> None:
    """Close and drop the process's communicator (a no-op without one)."""
    from .comm import _process, bind_process

    comm = _process[0]
    bind_process(None)
    if comm is not None:
        comm.close()


def is_initialized() -> bool:
    """Whether a communicator serves this thread (init, or inside simulate)."""
    return current_or_none() is not None


def rank() -> int:
    """This rank's index in the world (0 without a communicator)."""
    comm = current_or_none()
    return 0 if comm is None else comm.rank


def world_size() -> int:
    """The number of ranks (1 without a communicator)."""
    comm = current_or_none()
    return 1 if comm is None else comm.world_size


def _record(op: str, x: ArrayLike, attrs: dict[str, object]) -> GPUArray:
    node = _node_of(x, None, op)
    attrs["world_size"] = current(f"gpk.distributed.{op}").world_size
    return GPUArray(runtime.record(op, (node,), attrs))


def _axis(op: str, x: ArrayLike, axis: int) -> int:
    ndim = len(_node_of(x, None, op).shape)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        from pygpukit.errors import AxisError

        raise user_error(AxisError, op, f"axis {axis!r} is out of bounds for an array of "
                         f"dimension {ndim}")  # fmt: skip
    return axis % ndim


def all_reduce(x: ArrayLike, op: str = "sum") -> GPUArray:
    """Every rank's x combined elementwise (op: sum, prod, max, min, avg), on every rank."""
    return _record("all_reduce", x, {"op": op})


def all_gather(x: ArrayLike, axis: int = 0) -> GPUArray:
    """Every rank's x concatenated along axis in rank order, on every rank."""
    return _record("all_gather", x, {"axis": _axis("all_gather", x, axis)})


def reduce_scatter(x: ArrayLike, op: str = "sum", axis: int = 0) -> GPUArray:
    """The ranks' x combined (as all_reduce), split along axis into world_size equal parts:
    rank r gets part r."""
    return _record("reduce_scatter", x, {"op": op, "axis": _axis("reduce_scatter", x, axis)})


def broadcast(x: ArrayLike, root: int = 0) -> GPUArray:
    """Rank root's x, on every rank (the others' x gives only the shape and dtype)."""
    return _record("broadcast", x, {"root": root})
