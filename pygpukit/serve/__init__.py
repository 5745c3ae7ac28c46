"""pygpukit.serve: continuous batching over a paged KV cache, and an OpenAI-compatible
HTTP server on it (`pygpukit serve MODEL`)."""

from __future__ import annotations

from .engine import Engine, Event, Overloaded, Request

__all__ = ["Engine", "Event", "Overloaded", "Request"]
