"""Compiling a schedule's kernels ahead of its first run, in parallel.

The kernels a step needs are known only when it is planned and launched (a template's
defines depend on the pointers' alignment, a generated kernel's source on the layouts).
So before a compiled program's first run, the backend runs it once dry, recorded into a
CUDA Graph that is thrown away (nothing executes), inside `collecting()`: every kernel
that is not yet in memory is not compiled but asked for (`ask`), and a stand-in that
launches nothing (DEFERRED) is handed back, so the dry run reaches every step. Each
request starts compiling on a thread pool as soon as it is asked for (NVRTC compiles one
program per thread; the native compile and the disk-cache read and write release the
GIL), so the compiles overlap the rest of the dry run: the decode step asks for its
slowest kernel (the attention) in its first layer. Then `compile_all` waits for them (and
compiles any request not started) and loads each module on the calling thread, into the
same in-memory caches the compile sites read: the real run finds every kernel there. Only
the variants the run asks for are compiled.

Two tiers: a request with a FastTier whose optimised CUBIN is not in the kernel cache is
compiled quickly at a low optimisation level (NVRTC's --Ofast-compile) and loaded as
provisional, so the first call waits for the quick compile only; its optimised compile then
runs in the background (after compile_all, on threads of its own) and, when it lands, is
written to the disk cache and replaces the provisional kernel: the Functions the plans hold
launch it from then on, and the captured graphs launching the old one move to it on their
next launch (native graph.h). On the H200 the decode attention's module compiled in 1.53 s,
0.57 s at --Ofast-compile=mid (the decode step 0.87 -> 1.11 ms with it); the flash attention
1.10 -> 0.38 s (the 1x1024 prefill 4.4 -> 37.8 ms); the GEMVs 0.43-0.45 -> 0.23-0.25 s (the
decode step 3.7 ms): slower code while it serves, so only until the optimised one lands.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pygpukit.errors import CompileError

MAX_WORKERS = 16
# Kernels one batched NVRTC program holds at most. Each program pays NVRTC's fixed cost
# (about 27 ms of CPU on the H200's host even for a cached trivial kernel; the headers
# and libdevice), so a prefill chunk's ten generated kernels compiled as one program took
# 280 ms of CPU on the development host against 612 ms one by one (NVRTC 13.5): where
# the compiles outnumber the threads (a small host), fewer programs cost less.
BATCH_SIZE = 4


@dataclass
class FastTier:
    """How a request's kernel may serve first from a quick, less optimised compile."""

    # The optimised CUBIN where the kernel cache (memory or disk) holds it, else None.
    cached: Callable[[], bytes | None]
    # A quick compile of the same kernels at a low optimisation level (kept in no cache).
    compile: Callable[[], bytes]
    # Loads that CUBIN into the compile site's cache as provisional (the calling thread).
    install: Callable[[bytes], None]
    # Loads the optimised CUBIN in the provisional one's place (a background thread).
    upgrade: Callable[[bytes], None]


@dataclass
class Request:
    """One kernel module to compile: `compile()` returns its CUBIN (any thread; no
    CUDA context needed), `install(cubin)` loads it into its compile site's cache (the
    calling thread, which holds the CUDA context)."""

    key: Any
    name: str
    compile: Callable[[], bytes]
    install: Callable[[bytes], None]
    # The compile started when it was asked for (ask, inside collecting()): compile_all
    # waits for it rather than compiling again.
    started: Future[Compiled] | None = field(default=None, compare=False, repr=False)
    # Requests of one batch (equal keys, not None) may compile as one NVRTC program:
    # batch_compile(requests) returns a CUBIN holding each one's kernel. One starts when
    # asked for while the pool has a thread free (alone: the H200's host compiled a cold
    # prefill chunk's generated kernels in 380-445 ms each, all after the dry run, the
    # call's critical path when they waited for compile_all); the others start in
    # compile_all (BATCH_SIZE a program where they outnumber the free threads).
    batch: Any = field(default=None, compare=False)
    batch_part: Any = field(default=None, compare=False, repr=False)  # for batch_compile
    batch_compile: Callable[[list[Request]], bytes] | None = field(default=None, compare=False,
                                                                   repr=False)  # fmt: skip
    # Two tiers (module docstring): where set, a kernel not in the cache serves from a
    # quick compile first; `provisional` says whether it did (set by its compile job).
    fast: FastTier | None = field(default=None, compare=False, repr=False)
    provisional: bool = field(default=False, compare=False)


