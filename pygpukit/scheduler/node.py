"""The scheduler across devices: `gpk.Scheduler(devices=[0, 1], ...)`.

Each device gets its own Scheduler (a DeviceScheduler): its own Rust core, whose memory is
that device's (its pool's quota, or the `memory` given), so admission is decided per
device by the core; its arenas come from that device's pool and its calls run with the
device current. NodeScheduler is the one view over them: submit(..., device=i) or
placement on the device whose core reports room (SchedulerCore.headroom), and stats()
per device with the node's totals.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from pygpukit import errors
from pygpukit.backends import devices

from .scheduler import Scheduler
from .task import Task


def _array_devices(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[int, str]:
    """The devices of the array arguments: ordinal -> the first argument found there."""
    from pygpukit.array import GPUArray
    from pygpukit.compile.pytree import flatten_call

    arrays: list[tuple[str, Any]] = []
    flatten_call(tuple(args), kwargs, arrays, [])
    out: dict[int, str] = {}
    for path, a in arrays:
        if isinstance(a, GPUArray):
            out.setdefault(devices.ordinal_of(a._node), path)
    return out


def _mixed(where: str, on: dict[int, str], expected: int | None = None) -> errors.GPUKitError:
    from pygpukit.device import device_of

    held = ", ".join(f"{p} on {device_of(o)}" for o, p in on.items())
    if expected is None:
        what = f"arguments on different devices: {held}"
    else:
        what = f"the task runs on {device_of(expected)}, but {held}"
    return errors.user_error(errors.DeviceMismatchError, where,
                             f"{what}; copy them over with x.to(device) first")  # fmt: skip


class DeviceScheduler(Scheduler):
    """A Scheduler bound to one device: its backend and pool are that device's, and its
    admissions (arena allocations) and launches run with the device current, on whichever
    thread does them."""

    def __init__(self, ordinal: int, **kwargs: Any) -> None:
        self.ordinal = ordinal
        with devices.using(ordinal):
            super().__init__(**kwargs)

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Task:
        """Scheduler.submit on this device: array arguments must be on it."""
        on = _array_devices(args, kwargs.get("kwargs") or {})
        if any(o != self.ordinal for o in on):
            raise _mixed("Scheduler.submit", on, self.ordinal)
        with devices.using(self.ordinal):
            return super().submit(fn, *args, **kwargs)

    def _admit_locked(self, ids: list[int], now: float) -> None:
        with devices.using(self.ordinal):
            super()._admit_locked(ids, now)

    def _launch(self, task: Task, now: float, on_caller: bool = False) -> None:
        with devices.using(self.ordinal):
            super()._launch(task, now, on_caller)

    def headroom(self, partition: str = "default") -> int:
        """The largest reservation in `partition` this device's core admits now without
        overtaking queued tasks (0: none, or no such partition)."""
        with self._mu:
            if self._unbooked:  # their reservations are free
                self._book_locked()
            room = self._core.headroom(partition)
        return 0 if room is None else int(room)

    def stats(self, task_id: int | Task | None = None) -> dict[str, Any]:
        """Scheduler.stats, naming the device."""
        st = super().stats(task_id)
        if task_id is None:
            from pygpukit.device import device_of

            st["device"] = str(device_of(self.ordinal))
        return st


class NodeScheduler:
    """One view over a scheduler per device (see the module's docstring). Made by
    `gpk.Scheduler(devices=[...])`; takes Scheduler's arguments, with `memory` an int
    for every device, a list in `devices` order or a dict by device."""

    def __init__(self, device_list: Sequence[Any], memory: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        from pygpukit.device import resolve

        where = "Scheduler"
        if isinstance(device_list, str | int) or not isinstance(device_list, Sequence):
            raise errors.user_error(errors.DTypeError, where, f"devices must be a list of "
                                    f"devices, got {device_list!r}")  # fmt: skip
        ordinals = [resolve(d, where) for d in device_list]
        if not ordinals or len(set(ordinals)) != len(ordinals):
            got = list(device_list)
            raise errors.user_error(errors.GPUKitValueError, where, f"devices must name at "
                                    f"least one device, each once; got {got!r}")  # fmt: skip
        per = self._memory_per_device(memory, device_list, ordinals)
        self.schedulers: dict[int, DeviceScheduler] = {}
        try:
            for o in ordinals:
                self.schedulers[o] = DeviceScheduler(o, memory=per[o], **kwargs)
        except BaseException:
            self.close(cancel=True)
            raise

    @staticmethod
    def _memory_per_device(memory: Any, given: Sequence[Any],
                           ordinals: list[int]) -> dict[int, Any]:  # fmt: skip
        from pygpukit.device import resolve

        if isinstance(memory, dict):
            by = {resolve(k, "Scheduler"): v for k, v in memory.items()}
            return {o: by.get(o) for o in ordinals}
        if isinstance(memory, list | tuple):
            if len(memory) != len(ordinals):
                n, m = len(memory), len(ordinals)
                raise errors.user_error(errors.GPUKitValueError, "Scheduler", f"memory lists "
                                        f"{n} sizes for {m} devices")  # fmt: skip
            return dict(zip(ordinals, memory, strict=True))
        return {o: memory for o in ordinals}

    @property
    def devices(self) -> list[Any]:
        """The devices, in the order given."""
        from pygpukit.device import device_of

        return [device_of(o) for o in self.schedulers]

    def submit(self, fn: Any, *args: Any, device: Any = None, **kwargs: Any) -> Task:
        """Scheduler.submit on one device: `device` when given; else the device the array
        arguments are on; else the device whose core has the most room for the task
        (one where it is admitted now when there is one; where it queues otherwise).

        Raises:
            DeviceMismatchError: Array arguments on two devices, or not on `device`.
            ValueError: `device` is not one of this scheduler's.
        """
        from pygpukit.device import resolve

        on = _array_devices(args, kwargs.get("kwargs") or {})
        if device is not None:
            target = resolve(device, "Scheduler.submit")
        elif len(on) > 1:
            raise _mixed("Scheduler.submit", on)
        elif on:
            target = next(iter(on))
        else:
            target = self._place(fn, args, kwargs)
        sched = self.schedulers.get(target)
        if sched is None:
            from pygpukit.device import device_of

            raise errors.user_error(errors.GPUKitValueError, "Scheduler.submit", f"device "
                                    f"{device_of(target)} is not one of this scheduler's "
                                    f"({', '.join(map(str, self.devices))})")  # fmt: skip
        return sched.submit(fn, *args, **kwargs)

    def _place(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """The device with the most room for the task; its need is measured on the first."""
        first = next(iter(self.schedulers))
        need = kwargs.get("memory")
        if need is None or isinstance(need, str):
            with devices.using(first):
                need = fn.reservation(*args, **(kwargs.get("kwargs") or {})).total
        partition = kwargs.get("partition", "default")
        rooms = {o: s.headroom(partition) for o, s in self.schedulers.items()}
        fitting = [o for o, r in rooms.items() if r >= need]
        pool = fitting or list(rooms)
        return max(pool, key=lambda o: rooms[o])  # max keeps the first of equals

    def stats(self, task_id: Task | tuple[Any, int] | None = None) -> dict[str, Any]:
        """Per device, the device's Scheduler.stats (`"devices"`: name -> stats), and the
        node's totals of memory, reservations, queue and running tasks. With a task (or
        `(device, task id)`: ids are per device): that task's stats."""
        if isinstance(task_id, Task):
            return task_id.stats()
        if task_id is not None:
            from pygpukit.device import resolve

            if not isinstance(task_id, tuple) or len(task_id) != 2:
                raise errors.user_error(errors.GPUKitValueError, "Scheduler.stats", "a task "
                                        "of several devices is named by the Task or "
                                        f"(device, id), got {task_id!r}")  # fmt: skip
            ordinal = resolve(task_id[0], "Scheduler.stats")
            return self.schedulers[ordinal].stats(task_id[1])
        per = {str(s.stats()["device"]): s.stats() for s in self.schedulers.values()}
        out: dict[str, Any] = {"devices": per}
        for key in ("capacity_bytes", "reserved_bytes", "queue_length", "running"):
            out[key] = sum(int(st.get(key, 0) or 0) for st in per.values())
        return out

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing starts on any device inside the block."""
        with ExitStack() as stack:
            for s in self.schedulers.values():
                stack.enter_context(s.paused())
            yield

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Close every device's scheduler (see Scheduler.close)."""
        for s in self.schedulers.values():
            s.close(cancel=cancel, timeout=timeout)

    def __enter__(self) -> NodeScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


def scheduler_for(device_list: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What `gpk.Scheduler(..., devices=...)` makes: a NodeScheduler over them."""
    if args:
        kwargs = {"memory": args[0], **kwargs}
        if len(args) > 1:
            kwargs["partitions"] = args[1]
    return NodeScheduler(device_list, **kwargs)
