"""Type stub of the PyO3 module pygpukit._rust (rust/pygpukit-py)."""

import contextvars
from collections.abc import Callable
from typing import Any

__version__: str

class Pool:
    arena_bytes: int
    quota_bytes: int | None
    evicts: bool  # enable_eviction() was called
    evictions: int
    def __init__(
        self,
        arena_bytes: int = ...,
        quota_bytes: int | None = ...,
        alloc_arena: Callable[[int], int] | None = ...,
        free_arena: Callable[[int, int], None] | None = ...,
    ) -> None: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, addr: int) -> None: ...
    def size_of(self, addr: int) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def release_cached(self) -> int: ...
    def arenas(self) -> list[tuple[int, int, int]]: ...
    def enable_eviction(
        self, copy_out: Callable[[int, int], Any], copy_in: Callable[[Any, int], None]
    ) -> None: ...
    def alloc_storage(self, nbytes: int) -> tuple[int, int | None]: ...
    def touch(self, handle: int) -> int: ...
    def pin(self, handle: int) -> int: ...
    def unpin(self, handle: int) -> None: ...
    def forget(self, handle: int) -> None: ...
    def is_evicted(self, handle: int) -> bool: ...
    def pins(self, handle: int) -> int: ...
    def eviction_stats(self) -> dict[str, int] | None: ...

class SchedulerCore:
    def __init__(
        self,
        capacity_bytes: int,
        burst_ms: float = ...,
        guard_ms: float = ...,
        min_idle_ms: float = ...,
    ) -> None: ...
    def add_partition(
        self,
        name: str,
        memory_quota_bytes: int,
        bandwidth_share: float = ...,
        stream_priority: int = ...,
    ) -> None: ...
    def set_best_effort_duty(self, duty: float, window_ms: float, now: float) -> None: ...
    def submit(
        self,
        tenant: str,
        reservation_bytes: int,
        *,
        now: float,
        qos: str = ...,
        priority: int = ...,
        partition: str = ...,
        bandwidth_share: float = ...,
        deadline_ms: float | None = ...,
    ) -> tuple[int, str, str | None, list[int]]: ...
    def submit_start(
        self,
        tenant: str,
        reservation_bytes: int,
        now: float,
        qos: str,
        priority: int,
        partition: str,
        bandwidth_share: float,
        deadline_ms: float | None,
        start: bool,
    ) -> tuple[int, str, str | None, list[int], int | None]: ...
    def headroom(self, partition: str) -> int | None: ...
    def may_start(self, task_id: int, now: float) -> bool: ...
    def next_start_time(self, task_id: int, now: float) -> float | None: ...
    def pick_next(self, now: float) -> int | None: ...
    def pick_and_start(self, now: float) -> tuple[int, int] | None: ...
    def next_wakeup(self, now: float) -> float | None: ...
    def start(self, task_id: int, now: float) -> int: ...
    def complete(self, task_id: int, gpu_ms: float, now: float) -> list[int]: ...
    def complete_waited(
        self, task_id: int, gpu_ms: float, now: float
    ) -> tuple[list[int], bool]: ...
    def kick(self, now: float) -> None: ...
    def wake_dispatcher(self) -> None: ...
    def arm_wait(self, until: float, watch: bool) -> None: ...
    def wait_dispatcher(self, now: float, until: float, watch: bool) -> str: ...
    def fail(self, task_id: int, gpu_ms: float, now: float) -> list[int]: ...
    def cancel(self, task_id: int) -> list[int]: ...
    def state(self, task_id: int) -> str: ...
    def queue_order(self) -> list[int]: ...
    def stats(self, now: float | None = ...) -> dict[str, Any]: ...
    def guaranteed_step(
        self,
        sched: Any,
        func: Any,
        tenant: str,
        partition: str,
        bandwidth: float,
        priority: int,
        objects: dict[str, Any],
    ) -> GuaranteedStep: ...

class GuaranteedStep:
    def submit(self, args: tuple[Any, ...]) -> Any: ...

def register_launch_capi(capsule: Any) -> None: ...

_LaunchSpec = tuple[Any, int, int, list[int], list[int], int, bool, list[tuple[int, int, int]]]

