"""Collectives on the NumPy backend: through the calling thread's simulated communicator."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.errors import DistributedError

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def collective(op: str, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """This rank's result of `op` over every rank's x (see distributed/simulated.py)."""
    from pygpukit.distributed.comm import current
    from pygpukit.distributed.simulated import SimulatedCommunicator

    comm = current(op)
    if not isinstance(comm, SimulatedCommunicator):
        raise DistributedError(f"{op}: the NumPy backend combines ranks through a simulated "
                               f"communicator, not {type(comm).__name__}")  # fmt: skip
    if attrs["world_size"] != comm.world_size:
        raise DistributedError(f"{op} was recorded for a world of {attrs['world_size']} "
                               f"ranks, but runs in one of {comm.world_size}")  # fmt: skip
    return comm.combine(op, dict(attrs), np.ascontiguousarray(x))
