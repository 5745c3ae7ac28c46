"""The communicator a collective runs through, and which one is current.

A process started by `pygpukit launch` (or torchrun) has one communicator for the whole
process (gpk.distributed.init). The simulated ranks of gpk.distributed.simulate are
threads of one process, so there the communicator is bound per thread; a thread's own
binding wins over the process's.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod

from pygpukit.errors import DistributedError

# NVLink SHARP (multicast) stays off in everything PyGPUkit starts: it must be set before
# NCCL initialises, and the machines this runs on do not support it reliably.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def nccl_environment() -> None:
    """Set NCCL's environment (NCCL_NVLS_ENABLE=0) before NCCL reads it; a value the
    user set for NCCL_NVLS_ENABLE is overridden, the others are kept."""
    os.environ.update(NCCL_ENV)


class Communicator(ABC):
    """`world_size` ranks that run the same program and meet at each collective, in the
    same order on every rank. `backend` names the backend whose values it combines
    ("cpu": host arrays, "cuda": device buffers on the step's stream)."""

    rank: int
    world_size: int
    backend: str

    @abstractmethod
    def close(self) -> None:
        """Release the communicator (NCCL: ncclCommDestroy); later collectives fail."""


_process: list[Communicator | None] = [None]
_thread = threading.local()


def bind_process(comm: Communicator | None) -> None:
    """Make `comm` the process's communicator (None: none)."""
    _process[0] = comm


def bind_thread(comm: Communicator | None) -> None:
    """Make `comm` this thread's communicator (None: the process's serves again)."""
    _thread.comm = comm


def current_or_none() -> Communicator | None:
    """This thread's communicator, else the process's, else None."""
    comm: Communicator | None = getattr(_thread, "comm", None)
    return comm if comm is not None else _process[0]


def current(op: str = "collective") -> Communicator:
    """The communicator `op` runs through; DistributedError when there is none."""
    comm = current_or_none()
    if comm is None:
        raise DistributedError(
            f"{op}: no communicator: call gpk.distributed.init() in a process started by "
            f"`pygpukit launch -n N` (or torchrun), or run the function under "
            f"gpk.distributed.simulate(n, fn)"
        )
    return comm
