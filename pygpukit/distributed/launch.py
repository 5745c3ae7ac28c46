"""`pygpukit launch -n N script.py [args]`: one process per GPU, torchrun's variables.

Each process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (as torchrun sets them), $PYGPUKIT_RENDEZVOUS_FILE (where rank 0 leaves the
NCCL id for the others) and NCCL_NVLS_ENABLE=0; gpk.distributed.init() in the script
reads them and takes GPU LOCAL_RANK. When one rank fails the others are stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from pygpukit.errors import DistributedError

from .comm import NCCL_ENV
from .rendezvous import RENDEZVOUS_FILE


def gpus_available() -> tuple[int, str]:
    """(usable GPUs, why none are usable or '')."""
    from pygpukit.backends import select_backend

    name, reason = select_backend()
    if name != "cuda":
        return 0, reason or "the CPU backend was chosen (PYGPUKIT_BACKEND / gpk.set_backend)"
    from pygpukit import _native

    return int(_native.device_count()), ""


def check_world(nproc: int) -> None:
    """DistributedError (one line) unless this machine has nproc usable GPUs."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise DistributedError(f"launch: -n must be an integer >= 1, got {nproc!r}")
    have, why = gpus_available()
    if have < nproc:
        because = f" ({why})" if why else ""
        gpus = "1 GPU" if nproc == 1 else f"{nproc} GPUs, one per process"
        raise DistributedError(f"launch: -n {nproc} needs {gpus}; this machine has "
                               f"{have}{because}")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environment(rank: int, nproc: int, port: int, rendezvous: str) -> dict[str, str]:
    """The variables rank `rank` of `nproc` is started with (on top of this process's)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        RENDEZVOUS_FILE: rendezvous,
        **NCCL_ENV,
    }


def launch(nproc: int, script: str, args: Sequence[str], module: bool = False) -> int:
    """Run `python script args...` (module: `python -m script args...`) as nproc ranks;
    the exit status of the first rank that failed (0 when all succeeded)."""
    check_world(nproc)
    if not module and not os.path.isfile(script):
        raise DistributedError(f"launch: no such script {script!r}")
    command = [sys.executable, *(["-m"] if module else []), script, *args]
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="pygpukit-launch-") as tmp:
        rendezvous = os.path.join(tmp, "nccl-id")
        procs = [
            subprocess.Popen(command,
                             env={**os.environ, **rank_environment(r, nproc, port, rendezvous)})
            for r in range(nproc)
        ]  # fmt: skip
        return _wait(procs)


def _wait(procs: list[subprocess.Popen[bytes]]) -> int:
    """Wait for every rank; after the first failure, stop the others (SIGTERM, then
    SIGKILL after 10 s)."""
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]  # every one polled: a failure may be any
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if all(c is not None for c in codes):
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status if status >= 0 else 128 - status
