"""One backend per device, made on first use, and which device the running code is on.

The primary device is the one the process started on (CUDA: the driver's selected device,
0 unless gpk.distributed chose the rank's GPU; CPU: simulated device 0); its backend is
`get_backend()`'s as before. `with gpk.Device(i):` makes device i current on this thread,
and get_backend() then answers device i's backend (its own pool, streams and kernel
modules). Until a second device is used (`ACTIVE[0]`), nothing here runs on the hot path:
single-device programs record, realise and allocate as they always did.

Arrays know their device through their nodes: a node recorded off the primary device is
tagged here (a weak table, so tags die with their nodes); a node without a tag is on the
primary device. `runtime.record` places each new node on its inputs' device (or, for a
node without inputs, the current device) and refuses inputs from two devices.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pygpukit import settings

if TYPE_CHECKING:
    from pygpukit.ir import Node

    from .base import Backend

# Set once a device other than the primary one is made current or given as a device=:
# until then every array is on the primary device and nothing is tagged or checked.
ACTIVE = [False]


class _Current(threading.local):
    ordinal: int | None = None  # None: the primary device


current = _Current()
_lock = threading.RLock()
_primary: list[Backend | None] = [None]
_backends: dict[int, Backend] = {}
_pools: dict[int, int] = {}  # id(pool) -> ordinal
_tags: weakref.WeakKeyDictionary[Node, int] = weakref.WeakKeyDictionary()


def register_primary(backend: Backend) -> None:
    """The process's first backend is its primary device's (backends.get_backend)."""
    with _lock:
        _primary[0] = backend
        _backends[backend.ordinal] = backend
        _pools[id(backend.pool)] = backend.ordinal


def primary() -> Backend:
    from . import get_backend

    b = _primary[0]
    if b is None:
        with _lock:
            saved, current.ordinal = current.ordinal, None
            try:
                b = get_backend()
            finally:
                current.ordinal = saved
    return b


def primary_ordinal() -> int:
    """The ordinal of the device the process started on."""
    return primary().ordinal


def kind() -> str:
    """'cuda' or 'cpu': the kind of every device of this process."""
    return primary().name


def count() -> int:
    """Devices of the running backend: CUDA GPUs, or PYGPUKIT_CPU_DEVICES simulated ones."""
    if kind() == "cuda":
        from pygpukit import _native

        return int(_native.device_count())
    return settings.cpu_devices()


def current_ordinal() -> int:
    """The device this thread's creation functions and ops use now."""
    o = current.ordinal
    return primary_ordinal() if o is None else o


def backend_for(ordinal: int) -> Backend:
    """Device `ordinal`'s backend, made on first use (CUDA: with that device selected, so
    its pool, streams and modules are that device's)."""
    prim = primary()
    if ordinal == prim.ordinal:
        from pygpukit import backends

        return backends._backend or prim  # get_backend's own (a test may swap it)
    b = _backends.get(ordinal)
    if b is not None:
        return b
    with _lock:
        b = _backends.get(ordinal)
        if b is None:
            b = _make(prim.name, ordinal)
            _backends[ordinal] = b
            _pools[id(b.pool)] = ordinal
    return b


def _make(name: str, ordinal: int) -> Backend:
    if name == "cpu":
        from .numpy_backend import NumpyBackend

        backend: Backend = NumpyBackend(quota_bytes=settings.cpu_device_memory())
    else:
        from .cuda.backend import CudaBackend

        with _selected(ordinal):
            backend = CudaBackend()
    backend.ordinal = ordinal
    return backend


def made() -> dict[int, Backend]:
    """The backends made so far, by ordinal."""
    with _lock:
        return dict(_backends)


@contextmanager
def _selected(ordinal: int) -> Iterator[None]:
    """The CUDA driver's device for this thread: the native layer's launches, copies and
    allocations use its context."""
    from pygpukit import _native

    before = int(_native.get_device())
    if before == ordinal:
        yield
        return
    _native.use_device(ordinal)
    try:
        yield
    finally:
        _native.use_device(before)


@contextmanager
def using(ordinal: int) -> Iterator[None]:
    """Device `ordinal` is current on this thread inside the block (get_backend() is its
    backend; on CUDA its context is the driver's), the previous one again after it."""
    saved = current.ordinal
    if ordinal == (primary_ordinal() if saved is None else saved):
        yield  # already there: nothing to switch
        return
    ACTIVE[0] = True
    backend_for(ordinal)
    current.ordinal = ordinal
    try:
        if kind() == "cuda":
            with _selected(ordinal):
                yield
        else:
            yield
    finally:
        current.ordinal = saved


# -- which device an array is on --------------------------------------------------------


def tag(node: Node, ordinal: int) -> None:
    """Node `node` lives on device `ordinal`."""
    if ordinal != primary_ordinal():
        _tags[node] = ordinal


def ordinal_of(node: Node) -> int:
    """The device of a node's value: its tag, else the pool its value came from, else the
    primary device."""
    if not ACTIVE[0]:
        return primary_ordinal()
    o = _tags.get(node)
    if o is not None:
        return o
    value = node.realized
    if value is not None:
        storage = getattr(value, "storage", None)
        pool = getattr(storage, "pool", None)
        o = _pools.get(id(pool))
        if o is not None:
            return o
    return primary_ordinal()


def backend_of(node: Node) -> Backend:
    """The backend that holds (or will hold) a node's value."""
    if not ACTIVE[0]:
        from . import get_backend

        return get_backend()
    return backend_for(ordinal_of(node))
