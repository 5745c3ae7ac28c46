"""Device: where an array's memory lives, as `a.device` reports it (`<Device cuda:0>`)."""

from __future__ import annotations

from typing import Any

from pygpukit import errors


class Device:
    """A CUDA GPU by ordinal (`gpk.Device(0)`, `gpk.Device("cuda:0")`) or the host
    (`gpk.Device("cpu")`, the NumPy backend). Equal devices compare and hash alike."""

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
        return "cpu" if self.kind == "cpu" else f"cuda:{self.id}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self.kind, self.id) == (other.kind, other.id)

    def __hash__(self) -> int:
        return hash((self.kind, self.id))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (str(self),))


def _parse(text: str) -> tuple[str, int]:
    kind, _, ordinal = text.strip().lower().partition(":")
    if kind == "cpu" and not ordinal:
        return "cpu", 0
    if kind in ("cuda", "gpu") and (not ordinal or ordinal.isdigit()):
        return "cuda", int(ordinal or 0)
    raise errors.user_error(errors.GPUKitValueError, "Device", f"expected 'cpu' or 'cuda[:N]', "
                            f"got {text!r}")  # fmt: skip


def current_device() -> Device:
    """The device the running backend's arrays live on."""
    from pygpukit.backends import get_backend

    if get_backend().name == "cuda":
        from pygpukit import _native

        return Device(int(_native.get_device()))
    return Device("cpu")
