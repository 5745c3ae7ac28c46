"""Clocks the scheduler paces against: wall time, or a simulated GPU clock (CPU backend)."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable


class Clock:
    """Milliseconds since the scheduler started, plus timers that fire at clock times."""

    simulated = False

    def __init__(self) -> None:
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        raise NotImplementedError

    def call_at(self, t_ms: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (float(t_ms), next(self._seq), fn))

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def due(self, now: float) -> list[Callable[[], None]]:
        out = []
        while self._timers and self._timers[0][0] <= now:
            out.append(heapq.heappop(self._timers)[2])
        return out


class WallClock(Clock):
    def __init__(self) -> None:
        super().__init__()
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return (time.perf_counter() - self._t0) * 1e3


class SimClock(Clock):
    """Moves only when the dispatcher advances it to the next event (a launch ending, a
    timer, a tenant back within its share), so runs are deterministic."""

    simulated = True

    def __init__(self) -> None:
        super().__init__()
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance_to(self, t_ms: float) -> None:
        self._t = max(self._t, t_ms)
