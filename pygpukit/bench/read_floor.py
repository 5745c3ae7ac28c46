"""The floor under a bandwidth figure at a few MB: a kernel that only reads N bytes (no
arithmetic), timed as the decode attention is (20 dependent launches in a CUDA graph,
inputs rotated past L2), with its loads issued before or after the programmatic-dependent
wait, alone or followed by a tiny dependent kernel (like the split-K merge).

The byte counts are what the decode attention reads (K and V of 4 KV heads, D 128, bf16,
plus q and o of 32 heads) at context 8192 and 1024, so its time can be read against these.
One of the `python -m pygpukit.bench` groups; this writes bench/results/<device>-read-floor.json:

    python -m pygpukit.bench --only copy,read_floor --json
"""

from __future__ import annotations

import functools
from typing import Any

from pygpukit.backends.cuda import toolchain
from pygpukit.backends.cuda.kernels import loader

from .kernels import _sets_for, _stream, time_graph

CONTEXTS = (8192, 1024)
GRIDS_PER_SM = (1, 2)  # one block per SM, then two


def decode_bytes(ctx: int, heads: int = 32, kv_heads: int = 4, head_dim: int = 128) -> int:
    """Bytes one batch-1 bf16 decode-attention call reads and writes: K and V of the
    context, q and o."""
    return 2 * ctx * kv_heads * head_dim * 2 + 2 * heads * head_dim * 2


# Each block copies its contiguous share into shared memory by cp.async, all at once
# (before the wait when early), then sums it; the merge kernel reads one float per block.
PROBE = r"""
extern "C" __global__ void __launch_bounds__(256)
    pgk_floor_read(const float4* src, float* out, long long n16, int early) {
  extern __shared__ __align__(16) float4 buf[];
  const long long b0 = blockIdx.x * n16;
  if (early) {
    for (int i = threadIdx.x; i < n16; i += blockDim.x) pgk_cp_async16(buf + i, src + b0 + i, true);
    pgk_cp_async_commit();
  }
  pgk_pdl_wait();
  pgk_pdl_trigger();
  if (!early) {
    for (int i = threadIdx.x; i < n16; i += blockDim.x) pgk_cp_async16(buf + i, src + b0 + i, true);
    pgk_cp_async_commit();
  }
  pgk_cp_async_wait<0>();
  float s = 0.f;
  for (int i = threadIdx.x; i < n16; i += blockDim.x) s += buf[i].x + buf[i].w;
  s = pgk_warp_sum(s);
  if ((threadIdx.x & 31) == 0) atomicAdd(out + blockIdx.x, s);
}
extern "C" __global__ void __launch_bounds__(128)
    pgk_floor_merge(const float* src, float* out, int n) {
  pgk_pdl_trigger();
  pgk_pdl_wait();
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(src + i);
  s = pgk_warp_sum(s);
  if ((threadIdx.x & 31) == 0) atomicAdd(out + blockIdx.x, s);
}
"""


def probe_source() -> str:
    """The probe kernels with the float32 defines and common.cuh in front, as NVRTC sees it."""
    defines = "\n".join(f"#define {k} {v}" for k, v in loader.type_defines("float32").items())
    common = (loader.kernel_dir() / "common.cuh").read_text(encoding="ascii")
    return f"{defines}\n{common}\n{PROBE}"


def _launch(bufs: list[Any], read: Any, merge: Any, out: Any, grid: int, n16: int,
            early: int, pdl: bool, i: int) -> None:  # fmt: skip
    read.launch((grid,), (256,), "PPqi", (bufs[i].data_ptr(), out.data_ptr(), n16, early),
                n16 * 16, _stream(), pdl=pdl)  # fmt: skip
    if merge is not None:
        merge.launch((32,), (128,), "PPi", (out.data_ptr(), out.data_ptr() + 4 * 2048, grid), 0,
                     _stream(), pdl=pdl)  # fmt: skip


def bench_read_floor(rows: list[dict[str, Any]], copy_gbs: float, use_compile: bool) -> None:
    """Appends one row per (bytes, grid, early, merge); use_compile is unused (no peer)."""
    import torch

    import pygpukit._native as _native

    cubin = loader.compile_source(probe_source(), toolchain.device_arch(), ("-std=c++17",))
    mod = _native.Module(cubin)
    read, merge = mod.get_function("pgk_floor_read"), mod.get_function("pgk_floor_merge")
    smem_max = loader.max_shared_optin()
    read.set_max_dynamic_shared_memory(smem_max)
    pdl = loader.pdl_enabled()
    out = torch.zeros(4096, device="cuda")
    for nbytes in (decode_bytes(ctx) for ctx in CONTEXTS):
        sets = _sets_for(nbytes)
        bufs = [torch.randn(nbytes // 4, device="cuda") for _ in range(sets)]
        for grid in (k * toolchain.sm_count() for k in GRIDS_PER_SM):
            n16 = nbytes // 16 // grid
            if n16 * 16 > smem_max:
                continue
            for early in (0, 1):
                for with_merge in (0, 1):
                    args = (read, merge if with_merge else None, out, grid, n16, early, pdl)
                    us = time_graph(functools.partial(_launch, bufs, *args), sets)
                    gbs = nbytes / us / 1e3
                    when = "before" if early else "after"
                    rows.append({
                        "bench": "kernels",
                        "workload": f"read floor {nbytes} B grid {grid} loads {when} wait"
                                    + (" + merge" if with_merge else ""),
                        "bytes": nbytes, "grid": grid, "early": early, "merge": with_merge,
                        "us": round(us, 2), "GB/s": round(gbs, 1),
                        "pct_copy_bw": round(100 * gbs / copy_gbs, 1) if copy_gbs else None,
                    })  # fmt: skip
