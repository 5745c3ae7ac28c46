"""SimulatedCommunicator: N ranks as N threads of one process, on the NumPy backend.

Each collective is a meeting: every rank leaves its host array in its slot and waits at a
barrier; then each computes its own result from all the slots (the same rank order, so
every rank gets bit-identical values, as NCCL gives), and a second barrier keeps the
slots until every rank has read them. The ranks must call the same collectives with the
same shapes in the same order, as with NCCL; here a mismatch is an error on every rank
instead of a hang, and a rank that fails breaks the barrier, so the others stop too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.errors import DistributedError
from pygpukit.ir.dtypes import as_dtype
from pygpukit.ir.evaluate import compute_dtype

from .comm import Communicator, bind_thread

WAIT_SECONDS = 120.0  # a rank waiting longer than this for the others is a failure


class _Meeting:
    """What the ranks of one simulated world share."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=WAIT_SECONDS)
        self.slots: list[Any] = [None] * world_size


def _reduce(op: str, parts: list[np.ndarray]) -> np.ndarray:
    """parts combined in rank order, in the compute precision (f32 for 16-bit floats, as
    NCCL's kernels accumulate), rounded once to the parts' dtype."""
    dtype = parts[0].dtype
    ct = compute_dtype(dtype)
    acc = parts[0].astype(ct)
    with np.errstate(all="ignore"):
        for p in parts[1:]:
            q = p.astype(ct)
            if op in ("sum", "avg"):
                acc = acc + q
            elif op == "prod":
                acc = acc * q
            elif op == "max":
                acc = np.maximum(acc, q)
            else:
                acc = np.minimum(acc, q)
        if op == "avg":
            acc = acc / ct.type(len(parts))
    return np.asarray(acc).astype(dtype)


class SimulatedCommunicator(Communicator):
    """Rank `rank` of a world simulated by threads (see gpk.distributed.simulate)."""

    backend = "cpu"

    def __init__(self, meeting: _Meeting, rank: int) -> None:
        self._meeting = meeting
        self.rank = rank
        self.world_size = meeting.world_size
        self._closed = False

    def _wait(self, op: str) -> None:
        try:
            self._meeting.barrier.wait()
        except threading.BrokenBarrierError:
            raise DistributedError(
                f"{op} on rank {self.rank}: another rank failed or did not reach the "
                f"collective within {WAIT_SECONDS:.0f} s"
            ) from None

    def combine(self, op: str, attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
        """This rank's result of collective `op` (the IR's all_reduce, all_gather,
        reduce_scatter or broadcast, with its attrs) over every rank's x."""
        if self._closed:
            raise DistributedError(f"{op} on rank {self.rank}: the communicator was closed")
        m = self._meeting
        me = (op, tuple(sorted(attrs.items())), x.shape, x.dtype)
        m.slots[self.rank] = (me, np.array(x, copy=True))
        self._wait(op)
        keys = [s[0] for s in m.slots]
        parts = [s[1] for s in m.slots]
        try:
            if any(k != me for k in keys):
                bad = next(r for r, k in enumerate(keys) if k != me)
                raise DistributedError(
                    f"{op} on rank {self.rank}: rank {bad} called {keys[bad][0]} on "
                    f"{as_dtype(keys[bad][3]).short}{list(keys[bad][2])} "
                    f"{dict(keys[bad][1])}, this rank {op} on "
                    f"{as_dtype(x.dtype).short}{list(x.shape)} {dict(attrs)}: every rank "
                    f"must call the same collectives in the same order"
                )
            return _combine(op, attrs, parts, self.rank)
        finally:
            self._wait(op)  # nobody overwrites a slot before every rank has read it

    def close(self) -> None:
        """Later collectives on this rank fail."""
        self._closed = True


def _combine(op: str, attrs: dict[str, Any], parts: list[np.ndarray], rank: int) -> np.ndarray:
    if op == "all_reduce":
        return _reduce(attrs["op"], parts)
    if op == "all_gather":
        return np.concatenate(parts, axis=attrs["axis"])
    if op == "reduce_scatter":
        full = _reduce(attrs["op"], parts)
        return np.array_split(full, len(parts), axis=attrs["axis"])[rank].copy()
    if op == "broadcast":
        return parts[attrs["root"]].copy()
    raise DistributedError(f"the simulated communicator has no collective {op!r}")


def simulate(world_size: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """Run fn(*args, **kwargs) as `world_size` ranks (threads of this process, NumPy
    backend), each with its own SimulatedCommunicator: gpk.distributed.rank() and the
    collectives work inside fn as in a launched process. Returns every rank's result,
    in rank order; the first rank's exception (by rank) is raised after all have ended."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DistributedError(f"simulate: world_size must be an integer >= 1, got "
                               f"{world_size!r}")  # fmt: skip
    from pygpukit.backends import get_backend

    if get_backend().name != "cpu":
        raise DistributedError(
            "simulate: simulated ranks run on the NumPy backend (gpk.set_backend('cpu') "
            "before the first array); on GPUs start one process per GPU with "
            "`pygpukit launch -n N`"
        )
    meeting = _Meeting(world_size)
    results: list[Any] = [None] * world_size
    failures: list[BaseException | None] = [None] * world_size

    def rank_main(rank: int) -> None:
        bind_thread(SimulatedCommunicator(meeting, rank))
        try:
            results[rank] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            failures[rank] = e
            meeting.barrier.abort()  # the others stop at their next collective
        finally:
            bind_thread(None)

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"pygpukit-rank-{r}",
                                daemon=True) for r in range(world_size)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A rank's own error first: the others' are the broken barrier it caused.
    first = next((e for e in failures if e is not None and not _secondary(e)), None)
    first = first or next((e for e in failures if e is not None), None)
    if first is not None:
        raise first
    return results


def _secondary(e: BaseException) -> bool:
    return isinstance(e, DistributedError) and "another rank failed" in str(e)
