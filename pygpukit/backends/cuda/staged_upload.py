"""Bulk uploads of pageable host memory (model loading) staged on several threads at once.

One thread's memcpy from the page cache into pinned memory runs at about a sixth of the
H2D DMA rate (H200: 8 GB/s against 55), so a staged upload on one thread (the transfer
engine's chunks) leaves the copy engine mostly idle. Here each of `threads` workers owns
`chunks` pinned buffers of `piece_bytes`: it copies the next piece of the work into its
next buffer (NumPy's copy releases the GIL, so the copies run in parallel) and queues the
buffer's DMA through `issue` (the engine's direct path: the buffer is page-locked), while
the other workers copy. A buffer is refilled only after its last DMA has run.

run() returns once every piece's DMA has run: the sources (a memory-mapped checkpoint)
may be closed and the buffers serve the next call. The buffers are kept for reuse; one
Stager serves one call at a time.

On the H200 host, copying a 2.2 GB checkpoint from a warm page cache into pinned memory
ran at 8.4 GB/s on one thread and 45 GB/s on eight; the whole load through the Stager at
35 GB/s on eight workers (docs/design.md has the figures).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# Bytes per staged copy and per pinned buffer. 8 workers x 2 x 4 MiB = 64 MiB pinned, as
# much as the engine's own staging ring: on the H200 host 4 MiB pieces loaded as fast as
# 8 MiB (35.3 against 34.4 GB/s) and 16 MiB slower (27.1), and the first bulk load of a
# process pays for allocating the pinned buffers.
PIECE_BYTES = 4 << 20
THREADS = min(8, os.cpu_count() or 1)
CHUNKS = 2  # pinned buffers per worker: one copied into while the other's DMA runs


class Pending(Protocol):
    """A queued DMA."""

    def wait(self) -> Any:
        """Returns once the DMA has run."""
        ...


# issue(dst, buffer, address, nbytes): queue the DMA of nbytes from the pinned buffer (at
# host address `address`) to device address dst; the returned handle's wait() returns once
# it has run.
Issue = Callable[[int, Any, int, int], Pending]


@dataclass(frozen=True)
class Piece:
    dst: int  # device address
    src: np.ndarray  # 1-D uint8, C-contiguous, at most PIECE_BYTES


def split(jobs: Sequence[tuple[int, np.ndarray]], piece_bytes: int) -> list[Piece]:
    """The (device address, C-contiguous array) jobs cut into pieces of at most
    piece_bytes, in order (a job's pieces land at consecutive addresses)."""
    out = []
    for dst, array in jobs:
        if not array.flags.c_contiguous:
            raise ValueError("a staged upload needs C-contiguous arrays")
        raw = array.reshape(-1).view(np.uint8)
        for at in range(0, raw.nbytes, piece_bytes):
            out.append(Piece(dst + at, raw[at : at + piece_bytes]))
    return out


class Stager:
    """Pinned buffers and the workers that stage pieces through them.

    alloc(nbytes) returns a pinned buffer (an object with the buffer protocol, kept alive
    by the Stager while used); issue queues one DMA (see Issue).
    """

    def __init__(self, alloc: Callable[[int], Any], threads: int = THREADS,
                 piece_bytes: int = PIECE_BYTES, chunks: int = CHUNKS) -> None:  # fmt: skip
        self.alloc, self.threads, self.piece_bytes = alloc, max(1, threads), piece_bytes
        self.chunks = max(1, chunks)
        self._buffers: list[list[tuple[Any, np.ndarray, int]]] = []  # per worker
        self._lock = threading.Lock()  # one run at a time: the buffers are shared

    @property
    def pinned_bytes(self) -> int:
        """Pinned bytes allocated so far (kept for the next run)."""
        return sum(len(b) for b in self._buffers) * self.piece_bytes

    def _worker_buffers(self, k: int) -> list[tuple[Any, np.ndarray, int]]:
        while len(self._buffers) <= k:
            self._buffers.append([])
        mine = self._buffers[k]
        while len(mine) < self.chunks:
            buf = self.alloc(self.piece_bytes)
            view = np.frombuffer(buf, np.uint8, count=self.piece_bytes)
            mine.append((buf, view, int(view.__array_interface__["data"][0])))
        return mine

    def run(self, jobs: Sequence[tuple[int, np.ndarray]], issue: Issue,
            progress: Callable[[int], None] | None = None) -> None:  # fmt: skip
        """Uploads each (device address, C-contiguous array) job; returns once all of it
        has landed. progress(nbytes) is called (from the workers, one at a time) as
        pieces are queued. The first error of any worker is raised once all have stopped
        (and their queued DMAs have run)."""
        pieces = split(jobs, self.piece_bytes)
        if not pieces:
            return
        with self._lock:
            workers = min(self.threads, len(pieces))
            buffers = [self._worker_buffers(k) for k in range(workers)]
            self._stage(pieces, buffers, issue, progress)

    def _stage(self, pieces: list[Piece], buffers: list[list[tuple[Any, np.ndarray, int]]],
               issue: Issue, progress: Callable[[int], None] | None) -> None:  # fmt: skip
        lock = threading.Lock()
        state = {"next": 0}
        errors: list[BaseException] = []

        def claim() -> Piece | None:
            with lock:
                i = state["next"]
                if errors or i >= len(pieces):
                    return None
                state["next"] = i + 1
                return pieces[i]

        def work(mine: list[tuple[Any, np.ndarray, int]]) -> None:
            pending: list[Pending | None] = [None] * len(mine)
            turn = 0
            try:
                while (piece := claim()) is not None:
                    buf, view, addr = mine[turn]
                    if (p := pending[turn]) is not None:
                        pending[turn] = None
                        p.wait()  # the buffer's last DMA has run: it may be refilled
                    n = piece.src.nbytes
                    np.copyto(view[:n], piece.src)
                    pending[turn] = issue(piece.dst, buf, addr, n)
                    turn = (turn + 1) % len(mine)
                    if progress is not None:
                        with lock:
                            progress(n)
            except BaseException as e:
                with lock:
                    errors.append(e)
            finally:
                # The buffers are reused: every DMA out of them must have run.
                for p in pending:
                    if p is not None:
                        try:
                            p.wait()
                        except BaseException as e:
                            with lock:
                                errors.append(e)

        threads = [threading.Thread(target=work, args=(b,), name=f"pygpukit-upload-{k}",
                                    daemon=True) for k, b in enumerate(buffers[1:], 1)]  # fmt: skip
        for t in threads:
            t.start()
        try:
            work(buffers[0])  # the caller is worker 0
        finally:
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
