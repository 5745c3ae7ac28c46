"""The bulk upload (transfers.upload_staged, _rust.TransferEngine.htod_bulk) through the
real Python glue and Rust engine, on a fake of the copy C ABI (tests/copy_capi_fake.py)
whose streams run lazily: every byte lands, pageable sources may be changed as soon as
htod_bulk returns and closed as soon as upload_staged returns, progress reports every byte
on the calling thread, and errors (the device's, the progress callback's) come out
cleanly. The pieces' staging itself is tested by cargo (rust/pygpukit-core)."""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from copy_capi_fake import POISON, FakeCopyDevice

from pygpukit import _native, _rust
from pygpukit.backends.cuda import transfers
from pygpukit.errors import CUDAError


@pytest.fixture
def fake() -> Iterator[FakeCopyDevice]:
    """The fake table registered (the real one put back afterwards)."""
    dev = FakeCopyDevice()
    _rust.register_copy_capi(dev.capsule())
    try:
        yield dev
    finally:
        _rust.register_copy_capi(_native.copy_capi())


@pytest.fixture
def engine(fake: FakeCopyDevice, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An engine on the fake with small bulk pieces (not a multiple of any element size)
    on three threads, used by transfers.upload_staged."""
    eng = _rust.TransferEngine(bulk_threads=3, bulk_piece_bytes=1000 + 7, bulk_buffers=2)
    monkeypatch.setattr(transfers, "engine", lambda: eng)
    return eng


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _sources(rng: np.random.Generator) -> list[np.ndarray]:
    sizes = [(1, np.uint8), (0, np.float32), (999, np.float32), (5000, np.float16),
             (1007, np.uint8), (3333, np.int64)]  # fmt: skip
    return [rng.integers(1, 255, n * np.dtype(dt).itemsize, np.uint8).view(dt)
            for n, dt in sizes]  # fmt: skip


def test_upload_staged_lands_every_byte_and_reports_progress_on_the_calling_thread(
    engine: Any,
) -> None:
    rng = np.random.default_rng()
    srcs = _sources(rng)
    device = np.zeros(sum(a.nbytes for a in srcs) + 64 * len(srcs), np.uint8)
    jobs, at = [], 0
    for a in srcs:
        jobs.append((_addr(device) + at, a))
        at += a.nbytes + 64
    seen: list[tuple[int, int]] = []
    transfers.upload_staged(jobs, None, lambda n: seen.append((n, threading.get_ident())))
    at = 0
    for a in srcs:
        np.testing.assert_array_equal(device[at : at + a.nbytes], a.reshape(-1).view(np.uint8))
        assert not device[at + a.nbytes : at + a.nbytes + 64].any()  # nothing past a job
        at += a.nbytes + 64
    assert sum(n for n, _ in seen) == sum(a.nbytes for a in srcs)
    assert {t for _, t in seen} == {threading.get_ident()}
    stats = engine.stats()
    assert stats["bulk_bytes"] == sum(a.nbytes for a in srcs) and stats["in_flight"] == 0
    assert 0 < stats["pinned_bytes"] <= 3 * 2 * 1007


def test_pageable_sources_may_change_once_htod_bulk_returns(engine: Any) -> None:
    """The DMAs read the engine's pinned buffers: a source overwritten after the call
    returns, before any DMA ran (the fake runs nothing until waited for), still lands
    whole; the transfer is done only once waited for."""
    rng = np.random.default_rng()
    src = rng.integers(1, 255, 20_000, np.uint8)
    want = src.copy()
    device = np.zeros(src.size, np.uint8)
    t = engine.htod_bulk([(_addr(device), _addr(src), src.nbytes)], src)
    src[:] = POISON
    assert not t.done()
    t.wait()
    assert t.done() and t.nbytes == src.nbytes
    np.testing.assert_array_equal(device, want)


def test_memory_mapped_sources_close_on_return(engine: Any, tmp_path: Any) -> None:
    """Views of a memory map: once upload_staged returns the engine holds none of them
    (close raises BufferError otherwise) and the destination holds the file's bytes."""
    data = np.random.default_rng().integers(0, 256, 30_011, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    device = np.zeros(data.size, np.uint8)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        whole = np.frombuffer(mm, np.uint8)
        cuts = [0, 1, 1008, 10_000, 10_004, 30_011]
        jobs = [(_addr(device) + a, whole[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
        transfers.upload_staged(jobs, None)
        del jobs, whole
        mm.close()
    np.testing.assert_array_equal(device, data)


def test_a_progress_error_is_raised_once_the_copies_landed(engine: Any) -> None:
    rng = np.random.default_rng()
    src = rng.integers(1, 255, 9_000, np.uint8)
    device = np.zeros(src.size, np.uint8)

    def progress(n: int) -> None:
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt, match="stop"):
        transfers.upload_staged([(_addr(device), src)], None, progress)
    np.testing.assert_array_equal(device, src)


@pytest.mark.parametrize("fail_at", [0, 4])
def test_a_device_error_is_a_cuda_error_and_the_engine_goes_on(
    engine: Any, fake: FakeCopyDevice, fail_at: int
) -> None:
    rng = np.random.default_rng()
    src = rng.integers(1, 255, 12_000, np.uint8)
    device = np.zeros(src.size, np.uint8)
    fake.fail_uploads_after(fail_at)
    with pytest.raises(CUDAError, match="illegal memory access") as e:
        transfers.upload_staged([(_addr(device), src)], None)
    assert e.value.code == 700  # type: ignore[attr-defined]
    transfers.upload_staged([(_addr(device), src)], None)
    np.testing.assert_array_equal(device, src)


def test_concurrent_bulk_uploads_take_turns(engine: Any) -> None:
    rng = np.random.default_rng()
    srcs = [rng.integers(1, 255, n, np.uint8) for n in (7001, 33, 4096, 12_345)]
    devices = [np.zeros(a.size, np.uint8) for a in srcs]

    def upload(k: int) -> None:
        transfers.upload_staged([(_addr(devices[i]), srcs[i]) for i in (k, k + 2)], None)

    ts = [threading.Thread(target=upload, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, d in zip(srcs, devices, strict=True):
        np.testing.assert_array_equal(d, a)
