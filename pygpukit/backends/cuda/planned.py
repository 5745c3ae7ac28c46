"""The CUDA side of the executor's hooks (PlannedBackend in backends/base.py): steps run
through launchers planned once per step and layout; compiled graphs run inside one arena
block, and each step writes into its planned slot.

A compiled entry's steps are recorded once into a CUDA Graph; a call then costs one graph
launch instead of one Python-issued launch per kernel. The graph is launched into the
backend's current stream (the legacy default stream, or a scheduler's stream), so it is
ordered after the uploads and input copies queued before the call and before the lazy ops
and to_numpy that read its results, with no events in between.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from pygpukit import _native, _rust
from pygpukit.errors import CompileError, OutOfMemoryError
from pygpukit.ir import DType
from pygpukit.memory import Storage, adopt, block, pin_all, unpin_all
from pygpukit.passes import Step

from . import compile_ahead, cublaslt, device_pool, dry_runs, ew
from .context import Launch, StepContext, contiguous
from .layout import is_contiguous
from .plan import plan_step
from .value import DeviceValue

_warned_ops: set[str] = set()  # the fallback warning is given once per op
# The dry run's ops (by time, both passes summed) a first call reports: where its time
# went (on the H200 a cold prefill chunk's took 314 ms, 57 ms for the next new shape).
DRY_RUN_OPS_SHOWN = 6
_contiguous: dict[tuple[int, ...], tuple[int, ...]] = {}  # shape -> its contiguous strides


class CudaReplay:
    """`replay()` has the effect of `run()`. The first replay runs it eagerly on the
    caller's stream (compiling kernels, building cuBLASLt plans and workspaces, so nothing
    inside the capture compiles, allocates from the driver or synchronises), then records
    it on a capture stream of its own (the legacy stream cannot be captured); later replays
    launch the instantiated graph. When capture fails (an op that synchronises), every
    replay re-issues the launches, after a one-time warning."""

    def __init__(self, backend: CudaPlannedHooks, run: Callable[[Launch], None]) -> None:
        self._backend = backend
        self._run = run
        self._exec: Any = None
        self._keep: list[Storage] = []  # scratch the graph writes: must outlive it
        self.num_nodes = 0
        # Programmatic edges from a cuBLASLt kernel to ours that start ours once the GEMM's
        # blocks have all begun (the GEMMs cublaslt marks, EARLY_MAX_ROWS): set by the
        # capture.
        self.early_edges = 0
        self.replays = 0  # graph launches
        self.eager_runs = 0  # run() called from Python (the first call, or the fallback)
        self.fallback: str | None = None  # why the launches are re-issued, if they are
        # Where the first call's time went (ms): the dry run, the parallel compile and
        # module loads (compile_ahead), the first (eager) run, the capture; cuBLASLt's
        # heuristic (in the dry run) and tuning (in the first run): lt_timing's keys.
        self.first_call: dict[str, Any] = {}
        # Whether replay() runs the steps from Python, reading the executor's values list
        # (before the capture, or after it failed), rather than launching the graph.
        self.reads_values = True

    @property
    def captured(self) -> bool:
        return self._exec is not None

    def replay(self) -> None:
        b = self._backend
        if self._exec is not None:
            self._exec.launch(b.stream)
            self.replays += 1
            return
        first = self.eager_runs == 0
        if first:
            lt0 = cublaslt.lt_timing()
            self._compile_ahead()
        t0 = time.perf_counter()
        self._run(Launch(b.stream))
        self.eager_runs += 1
        if first:
            self.first_call["first_run_ms"] = (time.perf_counter() - t0) * 1e3
            # Parts of the dry run (the heuristic) and of the first run (the tuning).
            self.first_call.update(cublaslt.lt_timing_since(lt0))
        if self.fallback is None:
            t0 = time.perf_counter()
            self._capture()
            if first:
                self.first_call["capture_ms"] = (time.perf_counter() - t0) * 1e3

    def _compile_ahead(self) -> None:
        """Runs the steps once dry, recorded on a capture stream of their own into a graph
        that is dropped (nothing executes), collecting the kernels they would compile;
        then compiles those in parallel (compile_ahead). A dry run that fails stops
        early: the real run compiles the rest, and meets the failure itself. Skipped for
        a program that ran dry before (worth_a_dry_run): a capture for new addresses, or
        the same program in an earlier process over this kernel cache (dry_runs)."""
        program = getattr(self._run, "__self__", None)
        collected = self._backend._collected
        before = program is not None and program in collected
        fp = None if before else dry_runs.fingerprint(program)
        if not compile_ahead.worth_a_dry_run(before, dry_runs.known(fp)):
            self.first_call = {"dry_run_ms": 0.0, "skipped": 1}
            return
        if program is not None:
            collected.add(program)
        t0 = time.perf_counter()
        stream = _native.Stream(0, True)
        # Twice, as the first call runs: planned and launched as the eager first run (not
        # captured), then launched on those plans as the capture. A launcher may pick its
        # kernel by whether it is captured (the decode GEMVs take other geometries when
        # they may read the weights early), so one pass misses the other's kernels. Its
        # own plans: they hold stand-ins.
        eager = _TimedLaunch(stream, keep=None, plans={})
        captured = _TimedLaunch(stream, keep=[], plans=eager.plans, times=eager.times)
        whole = False  # the dry run reached the end: requests name every kernel
        with compile_ahead.collecting() as requests:
            try:
                stream.begin_capture("relaxed")
                try:
                    self._run(eager)
                    self._run(captured)
                    whole = True
                finally:
                    stream.end_capture()
            except Exception:  # noqa: BLE001 - the real run reports it
                pass
        dry_ms = (time.perf_counter() - t0) * 1e3
        eager.step = captured.step = None  # a step a failure ended: timed to here
        slowest = sorted(eager.times.items(), key=lambda kv: -kv[1])[:DRY_RUN_OPS_SHOWN]
        try:
            report = compile_ahead.compile_all(list(requests.values()), since=t0)
        except CompileError:
            # The rest are installed; the real run compiles the failed kernel again and
            # reports it with its op and the user's line.
            report = compile_ahead.Report(kernels=len(requests))
        else:
            if whole:
                # Once the optimised builds of kernels compiled quickly (two tiers) are in
                # the cache too: a process skipping the dry run compiles what is missing.
                compile_ahead.after_upgrades(report, lambda: dry_runs.note(fp))
        self.first_call = {"dry_run_ms": dry_ms,
                           "dry_run_ops_ms": {op: round(ms, 2) for op, ms in slowest},
                           **report.as_dict()}  # fmt: skip

    def _capture(self) -> None:
        # The launches go to a capture stream of its own (handed to every launch through
        # the Launch); the blocks allocated while recording are the graph's to keep.
        stream = _native.Stream(0, True)
        launch = Launch(stream, keep=[])
        # Relaxed: a pool that must grow inside the capture may call cuMemAlloc, which the
        # stricter modes refuse; a sync on the capturing stream still fails (and falls back).
        stream.begin_capture("relaxed")
        try:
            try:
                self._run(launch)
            finally:
                graph = stream.end_capture()
            self.early_edges = graph.start_after_foreign_launch()
            exec_ = graph.instantiate()
        except Exception as e:  # noqa: BLE001 - any failure inside capture means: re-issue
            self._give_up(launch.step, e)
            return
        self._keep = pin_all(launch.keep or [])
        self._exec = exec_
        self.reads_values = False
        self.num_nodes = graph.num_nodes

    def _give_up(self, step: Any, e: Exception) -> None:
        op = getattr(step, "op", "writeback copy" if step is None else str(step))
        loc = getattr(step, "loc", None)
        where = f" at {loc}" if loc else ""
        self.fallback = f"{op}{where}: {type(e).__name__}: {e}"
        if op not in _warned_ops:
            _warned_ops.add(op)
            warnings.warn(
                f"compiled graph could not be captured as a CUDA Graph because of op "
                f"{op!r}{where} ({type(e).__name__}: {e}); its launches are re-issued "
                f"from Python on every call",
                RuntimeWarning,
                stacklevel=4,
            )

    def __del__(self) -> None:
        try:
            unpin_all(self._keep)
        except Exception:  # interpreter shutdown
            pass


def _graph_of(replay: Any) -> int | None:
    """The instantiated graph a quick call launches itself for `replay` (its handle), or
    None where it calls replay() (not captured as a graph, or not a CudaReplay)."""
    exec_ = getattr(replay, "_exec", None) if type(replay) is CudaReplay else None
    return None if exec_ is None else int(exec_.handle)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The contiguous element strides of `shape` (cached: asked on every call)."""
    strides = _contiguous.get(shape)
    if strides is None:
        strides = _contiguous[shape] = contiguous(shape)
    return strides