@dataclass
class Report:
    """What one compile_all did, in milliseconds: wall time of the compiles (from the
    first one's start, which may be inside the dry run, to the last one's end), their sum
    (the time one thread would have taken), the time compile_all itself waited for them
    (what the compiles added after the dry run), module loads."""

    kernels: int = 0
    workers: int = 0
    compile_wall_ms: float = 0.0
    compile_sum_ms: float = 0.0
    compile_wait_ms: float = 0.0
    load_ms: float = 0.0
    names: list[str] = field(default_factory=list)
    # Each kernel's compile, slowest first: the first is the compile wall's critical path.
    per_kernel_ms: dict[str, float] = field(default_factory=dict)
    # When each compile started, from compile_all's `since` (the dry run's start): a
    # kernel's start plus its compile is when it was ready (empty without `since`).
    started_ms: dict[str, float] = field(default_factory=dict)
    # Kernels compiled quickly (two tiers), and their optimised compiles under way.
    provisional: list[str] = field(default_factory=list)
    upgrades: list[Future[None]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "workers": self.workers,
                "compile_wall_ms": self.compile_wall_ms, "compile_sum_ms": self.compile_sum_ms,
                "compile_wait_ms": self.compile_wait_ms, "load_ms": self.load_ms,
                "per_kernel_ms": dict(self.per_kernel_ms),
                "started_ms": dict(self.started_ms),
                "provisional": len(self.provisional)}  # fmt: skip


class _Collecting(threading.local):
    requests: dict[Any, Request] | None = None
    pool: ThreadPoolExecutor | None = None
    workers: int = 0  # the pool's threads
    started: list[Future[Compiled]] | None = None  # the compiles asked for so far


_state = _Collecting()


