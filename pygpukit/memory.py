"""Storage: one block of pool memory, host or device, owned by the Rust pool."""

from __future__ import annotations

from typing import Any


class Storage:
    """A pool block. Freed when the last value using it dies, or at once by `release()`."""

    __slots__ = ("addr", "nbytes", "pool", "freed", "__weakref__")

    def __init__(self, pool: Any, nbytes: int) -> None:
        self.pool = pool
        self.nbytes = nbytes
        self.freed = False
        self.addr: int = pool.alloc(nbytes)

    def release(self) -> None:
        if not self.freed:
            self.freed = True
            self.pool.free(self.addr)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the pool may already be gone
            pass