class Dispatcher:
    def __init__(
        self, capacity: int = ..., every: int = ..., max_markers: int = ..., fake: bool = ...
    ) -> None: ...
    def insert(
        self,
        key: int,
        launches: list[_LaunchSpec],
        n_inputs: int,
        n_outputs: int,
        temp_bytes: list[int],
    ) -> None: ...
    def run(
        self, key: int, inputs: list[int], outputs: list[int], stream: int, pool: Pool
    ) -> bool: ...
    def run_alloc(
        self,
        key: int,
        inputs: list[tuple[int, int | None]],
        out_bytes: list[int],
        stream: int,
        pool: Pool,
    ) -> list[tuple[int, int | None]] | None: ...
    def __contains__(self, key: int) -> bool: ...
    def __len__(self) -> int: ...
    def remove(self, key: int) -> bool: ...
    def clear(self) -> None: ...
    def drain(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def fake_log(
        self,
    ) -> list[tuple[int, list[int], list[int], int, bool, int, list[int]]]: ...
    def fake_fail_launch(self, n: int) -> None: ...

def register_copy_capi(capsule: Any) -> None: ...
def copy_capi_registered() -> bool: ...

class Transfer:
    @property
    def nbytes(self) -> int: ...
    def done(self) -> bool: ...
    def wait(self) -> None: ...

class TransferEngine:
    def __init__(
        self,
        chunk_bytes: int | None = ...,
        chunks: int | None = ...,
        copy_threads: int | None = ...,
        bulk_threads: int | None = ...,
        bulk_piece_bytes: int | None = ...,
        bulk_buffers: int | None = ...,
    ) -> None: ...
    def htod(
        self,
        dst: int,
        src: int,
        nbytes: int,
        keep: Any,
        priority: str = ...,
        stream: int = ...,
    ) -> Transfer: ...
    def dtoh(
        self,
        dst: int,
        src: int,
        nbytes: int,
        keep: Any,
        priority: str = ...,
        stream: int = ...,
        deferred: bool = ...,
    ) -> Transfer: ...
    def htod_bulk(
        self,
        jobs: list[tuple[int, int, int]],
        keep: Any,
        stream: int = ...,
        progress: Callable[[int], object] | None = ...,
    ) -> Transfer: ...
    @property
    def h2d_stream(self) -> int: ...
    @property
    def d2h_stream(self) -> int: ...
    def stats(self) -> dict[str, int]: ...

class QuickCall:
    """A compiled program's usual hit (one array in, one fresh array out) in one call."""

    def __init__(
        self,
        prog: Any,
        pool: Pool,
        evicts: bool,
        arena: Any,
        backend: Any,
        storage_type: type,
        value_type: type,
        catch: tuple[type[BaseException], ...],
        graph_of: Any,
        arg: tuple[tuple[int, ...], tuple[int, ...], Any, int],
        out: tuple[int, tuple[int, ...], tuple[int, ...], Any],
        token: int,
        span: tuple[int, int],
    ) -> None: ...
    def __call__(self, values: list[Any]) -> list[Any] | None: ...

class CompiledHit:
    """A compiled function's usual hit in one call: its result, or `miss`."""

    def __init__(
        self,
        guard: Any,
        prog: Any,
        miss: Any,
        tracing: list[int],
        active: list[Any],
        releases: list[int],
        array_type: type,
        node_type: type,
        ids: Any,
        arg: tuple[Any, Any],
        containers: list[Any],
        globals: list[tuple[dict[str, Any], list[str]]],
        held: list[Any],
        out: tuple[Any, Any, Any, Any],
    ) -> None: ...
    def __call__(self, args: tuple[Any, ...]) -> Any: ...
    def matches(self, args: tuple[Any, ...]) -> bool: ...
    def take_hits(self) -> int: ...
    @property
    def hits(self) -> int: ...

# pygpukit.mode._eager: the innermost gpk.eager() block's choice (None: no block).
EAGER_MODE: contextvars.ContextVar[bool | None]

class EagerBlock:
    """One gpk.eager() block: entry sets EAGER_MODE, exit resets it (pygpukit.mode.eager)."""

    def __init__(self, enabled: bool | None = True) -> None: ...
    @property
    def enabled(self) -> bool | None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, exc_type: object = None, exc: object = None, tb: object = None) -> None: ...

class EagerHits:
    """The native hits of eager binary keys (eager_ops.NATIVE): op(a, b) or None."""

    def __init__(
        self,
        types: tuple[type, type, type, type, type],
        ids: Any,
        backends: dict[str, Any],
        changes: list[int],
        releases: list[int],
        stats: dict[str, int],
        last_run: list[Any],
        library: dict[str, bool],
        user_frame: Any,
        cuda_error: type,
    ) -> None: ...
    def binary(self, op: str, a: Any, b: Any) -> Any: ...
    def register(
        self,
        op: str,
        entry: Any,
        replay: Any,
        operands: tuple[tuple[Any, ...], tuple[Any, ...]],
        same: bool,
        backend: Any,
        sources: list[Any],
    ) -> bool: ...
    def forget(self, entry: Any) -> None: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

class LazyScalars:
    """The native lazy records of an array and a Python scalar (array._operator's fast path):
    record(op, x, value, first) -> the GPUArray, or None (take the Python path)."""

    def __init__(
        self,
        types: tuple[type, type],
        ids: Any,
        epoch: list[int],
        no_attrs: dict[str, Any],
        library: tuple[dict[str, bool], list[int]],
        user_frame: Any,
    ) -> None: ...
    def record(self, op: str, x: Any, value: Any, first: bool) -> Any: ...
    def register(
        self, op: str, dtype: Any, value: Any, first: bool, spec: tuple[Any, ...]
    ) -> bool: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

def operators_setup(
    lazy: LazyScalars, eager: EagerHits, eager_mode: Any, eager_now: list[Any], devices: list[Any]
) -> None:
    """What every native GPUArray operator shares (once per process, by pygpukit.array)."""

def operator_method(cls: type, name: str, op: str, first: bool, python: Any) -> Any:
    """A method descriptor of cls for the binary operator of op (reflected when first) that
    serves the native eager and lazy hits and calls `python` for everything else."""
