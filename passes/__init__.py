"""Graph -> Graph passes (import name pygpukit.passes), one file each, and lowering."""

from .lower import Schedule, Step, lower
from .pipeline import PIPELINE, run_pipeline

__all__ = ["PIPELINE", "Schedule", "Step", "lower", "run_pipeline"]
