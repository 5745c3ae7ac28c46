"""`pygpukit demo`: a transformer block on random weights, lazy and eager, vs float64 NumPy."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

import pygpukit as gpk
from pygpukit import runtime

# float32 end to end; GPU reductions reorder sums, so allow more than one rounding.
TOLERANCE = 1e-4


@dataclass
class BlockConfig:
    seq: int = 16
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def make_weights(cfg: BlockConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hd, kv = cfg.head_dim, cfg.kv_heads * cfg.head_dim

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)

    ang = np.arange(cfg.seq)[:, None] / 10000 ** (np.arange(hd // 2)[None, :] / (hd // 2))
    return {
        "x": rng.standard_normal((1, cfg.seq, cfg.dim)).astype(np.float32),
        "attn_norm": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32),
        "wqkv": w(cfg.dim + 2 * kv, cfg.dim),
        "wo": w(cfg.dim, cfg.dim),
        "mlp_norm": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32),
        "w_gate": w(cfg.ffn, cfg.dim),
        "w_up": w(cfg.ffn, cfg.dim),
        "w_down": w(cfg.dim, cfg.ffn),
        "cos": np.cos(ang).astype(np.float32),
        "sin": np.sin(ang).astype(np.float32),
    }


def block(cfg: BlockConfig, p: dict[str, gpk.GPUArray]) -> gpk.GPUArray:
    """Pre-norm attention (RoPE, GQA, causal) and a SwiGLU MLP, written with the GPUArray API."""
    x = p["x"]
    b, t, d = x.shape
    hd, kvd = cfg.head_dim, cfg.kv_heads * cfg.head_dim
    h = gpk.nn.rms_norm(x, p["attn_norm"], cfg.eps)
    qkv = h @ p["wqkv"].T
    q = qkv[..., :d].reshape(b, t, cfg.heads, hd).transpose(0, 2, 1, 3)
    k = qkv[..., d : d + kvd].reshape(b, t, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
    v = qkv[..., d + kvd :].reshape(b, t, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
    q = gpk.nn.rope(q, p["cos"], p["sin"])
    k = gpk.nn.rope(k, p["cos"], p["sin"])
    a = gpk.nn.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + a.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["wo"].T
    h = gpk.nn.rms_norm(x, p["mlp_norm"], cfg.eps)
    return x + gpk.nn.swiglu(h @ p["w_gate"].T, h @ p["w_up"].T) @ p["w_down"].T


def reference(cfg: BlockConfig, w: dict[str, np.ndarray]) -> np.ndarray:
    """The same block in float64 NumPy, written independently of PyGPUkit."""
    p = {k: v.astype(np.float64) for k, v in w.items()}
    x = p["x"]
    b, t, d = x.shape
    hd, kvd = cfg.head_dim, cfg.kv_heads * cfg.head_dim

    def rms(v: np.ndarray, g: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + cfg.eps) * g

    def rope(v: np.ndarray) -> np.ndarray:
        v1, v2 = v[..., : hd // 2], v[..., hd // 2 :]
        c, s = p["cos"], p["sin"]
        return np.concatenate([v1 * c - v2 * s, v2 * c + v1 * s], -1)

    h = rms(x, p["attn_norm"])
    qkv = h @ p["wqkv"].T
    q = qkv[..., :d].reshape(b, t, cfg.heads, hd).transpose(0, 2, 1, 3)
    k = qkv[..., d : d + kvd].reshape(b, t, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
    v = qkv[..., d + kvd :].reshape(b, t, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
    q, k = rope(q), rope(k)
    rep = cfg.heads // cfg.kv_heads
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)) @ v
    x = x + a.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["wo"].T
    h = rms(x, p["mlp_norm"])
    g = h @ p["w_gate"].T
    return x + (g / (1 + np.exp(-g)) * (h @ p["w_up"].T)) @ p["w_down"].T


def run_demo(seed: int = 0, repeats: int = 5) -> dict[str, float]:
    cfg = BlockConfig()
    w = make_weights(cfg, seed)
    ref = reference(cfg, w)
    params = {k: gpk.from_numpy(v) for k, v in w.items()}
    print(f"pygpukit demo: transformer block on the {gpk.backend_name()} backend")
    print(f"  seq={cfg.seq} dim={cfg.dim} heads={cfg.heads} kv_heads={cfg.kv_heads} ffn={cfg.ffn}")

    out = block(cfg, params)
    print("\nrecorded graph (lazy, before running):")
    print(runtime.pending_graph([out.node], name="block"))

    timings: dict[str, float] = {}
    results: dict[str, np.ndarray] = {}
    for mode in ("lazy", "eager"):
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            with gpk.eager(mode == "eager"):
                y = block(cfg, params).to_numpy()
            best = min(best, time.perf_counter() - t0)
        timings[mode] = best * 1e3
        results[mode] = y

    print("\nresults vs float64 NumPy reference:")
    errors = {}
    for mode, y in results.items():
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        errors[mode] = err
        status = "ok" if err < TOLERANCE else "MISMATCH"
        timing = f"best of {repeats}: {timings[mode]:.2f} ms"
        print(f"  {mode:<6} rel. error {err:.2e}  {status}   {timing}")
    agree = float(np.max(np.abs(results["lazy"] - results["eager"])))
    print(f"  lazy vs eager max |diff| {agree:.2e}")
    if max(errors.values()) >= TOLERANCE:
        raise SystemExit("demo: results do not match the reference")
    return {
        **{f"{k}_ms": v for k, v in timings.items()},
        **{f"{k}_err": v for k, v in errors.items()},
    }