class _TimedLaunch(Launch):
    """A dry run's Launch, which also times each step executed through it, summed by op
    in `times` (ms): execute names the step running in `step` at its start and clears it
    at its end, so a step's time runs from its naming to the next change."""

    __slots__ = ("times", "_op", "_t0")

    def __init__(self, stream: Any, keep: list[Storage] | None = None,
                 plans: dict[int, Any] | None = None,
                 times: dict[str, float] | None = None) -> None:  # fmt: skip
        self.times: dict[str, float] = {} if times is None else times
        self._op: str | None = None
        self._t0 = 0.0
        super().__init__(stream, keep, plans)

    @property
    def step(self) -> Any:
        return _STEP_SLOT.__get__(self, Launch)

    @step.setter
    def step(self, value: Any) -> None:
        now = time.perf_counter()
        if self._op is not None:
            self.times[self._op] = self.times.get(self._op, 0.0) + (now - self._t0) * 1e3
        self._op = None if value is None else str(getattr(value, "op", value))
        self._t0 = now
        _STEP_SLOT.__set__(self, value)


_STEP_SLOT: Any = Launch.__dict__["step"]  # the slot _TimedLaunch.step reads and writes


class CudaPlannedHooks:
    """Mixed into CudaBackend (which has alloc, layout_key and what a StepContext reads):
    the executor's hooks."""

    pool: Any
    stream: Any
    poison: bool
    _exec_plans: dict[Any, Any]
    # Programs whose first call ran dry (CudaReplay._compile_ahead): their kernels are in
    # memory, so a capture for new argument addresses skips the dry run.
    _collected: weakref.WeakSet[Any]
    launches_issued = 0  # kernels queued from Python for compiled entries; replays add none

    def alloc_arena(self, nbytes: int) -> Storage:
        return device_pool.allocate(self.pool, max(nbytes, 1), "compiled graph arena")

    def value_at(self, arena: Storage, offset: int, shape: tuple[int, ...],
                 dtype: DType) -> DeviceValue:  # fmt: skip
        if offset % dtype.itemsize:
            raise ValueError(f"arena offset {offset} is not a multiple of {dtype.itemsize}")
        return DeviceValue(arena, shape, contiguous(shape), offset // dtype.itemsize, dtype)

    def view(self, step: Step, ins: list[DeviceValue]) -> DeviceValue:
        # A view launches nothing: no Launch to make (its context reads the backend's).
        ctx, run = self._launcher(step, ins, None)
        return ctx.call(run, ins, None, None)

    def _launcher(self, step: Step, ins: list[DeviceValue],
                  launch: Launch | None) -> tuple[StepContext, Any]:  # fmt: skip
        """The step's context and launcher, planned on first use: per step for a lazy run
        (launch.plans, one layout per cached schedule), else per step and input layouts."""
        plans = None if launch is None else launch.plans
        if plans is not None:
            key: Any = id(step)
        else:
            plans = self._exec_plans  # the StepContext keeps the step: its id stays unique
            key = (id(step), tuple(self.layout_key(v) for v in ins))  # type: ignore[attr-defined]
        got = plans.get(key)
        if got is None:
            ctx = StepContext(self, step, launch)  # type: ignore[arg-type]  # plan-time allocs too
            try:
                got = plans[key] = (ctx, plan_step(ctx, step, ins))
            finally:
                ctx.launch = None
        return got  # type: ignore[no-any-return]

    def execute(self, step: Step, ins: list[DeviceValue], out: DeviceValue | None,
                inplace: bool, launch: Launch | None = None) -> DeviceValue:  # fmt: skip
        """Run one step (PlannedBackend.execute). out=None: its result is allocated (the
        inputs are pinned meanwhile: the allocation must not evict them); else written
        into `out` (for an in-place setitem, out is ins[0])."""
        if launch is None:  # a lone step (the profiler's): on the current stream
            launch = Launch(self.stream)
        launch.step = step  # names the op if a capture fails inside it
        if out is None:
            held = pin_all(v.storage for v in ins)
            try:
                ctx, run = self._launcher(step, ins, launch)
                res: DeviceValue = ctx.call(run, ins, None, launch)
            finally:
                unpin_all(held)
            launch.step = None
            return res
        self.launches_issued += 1
        ctx, run = self._launcher(step, ins, launch)
        res = ctx.call(run, ins, out, launch)
        if (res.storage is not out.storage or res.offset != out.offset
                or res.strides != out.strides):  # fmt: skip
            self.copy_into(out, res, launch)
        launch.step = None
        return out

    def copy_into(self, dst: DeviceValue, src: DeviceValue, launch: Launch | None = None) -> None:
        if src.ptr == dst.ptr and src.strides == dst.strides and src.dtype == dst.dtype:
            return  # already in its slot
        if (src.dtype == dst.dtype and src.shape == dst.shape
                and is_contiguous(src.shape, src.strides)
                and is_contiguous(dst.shape, dst.strides)):  # fmt: skip
            # A copy engine transfer: no kernel, and no launcher to build per call.
            nbytes = src.size * src.dtype.itemsize
            if nbytes:
                stream = self.stream if launch is None else launch.stream
                _native.memcpy_dtod_async(dst.ptr, src.ptr, nbytes, stream)
            return
        ctx = StepContext(self, None, launch)  # type: ignore[arg-type]
        cast = ew.make(ctx, ("cast", dst.dtype.name, ("in", 0)), [src], dst.shape, dst.strides,
                       dst.dtype, dst.ptr)  # fmt: skip
        self.launches_issued += 1
        cast(dst.ptr, [src.ptr])

    def clone(self, value: DeviceValue) -> DeviceValue:
        out = self.alloc(value.shape, value.dtype, "clone")  # type: ignore[attr-defined]
        if value.strides == _strides(value.shape):  # an arena slot: one copy-engine transfer
            self.copy_placed(out, value, value.ptr, value.size * value.dtype.itemsize)
        else:
            self.copy_into(out, value)
        return out

    def copy_placed(self, dst: DeviceValue, src: DeviceValue, src_place: int,
                    nbytes: int) -> None:  # fmt: skip
        """Copy `src`, whose place() is src_place, into the contiguous slot `dst` of the
        same shape and dtype: the checks copy_into makes were made by place()."""
        if nbytes and dst.ptr != src_place:
            _native.memcpy_dtod_async(dst.ptr, src_place, nbytes, self.stream)

    def fresh(self, shape: tuple[int, ...], dtype: DType) -> tuple[DeviceValue, int]:
        """A new output block, and the address a capture bakes in for it (alloc() without
        what only matters inside a step: an error location, the capture's scratch list)."""
        if self.poison:  # tests: alloc() fills it with NaN
            value = self.alloc(shape, dtype, "compiled output")  # type: ignore[attr-defined]
            return value, value.ptr
        strides = _contiguous.get(shape)
        if strides is None:
            strides = _strides(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        try:
            storage = block(self.pool, nbytes)
        except OutOfMemoryError:  # allocate() releases cached arenas, then names the output
            storage = device_pool.allocate(self.pool, nbytes, "compiled output")
        # Just allocated: resident, and the most recently used (no need for .addr's touch).
        return DeviceValue(storage, shape, strides, 0, dtype), storage._addr

    def place(self, value: DeviceValue, shape: tuple[int, ...], dtype: DType) -> int | None:
        """The address a captured graph bakes in when `value` stands in for a contiguous
        slot of this shape and dtype; None: copy it into the slot."""
        strides = _contiguous.get(shape)
        if strides is None:
            strides = _strides(shape)
        # Identity first: DType's __eq__ is Python code, and this runs per argument per call.
        if (value.strides != strides or value.shape != shape
                or (value.dtype is not dtype and value.dtype != dtype)):  # fmt: skip
            return None
        return value.storage.addr + value.offset * dtype.itemsize

    def with_storage(self, value: DeviceValue, storage: Any) -> DeviceValue:
        return DeviceValue(storage, value.shape, value.strides, value.offset, value.dtype)

    def quick_call(self, prog: Any) -> Callable[[list[DeviceValue]], list[DeviceValue] | None]:
        """`prog.call(args, externals, fresh=True, same_externals=True)` for the usual hit
        of a compiled call, inlined (the executor makes it per arena and binding, where
        every output is a fresh block and every argument is bound by address): allocate
        the outputs, read the arguments' addresses (fresh() and place() without their
        frames), replay the graph holding them. None, having changed nothing the caller
        sees, where that does not hold this time (an argument of another layout, a block
        that moved, an allocation that must evict or fail): the caller then calls
        prog.call, which handles every case."""
        if self.poison:  # tests: outputs come from alloc(), NaN-filled
            return lambda args: None
        pool = self.pool
        evicting = prog._evicting_pool
        alloc, touch = pool.alloc_storage, pool.touch
        outs = [(math.prod(shape) * dtype.itemsize, shape, _strides(shape), dtype)
                for _, shape, dtype in prog._fresh_specs]  # fmt: skip
        ins = [(shape, _strides(shape), dtype, dtype.itemsize)
               for _, _, shape, dtype, *_ in prog._arg_specs]  # fmt: skip
        arena, token, replay = prog.arena, prog._bind_token, prog.replay_quick
        lo, hi = prog._span

        def place(v: DeviceValue, shape: tuple[int, ...], strides: tuple[int, ...],
                  dtype: DType, size: int) -> int | None:  # fmt: skip
            """place() without its frame's lookups: None where the argument is copied."""
            if (v.strides != strides or v.shape != shape
                    or (v.dtype is not dtype and v.dtype != dtype)):  # fmt: skip
                return None  # place() would refuse it: copied into its slot
            st = v.storage
            h = st._h
            if h is None:
                at: int = st._addr
            else:
                at = touch(h)  # as Storage.addr: restored if evicted, marked used
                if at != st._addr:
                    return None  # it moved: Storage.addr records that
            at += v.offset * size
            return None if lo <= at < hi else at  # in this arena: a static output fed back

        if len(outs) == 1 and len(ins) == 1 and isinstance(pool, _rust.Pool):
            # One array in, one out (the usual compiled call): the same steps as call()
            # below in one native call (rust/pygpukit-py/src/quick.rs), which launches the
            # hot graph through the launch C ABI; CompiledFunction's native hit runs it
            # without a Python crossing.
            ((nbytes, oshape, ostrides, odtype),) = outs
            ((ishape, istrides, idtype, isize),) = ins
            return _rust.QuickCall(prog, pool, evicting is not None, arena, self, Storage,
                                   DeviceValue, (OutOfMemoryError, ValueError), _graph_of,
                                   (ishape, istrides, idtype, isize),
                                   (nbytes, oshape, ostrides, odtype), token, (lo, hi))  # fmt: skip

        def call(args: list[DeviceValue]) -> list[DeviceValue] | None:
            if arena.freed or len(args) != len(ins):
                return None
            evictions = evicting.evictions if evicting is not None else 0
            news: list[DeviceValue] = []
            places: list[Any] = [token]
            try:
                for nbytes, shape, strides, dtype in outs:
                    addr, h = alloc(nbytes)
                    news.append(DeviceValue(adopt(pool, nbytes, addr, h), shape, strides, 0,
                                            dtype))  # fmt: skip
                    places.append(addr)
                for v, (shape, strides, dtype, size) in zip(args, ins):  # noqa: B905
                    at = place(v, shape, strides, dtype, size)
                    if at is None:
                        return None
                    places.append(at)
            except (OutOfMemoryError, ValueError):
                return None  # device_pool.allocate's cleanup and message, or a freed block
            if evicting is not None and evicting.evictions != evictions:
                return None  # a block moved while addresses were read
            key = tuple(places)
            hot = prog._hot
            if key == hot[0]:
                hot[1].replay()
            else:
                replay(key, args, news)
            return news

        return call

    def capture(self, run: Callable[[Launch], None]) -> CudaReplay:
        return CudaReplay(self, run)
