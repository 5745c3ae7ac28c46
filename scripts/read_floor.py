"""The floor under a bandwidth figure at a few MB: a kernel that only reads N bytes (no
arithmetic), launched as the decode attention is timed (20 dependent launches in a CUDA
graph, rotating inputs past L2), with its loads issued before or after the programmatic-
dependent wait, alone or followed by a tiny dependent kernel (like the split-K merge).
The decode attention at B1 ctx 8192 reads 16.8 MB; compare its time with these.

    python scripts/read_floor.py [--bytes 16793600,2113536]
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

import torch

from pygpukit.backends.cuda import toolchain
from pygpukit.backends.cuda.kernels import loader
from pygpukit.bench.kernels import _sets_for, _stream, time_graph

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


def _launch(bufs: list, read: Any, merge: Any, out: Any, grid: int, n16: int, early: int,
            pdl: bool, i: int) -> None:  # fmt: skip
    read.launch((grid,), (256,), "PPqi", (bufs[i].data_ptr(), out.data_ptr(), n16, early),
                n16 * 16, _stream(), pdl=pdl)  # fmt: skip
    if merge is not None:
        merge.launch((32,), (128,), "PPi", (out.data_ptr(), out.data_ptr() + 4 * 2048, grid), 0,
                     _stream(), pdl=pdl)  # fmt: skip


def main() -> None:
    import pygpukit._native as _native

    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", default="16793600,2113536")
    a = ap.parse_args()
    defines = "\n".join(f"#define {k} {v}" for k, v in loader.type_defines("float32").items())
    common = (loader.kernel_dir() / "common.cuh").read_text(encoding="ascii")
    cubin = loader.compile_source(f"{defines}\n{common}\n{PROBE}", toolchain.device_arch(),
                                  ("-std=c++17",))  # fmt: skip
    mod = _native.Module(cubin)
    read, merge = mod.get_function("pgk_floor_read"), mod.get_function("pgk_floor_merge")
    smem_max = loader.max_shared_optin()
    read.set_max_dynamic_shared_memory(smem_max)
    pdl = loader.pdl_enabled()
    out = torch.zeros(4096, device="cuda")
    for nbytes in (int(x) for x in a.bytes.split(",")):
        sets = _sets_for(nbytes)
        bufs = [torch.randn(nbytes // 4, device="cuda") for _ in range(sets)]
        for grid in (132, 264):
            n16 = nbytes // 16 // grid
            if n16 * 16 > smem_max:
                continue
            for early in (0, 1):
                for with_merge in (0, 1):
                    args = (read, merge if with_merge else None, out, grid, n16, early, pdl)
                    call = functools.partial(_launch, bufs, *args)
                    us = time_graph(call, sets)
                    row = {"bytes": nbytes, "grid": grid, "early": early, "merge": with_merge,
                           "us": round(us, 2), "GB/s": round(nbytes / us / 1e3, 1)}  # fmt: skip
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
