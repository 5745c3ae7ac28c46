"""Host-side cost of one eager launch through _native (Function.launch), in microseconds.

Usage: python3 scripts/native_launch_overhead.py  (needs a GPU)
"""

from __future__ import annotations

import time

from pygpukit import _native as nv
from pygpukit.backends.cuda import toolchain

SOURCE = r"""
extern "C" __global__ void add_scalar(float* y, const float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + s;
}
"""


def main() -> None:
    fn = nv.Module(toolchain.compile_kernel(SOURCE, toolchain.device_arch())).get_function(
        "add_scalar"
    )
    n = 1024
    x, y = nv.mem_alloc(n * 4), nv.mem_alloc(n * 4)
    stream = nv.Stream()
    args = (y, x, 1.0, n)
    for _ in range(1000):
        fn.launch(4, 256, "PPfi", args, stream=stream)
    stream.synchronize()
    reps = 20000
    t0 = time.perf_counter()
    for _ in range(reps):
        fn.launch(4, 256, "PPfi", args, stream=stream)
    t1 = time.perf_counter()
    stream.synchronize()
    print(f"Function.launch: {(t1 - t0) / reps * 1e6:.2f} us per launch (host side)")

    stream.begin_capture()
    for _ in range(100):
        fn.launch(4, 256, "PPfi", args, stream=stream)
    exe = stream.end_capture().instantiate()
    exe.launch(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        exe.launch(stream)
    stream.synchronize()
    t1 = time.perf_counter()
    print(f"graph of 100 launches: {(t1 - t0) / 100 * 1e6:.1f} us per replay (end to end)")
    nv.mem_free(x)
    nv.mem_free(y)


if __name__ == "__main__":
    main()
