"""The bulk loader's parallel staging (pygpukit/backends/cuda/staged_upload.py) without a
GPU: a fake DMA that reads its pinned buffer only when waited for, so a buffer refilled
before its DMA ran, or a DMA never waited for, shows up as wrong bytes at the
destination."""

from __future__ import annotations

import mmap
import threading
from typing import Any

import numpy as np
import pytest

from pygpukit.backends.cuda.staged_upload import Stager, split


class FakeDevice:
    """Device memory as one byte array; a DMA copies its buffer's bytes when waited for
    (then, not at issue), from whichever thread waits."""

    def __init__(self, nbytes: int, fail_at: int | None = None) -> None:
        self.mem = np.zeros(nbytes, np.uint8)
        self.issued = 0
        self.waited = 0
        self.fail_at = fail_at
        self.lock = threading.Lock()
        self.pending: set[int] = set()

    def issue(self, dst: int, buf: Any, addr: int, nbytes: int) -> Any:
        dev = self
        with self.lock:
            self.issued += 1
            if self.fail_at is not None and self.issued == self.fail_at:
                raise RuntimeError("simulated: cuMemcpyHtoDAsync failed")
            key = self.issued
            self.pending.add(key)
        src = np.frombuffer(buf, np.uint8)
        assert src.__array_interface__["data"][0] == addr

        class Dma:
            done = False

            def wait(self) -> None:
                if not self.done:
                    self.done = True
                    dev.mem[dst : dst + nbytes] = src[:nbytes]
                    with dev.lock:
                        dev.waited += 1
                        dev.pending.discard(key)

        return Dma()


Jobs = list[tuple[int, np.ndarray]]


def jobs_for(rng: np.random.Generator, sizes: list[int]) -> tuple[Jobs, int]:
    """Random sources of these byte sizes (several dtypes) at consecutive addresses with
    gaps, and the bytes spanned."""
    jobs, at = [], 0
    dtypes = [np.uint8, np.float32, np.float16, np.int64]
    for k, n in enumerate(sizes):
        dt = np.dtype(dtypes[k % len(dtypes)])
        a = rng.integers(1, 255, n * dt.itemsize, dtype=np.uint8).view(dt)
        jobs.append((at + 5, a))
        at += 5 + a.nbytes
    return jobs, at


def want_for(jobs: list[tuple[int, np.ndarray]], nbytes: int) -> np.ndarray:
    want = np.zeros(nbytes, np.uint8)
    for dst, a in jobs:
        want[dst : dst + a.nbytes] = a.reshape(-1).view(np.uint8)
    return want


@pytest.mark.parametrize("threads,piece,chunks", [(1, 64, 1), (3, 100, 2), (4, 37, 2),
                                                  (8, 4096, 3)])  # fmt: skip
def test_every_byte_lands_once_all_dmas_have_run(threads, piece, chunks):
    rng = np.random.default_rng(threads * 1000 + piece)
    jobs, n = jobs_for(rng, [0, 1, 63, 64, 65, 999, 5000, 37, 12345, 3])
    dev = FakeDevice(n)
    done = []
    st = Stager(bytearray, threads=threads, piece_bytes=piece, chunks=chunks)
    st.run(jobs, dev.issue, done.append)
    np.testing.assert_array_equal(dev.mem, want_for(jobs, n))
    assert not dev.pending and dev.waited == dev.issued  # nothing left in flight
    assert sum(done) == sum(a.nbytes for _, a in jobs)
    assert dev.issued == len(split(jobs, piece))


def test_buffers_are_kept_and_reused_by_later_runs():
    allocs = []

    def alloc(nbytes: int) -> bytearray:
        allocs.append(nbytes)
        return bytearray(nbytes)

    rng = np.random.default_rng(1)
    st = Stager(alloc, threads=3, piece_bytes=256, chunks=2)
    for _ in range(3):
        jobs, n = jobs_for(rng, [300, 2000, 17, 700])
        dev = FakeDevice(n)
        st.run(jobs, dev.issue)
        np.testing.assert_array_equal(dev.mem, want_for(jobs, n))
    assert allocs == [256] * 6 and st.pinned_bytes == 6 * 256
    few = Stager(alloc, threads=8, piece_bytes=256)
    allocs.clear()
    jobs, n = jobs_for(rng, [100])
    few.run(jobs, FakeDevice(n).issue)
    assert len(allocs) == 2  # one piece: one worker's buffers, not eight workers'


def test_sources_may_be_closed_on_return(tmp_path):
    """Views of a memory map: once run() returns nothing holds them (the map closes) and
    the destination holds the file's bytes."""
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, 50_000, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        whole = np.frombuffer(mm, np.uint8)
        jobs = [(0, whole[:20_000]), (20_000, whole[20_000:].view(np.int64)[:3000]),
                (44_000, whole[44_000:])]  # fmt: skip
        dev = FakeDevice(50_000)
        Stager(bytearray, threads=4, piece_bytes=1000).run(jobs, dev.issue)
        del jobs, whole
        mm.close()  # BufferError if a view were still held
    np.testing.assert_array_equal(dev.mem, data)


@pytest.mark.parametrize("fail_at", [1, 7, 30])
def test_a_failed_dma_is_raised_after_every_queued_one_ran(fail_at):
    rng = np.random.default_rng(fail_at)
    jobs, n = jobs_for(rng, [3000, 4000, 5000])
    dev = FakeDevice(n, fail_at=fail_at)
    st = Stager(bytearray, threads=4, piece_bytes=300)
    with pytest.raises(RuntimeError, match="simulated"):
        st.run(jobs, dev.issue)
    assert not dev.pending  # the buffers may be reused: no DMA still reads them
    assert dev.issued <= fail_at + 3  # each other worker issues at most the piece it holds
    ok = FakeDevice(n)
    st.run(jobs, ok.issue)  # and the stager still works
    np.testing.assert_array_equal(ok.mem, want_for(jobs, n))


def test_concurrent_runs_take_turns():
    rng = np.random.default_rng(3)
    st = Stager(bytearray, threads=3, piece_bytes=128)
    results: list[tuple[np.ndarray, np.ndarray]] = []

    def one() -> None:
        jobs, n = jobs_for(rng, [1000, 3000, 500])
        dev = FakeDevice(n)
        st.run(jobs, dev.issue)
        results.append((dev.mem, want_for(jobs, n)))

    ts = [threading.Thread(target=one) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 4
    for got, want in results:
        np.testing.assert_array_equal(got, want)


def test_split_refuses_strided_sources():
    a = np.random.default_rng(4).standard_normal((4, 6))
    with pytest.raises(ValueError, match="C-contiguous"):
        split([(0, a[:, ::2])], 64)
    pieces = split([(100, a)], 64)
    assert [p.dst for p in pieces] == [100 + 64 * i for i in range(3)]
    assert b"".join(p.src.tobytes() for p in pieces) == a.tobytes()
