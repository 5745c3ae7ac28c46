"""gpk.Scheduler: compiled graphs as scheduled workloads (admission, QoS, partitions,
pacing by GPU time), over the Rust core pygpukit._rust.SchedulerCore."""

from .scheduler import Scheduler
from .task import Task

__all__ = ["Scheduler", "Task"]
