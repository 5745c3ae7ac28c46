"""Handing rank 0's NCCL unique id to every rank.

`pygpukit launch` names a file ($PYGPUKIT_RENDEZVOUS_FILE) in a private directory: rank 0
writes the id there (atomically, by rename) and the others read it. A process started
otherwise (torchrun-style variables only) meets at $MASTER_ADDR:$MASTER_PORT over TCP:
rank 0 listens and sends the id to each rank that connects.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from pygpukit.errors import DistributedError

RENDEZVOUS_FILE = "PYGPUKIT_RENDEZVOUS_FILE"
TIMEOUT_SECONDS = 300.0
_POLL = 0.02


def exchange_unique_id(rank: int, world_size: int, make: Callable[[], bytes]) -> bytes:
    """Rank 0 calls make() and every rank returns its bytes."""
    path = os.environ.get(RENDEZVOUS_FILE)
    if path:
        return _through_file(path, rank, make)
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port or not port.isdigit():
        raise DistributedError(
            f"init: a world of {world_size} ranks needs ${RENDEZVOUS_FILE} (set by "
            f"`pygpukit launch`) or $MASTER_ADDR and $MASTER_PORT to meet at"
        )
    return _through_tcp(addr, int(port), rank, world_size, make)


def _through_file(path: str, rank: int, make: Callable[[], bytes]) -> bytes:
    if rank == 0:
        uid = make()
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(uid)
        os.replace(tmp, path)
        return uid
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            time.sleep(_POLL)
    raise DistributedError(f"init: rank {rank} waited {TIMEOUT_SECONDS:.0f} s for rank 0's "
                           f"NCCL id in {path}")  # fmt: skip


def _through_tcp(addr: str, port: int, rank: int, world_size: int,
                 make: Callable[[], bytes]) -> bytes:  # fmt: skip
    if rank == 0:
        uid = make()
        with socket.create_server((addr, port), reuse_port=False) as srv:
            srv.settimeout(TIMEOUT_SECONDS)
            for _ in range(world_size - 1):
                conn, _ = srv.accept()
                with conn:
                    conn.sendall(uid)
        return uid
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=TIMEOUT_SECONDS) as conn:
                data = b""
                while len(data) < 128:
                    chunk = conn.recv(128 - len(data))
                    if not chunk:
                        break
                    data += chunk
                if len(data) == 128:
                    return data
        except OSError:
            pass
        time.sleep(_POLL * 10)
    raise DistributedError(f"init: rank {rank} could not get rank 0's NCCL id from "
                           f"{addr}:{port} within {TIMEOUT_SECONDS:.0f} s")  # fmt: skip
