"""The backend interface: allocate, copy in/out, run a lowered Schedule."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from pygpukit.memory import Storage
from pygpukit.passes import Schedule


class ReadyTransfer:
    """A host copy that is already complete (backends without queued work)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def done(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        return self._array


class Backend(ABC):
    name: str

    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Any:
        """A backend value holding a copy of `array`."""

    @abstractmethod
    def to_numpy(self, value: Any) -> np.ndarray:
        """A fresh host copy of the value."""

    def to_numpy_async(self, value: Any) -> Any:
        """A transfer whose result() is the host copy; result() waits for that copy only,
        not for work queued after it."""
        return ReadyTransfer(self.to_numpy(value))

    @abstractmethod
    def run(self, schedule: Schedule, inputs: list[Any]) -> list[Any]:
        """Execute the schedule; inputs bind to schedule.input_slots in order."""

    @abstractmethod
    def storage(self, value: Any) -> Storage:
        """The pool block behind a value (several views may share one)."""

    @abstractmethod
    def strides(self, value: Any) -> tuple[int, ...]:
        """Strides in bytes, as NumPy reports them."""

    @abstractmethod
    def layout_key(self, value: Any) -> Any:
        """What about a value's layout a cached schedule depends on."""

    @abstractmethod
    def pool_stats(self) -> dict[str, Any]:
        """The pool's statistics."""

    def synchronize(self) -> None:  # noqa: B027 - only the CUDA backend has queued work
        """Wait for queued work (nothing to wait for on the CPU)."""
