"""CUDA C generated from schedule steps: one small module per kernel family.

Every generator returns a KernelSource (text, kernel name, parameter format) that depends
only on types, ranks and layout classes, never on sizes, so one compiled kernel serves
every shape of its kind.
"""

from .source import KernelSource

__all__ = ["KernelSource"]
