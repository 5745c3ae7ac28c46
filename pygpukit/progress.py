"""Progress for work that may take more than a moment: loading weights, compiling kernels.

On a terminal: one line on stderr, redrawn in place, drawn only once the work has taken
DELAY seconds (quick work stays silent) and erased or ended when it is done. In every
case one record goes to the `pygpukit` logger when the work ends: INFO for a load (one a
model), and for a step INFO when it was slow, DEBUG when not (a kernel from the disk
cache); `pygpukit -v` shows INFO, `-vv` DEBUG. `pygpukit -q`, or any logger level above
WARNING, hides the terminal line as well.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

DELAY = 0.5  # seconds: "more than a moment"
_log = logging.getLogger(__name__)


def on_terminal() -> bool:
    """Whether a progress line may be drawn: stderr is a TTY and the logger not quieted."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) and logging.getLogger("pygpukit").isEnabledFor(logging.WARNING)


class ProgressBar:
    """A byte-counting bar: `label [#####     ] 12.0/40.0 MB 1.20 GB/s`.

    show None: drawn on a terminal once DELAY has passed; True: drawn at once, wherever
    stderr goes; False: never drawn. The logger hears of the finish in every case.
    """

    def __init__(self, total_bytes: int, show: bool | None = None, label: str = "loading") -> None:
        self.total, self.done, self.label = total_bytes, 0, label
        self.show = on_terminal() if show is None else show
        self.delay = DELAY if show is None else 0.0
        self.drawn = False
        self.t0 = time.perf_counter()

    def update(self, nbytes: int) -> None:
        """Count `nbytes` more as done and redraw the line when it is shown."""
        self.done += nbytes
        dt = time.perf_counter() - self.t0
        if not self.show or dt < self.delay:
            return
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        sys.stderr.write(
            f"\r{self.label} [{bar:<30}] {self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB "
            f"{self.done / 1e9 / max(dt, 1e-9):5.2f} GB/s"
        )
        sys.stderr.flush()
        self.drawn = True

    def finish(self) -> None:
        """End the drawn line and log the total, time and rate."""
        dt = time.perf_counter() - self.t0
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        _log.info(f"{self.label}: {self.done / 1e6:.1f} MB in {dt:.2f} s "
                  f"({self.done / 1e9 / max(dt, 1e-9):.2f} GB/s)")  # fmt: skip


@contextmanager
def slow_step(what: str) -> Iterator[None]:
    """`what...` on a terminal while the block runs, if it runs past DELAY (a timer
    thread draws it: the block may be one long native call); then the time is logged."""
    t0 = time.perf_counter()
    lock = threading.Lock()
    state = {"drawn": False, "done": False}
    text = f"{what} ..."

    def draw() -> None:
        with lock:
            if not state["done"]:
                sys.stderr.write("\r" + text)
                sys.stderr.flush()
                state["drawn"] = True

    timer = threading.Timer(DELAY, draw) if on_terminal() else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        with lock:
            state["done"] = True
            if state["drawn"]:  # erase it: the next output starts on a clean line
                sys.stderr.write("\r" + " " * len(text) + "\r")
                sys.stderr.flush()
        dt = time.perf_counter() - t0
        _log.log(logging.INFO if dt >= DELAY else logging.DEBUG, f"{what}: {dt:.2f} s")
