"""Device: where an array's memory lives, as `a.device` reports it (`<Device cuda:0>`),
and where creation functions and ops run: `with gpk.Device(1):`, `device=`, `x.to(dev)`.

The CUDA backend's devices are its GPUs; the CPU backend's are PYGPUKIT_CPU_DEVICES
simulated ones (`cpu`, `cpu:1`, ...), each with its own pool, so multi-device code runs
and is tested without a GPU. A GPU ordinal given to the CPU backend (`gpk.Device(1)` or a
plain 1) names its simulated device 1, so the same program runs on both.
"""

from __future__ import annotations

import threading
from typing import Any

from pygpukit import errors


class _Blocks(threading.local):
    def __init__(self) -> None:
        self.stack: list[Any] = []  # the using() blocks of this thread's `with Device`


_blocks = _Blocks()


class Device:
    """A CUDA GPU by ordinal (`gpk.Device(0)`, `gpk.Device("cuda:0")`) or a device of the
    CPU backend (`gpk.Device("cpu")`, `gpk.Device("cpu:1")`). Equal devices compare and
    hash alike. `with gpk.Device(1):` makes it this thread's current device (nested blocks
    restore the outer one)."""

    __slots__ = ("kind", "id")

    def __init__(self, device: int | str | Device = 0) -> None:
        if isinstance(device, Device):
            kind, ordinal = device.kind, device.id
        elif isinstance(device, str):
            kind, ordinal = _parse(device)
        elif isinstance(device, int) and not isinstance(device, bool):
            kind, ordinal = "cuda", device
        else:
            raise errors.user_error(errors.DTypeError, "Device", f"expected a GPU ordinal or "
                                    f"'cpu'/'cuda[:N]', got {device!r}")  # fmt: skip
        if ordinal < 0:
            raise errors.user_error(errors.GPUKitValueError, "Device", f"a device ordinal is "
                                    f"not negative, got {ordinal}")  # fmt: skip
        self.kind: str = kind
        self.id: int = ordinal

    def __repr__(self) -> str:
        return f"<Device {self}>"

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu" if self.id == 0 else f"cpu:{self.id}"
        return f"cuda:{self.id}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self.kind, self.id) == (other.kind, other.id)

    def __hash__(self) -> int:
        return hash((self.kind, self.id))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (str(self),))

    def __enter__(self) -> Device:
        from pygpukit.backends import devices

        block = devices.using(resolve(self, "Device"))
        block.__enter__()
        _blocks.stack.append(block)
        return self

    def __exit__(self, *exc: object) -> None:
        _blocks.stack.pop().__exit__(None, None, None)


def _parse(text: str) -> tuple[str, int]:
    kind, _, ordinal = text.strip().lower().partition(":")
    if kind == "cpu" and (not ordinal or ordinal.isdigit()):
        return "cpu", int(ordinal or 0)
    if kind in ("cuda", "gpu") and (not ordinal or ordinal.isdigit()):
        return "cuda", int(ordinal or 0)
    raise errors.user_error(errors.GPUKitValueError, "Device", f"expected 'cpu[:N]' or "
                            f"'cuda[:N]', got {text!r}")  # fmt: skip


def device_of(ordinal: int) -> Device:
    """Device `ordinal` of the running backend."""
    from pygpukit.backends import devices

    return Device(f"{devices.kind()}:{ordinal}")


def current_device() -> Device:
    """This thread's current device: where creation functions put new arrays (the device
    the process started on, unless a `with gpk.Device(i):` block says otherwise)."""
    from pygpukit.backends import devices

    return device_of(devices.current_ordinal())


def device_count() -> int:
    """The number of devices: CUDA GPUs on the CUDA backend, PYGPUKIT_CPU_DEVICES (default 1)
    simulated devices on the CPU backend."""
    from pygpukit.backends import devices

    return devices.count()


def resolve(device: Any, op: str) -> int:
    """The running backend's ordinal for `device` (an int, 'cuda:1'/'cpu:1' or a Device),
    range-checked; a wrong type or ordinal raises naming `op` and the user's line. On the
    CPU backend a GPU ordinal names the simulated device of that number; on the CUDA
    backend a CPU device is refused (the host is reached with to_numpy())."""
    from pygpukit.backends import devices

    if isinstance(device, Device):
        kind, ordinal = device.kind, device.id
    elif isinstance(device, int) and not isinstance(device, bool):
        kind, ordinal = devices.kind(), device
        if ordinal < 0:
            raise errors.user_error(errors.GPUKitValueError, op, f"a device ordinal is not "
                                    f"negative, got {ordinal}")  # fmt: skip
    elif isinstance(device, str):
        kind, ordinal = _parse(device)
    else:
        raise errors.user_error(errors.DTypeError, op, f"device must be an int, a string such "
                                f"as 'cuda:1' or a gpk.Device, got {device!r}")  # fmt: skip
    running = devices.kind()
    if kind == "cpu" and running == "cuda":
        raise errors.user_error(errors.GPUKitValueError, op, f"{Device(f'cpu:{ordinal}')} is "
                                "a device of the CPU backend; this process runs on CUDA (copy "
                                "to the host with to_numpy())")  # fmt: skip
    n = devices.count()
    if ordinal >= n:
        hint = " (PYGPUKIT_CPU_DEVICES sets how many the CPU backend simulates)" \
            if running == "cpu" else ""  # fmt: skip
        many = "s" * (n != 1)
        raise errors.user_error(errors.GPUKitValueError, op, f"device {ordinal} does not exist: "
                                f"the {running} backend has {n} device{many}{hint}")  # fmt: skip
    return ordinal


def copy_to(x: Any, device: Any) -> Any:
    """A copy of array `x` on `device` (see GPUArray.to): peer to peer between GPUs that can
    reach each other, else through host memory; `x` itself when it is already there."""
    from pygpukit.array import GPUArray

    if not isinstance(x, GPUArray):
        raise errors.user_error(errors.DTypeError, "copy_to", f"expected a GPUArray, got "
                                f"{type(x).__name__}")  # fmt: skip
    return x.to(device)
