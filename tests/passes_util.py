"""Helpers for the pass and compile tests: graphs from lazy code, float64 references."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import pygpukit as gpk
from pygpukit import runtime
from pygpukit.ir import Graph
from pygpukit.passes.pipeline import PIPELINE, run_pipeline


def arr(rng: np.random.Generator, *shape: int, dtype: str = "float32", lo: float = -2.0,
        hi: float = 2.0) -> np.ndarray:  # fmt: skip
    a = rng.uniform(lo, hi, size=shape)
    return a.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def record(fn: Callable[..., Any], *inputs: np.ndarray) -> tuple[Graph, list[gpk.GPUArray]]:
    """The recorded (unfused) graph of fn on these inputs, and fn's lazy results."""
    outs = fn(*[gpk.from_numpy(a) for a in inputs])
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    return runtime.pending_graph([o.node for o in outs], getattr(fn, "__name__", "g")), outs


def fused(fn: Callable[..., Any], *inputs: np.ndarray) -> Graph:
    g, _ = record(fn, *inputs)
    return run_pipeline(g)


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes if n.op != "input"]


def report(g: Graph, pattern: str, status: str) -> list[dict[str, Any]]:
    return [r for r in g.report if r["pattern"] == pattern and r["status"] == status]


def run_lazy(fn: Callable[..., Any], *inputs: np.ndarray) -> list[np.ndarray]:
    outs = fn(*[gpk.from_numpy(a) for a in inputs])
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    return [o.to_numpy() for o in outs]


def run_unfused(fn: Callable[..., Any], *inputs: np.ndarray) -> list[np.ndarray]:
    saved = list(PIPELINE)
    PIPELINE[:] = []
    runtime._SCHEDULE_CACHE.clear()
    try:
        return run_lazy(fn, *inputs)
    finally:
        PIPELINE[:] = saved
        runtime._SCHEDULE_CACHE.clear()


def f64(a: Any) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def close(out: Any, ref: Any, dtype: str = "float32", factor: float = 1.0) -> None:
    rtol = {"float64": 1e-12, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype] * factor
    ref = f64(ref)
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(f64(out), ref, rtol=rtol, atol=rtol * scale)


def gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def softmax64(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def rms64(x: np.ndarray, g: np.ndarray | float, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope64(x: np.ndarray, c: np.ndarray, s: np.ndarray, interleaved: bool) -> np.ndarray:
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
        return out
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def sdpa64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        mask = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
        s = np.where(mask, -np.inf, s)
    return softmax64(s) @ v
