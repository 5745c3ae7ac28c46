"""The paged KV-cache kernels (codegen/paged.py) compile with NVRTC for sm_80 and sm_90 in
every float dtype, and the CUDA backend plans paged_write and paged_sdpa steps (launch
arguments checked against each kernel's format) -- without a GPU. Their numbers are
checked against the float64 reference on the GPU (tests/gpu/test_paged_attention_gpu.py)."""

from __future__ import annotations

import cuda_fakes
import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import runtime
from pygpukit.backends.cuda.codegen import paged
from pygpukit.backends.cuda.context import contiguous
from pygpukit.backends.cuda.plan import plan_step
from pygpukit.backends.cuda.toolchain import compile_kernel
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import dtypes, toposort
from pygpukit.passes import lower, run_pipeline

pytest.importorskip("nvidia")
ARCHS = ["sm_80", "sm_90"]
FLOATS = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", FLOATS)
def test_paged_kernels_compile(arch, d):
    dt, i32, i64 = dtypes.as_dtype(d), dtypes.int32, dtypes.int64
    assert compile_kernel(paged.write_kernel(paged.WriteSpec(dt, dt, i64)).text, arch)
    assert compile_kernel(paged.write_kernel(paged.WriteSpec(dt, dtypes.float32, i32)).text, arch)
    assert compile_kernel(paged.attend_kernel(paged.AttendSpec(dt, i32, i32)).text, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_paged_steps_plan(arch, monkeypatch):
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(0)
    bf = "bfloat16"
    kp = gpk.asarray(rng.standard_normal((6, 2, 4, 16)).astype(np.float32)).astype(bf)
    vp = gpk.asarray(rng.standard_normal((6, 2, 4, 16)).astype(np.float32)).astype(bf)
    new = gpk.asarray(rng.standard_normal((3, 2, 16)).astype(np.float32)).astype(bf)
    gpk.nn.paged_write(kp, new, np.array([1, -1, 9]))
    gpk.nn.paged_write(vp, new, np.array([1, -1, 9]))
    q = gpk.asarray(rng.standard_normal((3, 4, 1, 16)).astype(np.float32)).astype(bf)
    out = gpk.nn.paged_attention(q, kp, vp, np.array([[0, 2], [1, 0], [3, 4]], np.int32),
                                 np.array([7, 2, 0], np.int32))  # fmt: skip
    order = toposort([out.node], is_leaf=lambda n: n.realized is not None)
    graph, leaves = runtime._graph_of(order, [out.node])
    sched = lower(run_pipeline(graph))
    ctx = cuda_fakes.FakeCtx()
    env: list = [None] * sched.n_slots
    for s, n in zip(sched.input_slots, leaves, strict=True):
        st = cuda_fakes.FakeStorage(max(1, int(np.prod(n.shape))) * n.dtype.itemsize)
        env[s] = DeviceValue(st, n.shape, contiguous(n.shape), 0, n.dtype)  # type: ignore[arg-type]
    ops = []
    cuda_fakes.LAUNCHES.clear()
    for step in sched.steps:
        ins = [env[i] for i in step.ins]
        env[step.out] = plan_step(ctx, step, ins)(ins)  # type: ignore[arg-type]
        assert env[step.out].shape == step.shape
        ops.append(step.op)
    assert "paged_sdpa" in ops and ops.count("paged_write") == 2
    names = [name for name, _, _ in cuda_fakes.LAUNCHES]
    assert any("paged_sdpa" in n for n in names) and any("paged_write" in n for n in names)