class _Deferred:
    """Stands for a kernel asked for while collecting: launching it records nothing. Any
    other use raises AttributeError, which ends the dry run (what was asked for so far is
    still compiled). One instance for the process: code that keys state by id(fn) never
    sees its id reused."""

    def launch(self, *args: Any, **kwargs: Any) -> None:
        """Launches nothing (the dry run only collects what it would compile)."""

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Nothing to raise: the real function is set when it is launched for real."""


DEFERRED: Any = _Deferred()


def is_collecting() -> bool:
    """Whether this thread is inside collecting()."""
    return _state.requests is not None


def ask(request: Request) -> bool:
    """Called by a compile site on an in-memory miss: inside collecting(), records the
    request (once per key), starts compiling it on the block's thread pool (one that may
    join a batch only while a thread is free: the rest wait for compile_all, which
    batches them) and returns True (the site hands back DEFERRED); otherwise returns
    False (compile now)."""
    requests = _state.requests
    if requests is None:
        return False
    if request.key not in requests:
        requests[request.key] = request
        pool, started = _state.pool, _state.started
        free = started is not None and _busy(started) < _state.workers
        if pool is not None and started is not None and (request.batch is None or free):
            request.started = pool.submit(_timed, request)
            started.append(request.started)
    return True


def _busy(started: list[Future[Compiled]]) -> int:
    """How many of the compiles started are still running or queued."""
    return sum(1 for f in started if not f.done())


@contextmanager
def collecting(workers: int | None = None) -> Iterator[dict[Any, Request]]:
    """Inside the block this thread's compile sites ask rather than compile; yields the
    requests (by key), filled as the block runs. Each request starts compiling when asked
    for (one that may join a batch only while a thread is free), on up to `workers`
    threads (default: the CPU count, at most MAX_WORKERS; 0: none start, compile_all
    compiles them all); compile_all waits for those."""
    outer = _state.requests, _state.pool, _state.workers, _state.started
    requests: dict[Any, Request] = {}
    n = _workers(workers)
    # Threads start only as requests come: a block that asks for nothing costs none.
    pool = ThreadPoolExecutor(n, thread_name_prefix="pygpukit-nvrtc") if n else None
    _state.requests, _state.pool, _state.workers, _state.started = requests, pool, n, []
    try:
        yield requests
    finally:
        _state.requests, _state.pool, _state.workers, _state.started = outer
        if pool is not None:
            pool.shutdown(wait=False)  # the compiles started run on; compile_all waits


def _workers(workers: int | None) -> int:
    return min(MAX_WORKERS, os.cpu_count() or 1) if workers is None else workers


def worth_a_dry_run(collected_before: bool, known_on_disk: bool = False) -> bool:
    """Whether a program's first call should run dry to compile ahead: unless an earlier
    first call of the same program in this process ran dry (a capture for new argument
    addresses: its kernels are in memory), or one in an earlier process over the same
    kernel cache did (dry_runs: its kernels are on disk). Which kernels a program needs is
    known only by running it dry: a process whose kernels so far all came from disk may
    still meet a new shape whose kernels are not there (those then compiled one after
    another in the first run: 1.08 s for the bench's in-process 1x128 prefill)."""
    return not (collected_before or known_on_disk)


# A compile's CUBIN or error, and its start and end (perf_counter seconds).
Compiled = tuple[bytes | None, BaseException | None, float, float]


def _compile(req: Request) -> bytes:
    """The request's CUBIN: where it has a fast tier, the optimised one if cached, else a
    quick build (req.provisional set); else its compile."""
    fast = req.fast
    if fast is None:
        return req.compile()
    cubin = fast.cached()
    if cubin is not None:
        return cubin
    try:
        cubin = fast.compile()
    except CompileError:  # an NVRTC without the quick level: the optimised build serves
        return req.compile()
    req.provisional = True
    return cubin


def _timed(req: Request) -> Compiled:
    t0 = time.perf_counter()
    try:
        return _compile(req), None, t0, time.perf_counter()
    except Exception as e:  # reported by compile_all, with the kernel's name
        return None, e, t0, time.perf_counter()


def _jobs(todo: list[Request], free: int) -> list[list[Request]]:
    """The compiles to run for requests not started, on `free` threads: one job per
    request where they fit; where there are more than the threads, requests of one batch
    share jobs of up to BATCH_SIZE (one thread compiling a batch is slower than several
    compiling its kernels at once: the 4x512 prefill's three generated kernels took 388
    ms as one program on the H200's host, 179 ms in parallel)."""
    if len(todo) <= free:
        return [[r] for r in todo]
    jobs: list[list[Request]] = []
    batches: dict[Any, list[Request]] = {}
    for r in todo:
        if r.batch is None or r.batch_compile is None:
            jobs.append([r])
        else:
            batches.setdefault(r.batch, []).append(r)
    for group in batches.values():
        n = -(-len(group) // BATCH_SIZE)  # programs, as even as they come
        jobs += [group[k::n] for k in range(n)]
    return jobs


def _timed_job(job: list[Request]) -> dict[int, Compiled]:
    """Each request's result of one job: a batch's CUBIN for every request of it; where
    the batch does not compile, each request compiled alone (its own error)."""
    if len(job) == 1 or job[0].batch_compile is None:
        return {id(r): _timed(r) for r in job}
    t0 = time.perf_counter()
    try:
        cubin = job[0].batch_compile(job)
    except Exception:  # noqa: BLE001 - compiled alone, each names its own failure
        return {id(r): _timed(r) for r in job}
    shared = (cubin, None, t0, time.perf_counter())  # one compile: counted once in the sum
    return {id(r): shared for r in job}


def compile_all(requests: list[Request], workers: int | None = None,
                since: float | None = None) -> Report:  # fmt: skip
    """Compiles the requests concurrently (waiting for those started when asked for) and
    installs each (in the order given).

    Requests of one batch compile together, BATCH_SIZE to a program, where the requests
    not started outnumber the threads free (`workers` less the compiles still running).
    Every compile runs to its end; if any failed, the others are still installed and a
    CompileError names each kernel that failed, with its NVRTC log.

    Args:
        requests: What to compile (each once).
        workers: Threads at most for the requests not started yet (default: the CPU
            count, at most MAX_WORKERS).
        since: A perf_counter() time (the dry run's start) the report's started_ms count
            from.

    Returns:
        The Report of times.

    Raises:
        CompileError: One or more kernels did not compile.
    """
    rep = Report(kernels=len(requests))
    if not requests:
        return rep
    todo = [r for r in requests if r.started is None]
    rep.workers = max(1, min(_workers(workers) or 1, len(requests)))
    running = sum(1 for r in requests if r.started is not None and not r.started.done())
    jobs = _jobs(todo, max(1, rep.workers - running))
    threads = min(rep.workers, len(jobs))
    t0 = time.perf_counter()
    if jobs and threads == 1:
        outs = [_timed_job(j) for j in jobs]
    elif jobs:
        with ThreadPoolExecutor(threads, thread_name_prefix="pygpukit-nvrtc") as pool:
            outs = list(pool.map(_timed_job, jobs))
    else:
        outs = []
    done: dict[int, Compiled] = {}
    for out in outs:
        done.update(out)
    results = [done[id(r)] if r.started is None else r.started.result() for r in requests]
    rep.compile_wait_ms = (time.perf_counter() - t0) * 1e3
    rep.compile_wall_ms = (max(r[3] for r in results) - min(r[2] for r in results)) * 1e3
    failed: list[str] = []
    ms = [(r[3] - r[2]) * 1e3 for r in results]
    for k in sorted(range(len(requests)), key=lambda k: -ms[k]):
        rep.per_kernel_ms[requests[k].name] = round(ms[k], 2)
        if since is not None:
            rep.started_ms[requests[k].name] = round((results[k][2] - since) * 1e3, 2)
    rep.compile_sum_ms = sum((r[3] - r[2]) * 1e3 for r in {id(r): r for r in results}.values())
    for req, (cubin, error, _, _) in zip(requests, results, strict=True):
        if error is not None or cubin is None:
            failed.append(f"{req.name}: {error}")
            continue
        t1 = time.perf_counter()
        if req.provisional and req.fast is not None:
            req.fast.install(cubin)
            rep.provisional.append(req.name)
            rep.upgrades.append(_start_upgrade(req))
        else:
            req.install(cubin)
        rep.load_ms += (time.perf_counter() - t1) * 1e3
        rep.names.append(req.name)
    if failed:
        raise CompileError(f"{len(failed)} of {len(requests)} kernels compiled in parallel "
                           "failed:\n" + "\n".join(failed))  # fmt: skip
    return rep


_optimiser_lock = threading.Lock()
_optimiser_pool: ThreadPoolExecutor | None = None
_upgrades: list[Future[None]] = []  # under way (done ones are dropped as new ones come)


def _optimiser() -> ThreadPoolExecutor:
    """The threads of the background optimised compiles (made on first use; the process
    waits for their compiles at exit, so each lands in the disk cache)."""
    global _optimiser_pool
    with _optimiser_lock:
        if _optimiser_pool is None:
            _optimiser_pool = ThreadPoolExecutor(_workers(None) or 1, "pygpukit-nvrtc-opt")
        return _optimiser_pool


def _start_upgrade(req: Request) -> Future[None]:
    """Starts the optimised compile of a provisional request in the background."""
    future = _optimiser().submit(_upgrade, req)
    with _optimiser_lock:
        _upgrades[:] = [f for f in _upgrades if not f.done()] + [future]
    return future


def _upgrade(req: Request) -> None:
    """The optimised compile of a provisional request (into the kernel cache), then its
    upgrade; a failure leaves the quick build serving, with a warning."""
    try:
        cubin = req.compile()
        assert req.fast is not None
        req.fast.upgrade(cubin)
    except Exception as e:  # noqa: BLE001 - the quick build still serves
        warnings.warn(f"pygpukit: the optimised build of {req.name} failed ({e}); its quick "
                      "build keeps serving", RuntimeWarning, stacklevel=1)  # fmt: skip


def after_upgrades(report: Report, then: Callable[[], None]) -> None:
    """Calls `then` once every optimised compile of the report has landed (now if it
    started none), on the thread that finishes the last one."""
    left = [len(report.upgrades)]
    if not report.upgrades:
        then()
        return
    lock = threading.Lock()

    def one(_: Future[None]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for f in report.upgrades:
        f.add_done_callback(one)


def wait_for_upgrades(timeout: float | None = None) -> bool:
    """Waits until the background optimised compiles started so far have landed (each
    replacing its provisional kernel); whether they all did within `timeout` seconds."""
    with _optimiser_lock:
        pending = list(_upgrades)
    return not wait_futures(pending, timeout=timeout).not_done


__all__ = [
    "DEFERRED",
    "FastTier",
    "Report",
    "Request",
    "after_upgrades",
    "ask",
    "collecting",
    "compile_all",
    "is_collecting",
    "wait_for_upgrades",
    "worth_a_dry_run",
]
