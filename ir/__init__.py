"""The graph IR of PyGPUkit: ops with shape/dtype rules, Node, Graph, printer.

Pure Python; no backend knowledge.
"""

from . import dtypes, indexing, ops, shapes
from .dtypes import DType
from .graph import Graph, GraphError, toposort
from .node import Node
from .printer import format_graph
from .source import SourceLoc, user_location

__all__ = [
    "DType", "Graph", "GraphError", "Node", "SourceLoc", "dtypes", "format_graph", "indexing",
    "ops", "shapes", "toposort", "user_location",
]  # fmt: skip
