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
from pygpukit.backends.cuda.kernels import paged_decode, paged_plan
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
    for rope in ("half", "interleaved"):  # keys rotated on the way into the pool
        assert compile_kernel(paged.write_kernel(paged.WriteSpec(dt, dt, i64, rope)).text, arch)
        # and several elements of a row a thread (paged_plan.WRITE_VEC)
        spec = paged.WriteSpec(dt, dt, i64, rope, paged_plan.WRITE_VEC)
        assert compile_kernel(paged.write_kernel(spec).text, arch)


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


def _plan_attention(q, kp, vp, table, lens, pieces=True, **rope):
    out = gpk.nn.paged_attention(q, kp, vp, table, lens, pieces=pieces, **rope)
    return _plan_node(out.node)


def _plan_node(node):
    """(kernel name, grid) of each launch the CUDA plans of node's graph make (faked)."""
    order = toposort([node], is_leaf=lambda n: n.realized is not None)
    graph, leaves = runtime._graph_of(order, [node])
    sched = lower(run_pipeline(graph))
    ctx = cuda_fakes.FakeCtx()
    env: list = [None] * sched.n_slots
    for s, n in zip(sched.input_slots, leaves, strict=True):
        st = cuda_fakes.FakeStorage(max(1, int(np.prod(n.shape))) * n.dtype.itemsize)
        env[s] = DeviceValue(st, n.shape, contiguous(n.shape), 0, n.dtype)  # type: ignore[arg-type]
    cuda_fakes.LAUNCHES.clear()
    for step in sched.steps:
        ins = [env[i] for i in step.ins]
        env[step.out] = plan_step(ctx, step, ins)(ins)  # type: ignore[arg-type]
        assert env[step.out].shape == step.shape
    return [(name, grid) for name, grid, _ in cuda_fakes.LAUNCHES]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "dtype, b, t, kind",
    [
        ("bfloat16", 1, 1, "split"),
        ("bfloat16", 64, 1, "one"),
        ("float16", 2, 16, "prefill"),
        ("float32", 1, 1, "split"),
        ("float32", 64, 1, "one"),
    ],
)
def test_paged_sdpa_plans_the_split_kernel(arch, dtype, b, t, kind, monkeypatch):
    """int32 tables and lengths with head size 64 take paged_decode.cuh: one query per row
    splits the keys (and merges), many queries run one split each; one bf16 / f16 query a
    row runs the tensor-core body (pgk_paged_decode_mma), the rest the CUDA-core one;
    int64 lengths keep the simple kernel."""
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(1)
    kp = gpk.asarray(rng.standard_normal((40, 4, 16, 64)).astype(np.float32)).astype(dtype)
    vp = gpk.asarray(rng.standard_normal((40, 4, 16, 64)).astype(np.float32)).astype(dtype)
    q = gpk.asarray(rng.standard_normal((b, 32, t, 64)).astype(np.float32)).astype(dtype)
    table = rng.integers(0, 40, size=(b, 32)).astype(np.int32)
    lens = rng.integers(t, 32 * 16, size=b).astype(np.int32)
    launches = _plan_attention(q, kp, vp, table, lens)
    mma = dtype != "float32" and t == 1
    name = "pgk_paged_decode_mma" if mma else "pgk_paged_decode"
    split = [grid for n, grid in launches if n == name]
    assert len(split) == 1
    assert not any(n.startswith("pgk_paged_decode") for n, _ in launches if n != name)
    splits, heads, rows = split[0]
    assert heads == 4 and rows == b * t  # one block row per kv head (its 8 query heads)
    merged = any(n == "pgk_attn_decode_reduce" for n, _ in launches)
    if kind == "split" and mma:  # SMs once rounded down, a 32-key tile per warp at most
        assert splits == min(132 // 4, 32 * 16 // (32 * 4))
        assert merged
    elif kind == "split":  # SMs once, one 64-key tile each at most
        assert splits == min(-(-132 // 4), 32 * 16 // 64)
        assert merged
    else:
        assert splits == 1 and not merged
    launches = _plan_attention(q, kp, vp, table, lens.astype(np.int64))
    assert not any(n.startswith("pgk_paged_decode") for n, _ in launches)
    assert any("paged_sdpa" in n for n, _ in launches)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "dtype, b, t, d, tiles",
    [
        ("bfloat16", 130, 1, 64, True),
        ("float16", 5, 1, 128, True),
        ("bfloat16", 1, 1, 64, False),
        ("bfloat16", 8, 2, 64, False),
        ("float32", 130, 1, 64, False),
    ],
)
def test_paged_sdpa_plans_the_piece_kernel(arch, dtype, b, t, d, tiles, monkeypatch):
    """One query per row in bf16 / f16 launches paged_prefill.cuh after the split kernel
    (and its merge): one block per 64 rows and pair of query heads (the GQA group of 4
    divides by 2), the rows of prompt pieces chosen on the device. One row, several
    queries a row or float32 launch it not."""
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(2)
    kp = gpk.asarray(rng.standard_normal((40, 2, 16, d)).astype(np.float32)).astype(dtype)
    vp = gpk.asarray(rng.standard_normal((40, 2, 16, d)).astype(np.float32)).astype(dtype)
    q = gpk.asarray(rng.standard_normal((b, 8, t, d)).astype(np.float32)).astype(dtype)
    table = rng.integers(0, 40, size=(b, 32)).astype(np.int32)
    lens = rng.integers(t, 32 * 16, size=b).astype(np.int32)
    launches = _plan_attention(q, kp, vp, table, lens)
    names = [name for name, _ in launches]
    grids = [grid for name, grid in launches if name == "pgk_paged_prefill"]
    assert any(n.startswith("pgk_paged_decode") for n in names)
    if tiles:
        assert grids == [(-(-b // 64) * 8 // 2,)]
        assert names.index("pgk_paged_prefill") == len(names) - 1  # after the merge
    else:
        assert not grids
    # decode_rows: the decode kernel's tensor-core body launches that many block rows
    # (each takes every decode_rows-th row), with one cp.async stage (the piece kernel runs
    # beside it) where unhinted launches size the stages to their blocks.
    if tiles:
        sized = []
        real = paged_decode.mma_stages
        monkeypatch.setattr(paged_decode, "mma_stages", lambda *a: sized.append(a) or real(*a))
        _plan_attention(q, kp, vp, table, lens)
        assert sized
        sized.clear()
        hinted = _plan_attention(q, kp, vp, table, lens, decode_rows=3)
        assert not sized
        (g,) = [grid for n, grid in hinted if n == "pgk_paged_decode_mma"]
        assert g[2] == (min(3, b) if g[0] == 1 else b)  # one split only
        hinted = _plan_attention(q, kp, vp, table, lens, decode_rows=b + 7)
        assert [g[2] for n, g in hinted if n == "pgk_paged_decode_mma"] == [b]
    # A step without prompt pieces (the engine's decode-only steps) launches the decode
    # kernel alone, told to take every row.
    launches = _plan_attention(q, kp, vp, table, lens, pieces=False)
    assert not any(n == "pgk_paged_prefill" for n, _ in launches)
    assert any(n.startswith("pgk_paged_decode") for n, _ in launches)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype, b", [("bfloat16", 130), ("float32", 3)])
def test_one_pool_of_keys_and_values_plans(arch, dtype, b, monkeypatch):
    """The serving model's layer: one paged_write stores the keys (rotated) and values into
    one pool [n_blocks, 2 KV, block, D], and paged_attention reads its two halves as views
    (blocks 2 KV block D elements apart): the same kernels plan as for separate pools (the
    tensor-core decode body and the piece kernel in bf16, the CUDA-core body in float32;
    int64 lengths the simple kernel), their arguments checked against each kernel."""
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(5)
    kv, d = 2, 64
    pool = gpk.asarray(rng.standard_normal((40, 2 * kv, 16, d)).astype(np.float32)).astype(dtype)
    new = gpk.asarray(rng.standard_normal((b, 2 * kv, d)).astype(np.float32)).astype(dtype)
    ang = rng.uniform(0, 6, size=(b, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    slots = rng.permutation(40 * 16)[:b].astype(np.int64)
    gpk.nn.paged_write(pool, new, slots, cos=cos, sin=sin, rope_heads=kv)
    q = gpk.asarray(rng.standard_normal((b, 8, 1, d)).astype(np.float32)).astype(dtype)
    table = rng.integers(0, 40, size=(b, 32)).astype(np.int32)
    lens = rng.integers(1, 32 * 16, size=b).astype(np.int32)
    names = [n for n, _ in _plan_attention(q, pool[:, :kv], pool[:, kv:], table, lens)]
    assert any(n.startswith("pgk_paged_write_") for n in names)
    if dtype == "bfloat16":
        assert "pgk_paged_decode_mma" in names and "pgk_paged_prefill" in names
    else:
        assert "pgk_paged_decode" in names
    simple = [n for n, _ in _plan_attention(q, pool[:, :kv], pool[:, kv:], table,
                                            lens.astype(np.int64))]  # fmt: skip
    assert any(n.startswith("pgk_paged_sdpa_") for n in simple)
    assert not any(n.startswith("pgk_paged_decode") for n in simple)


@pytest.mark.parametrize(
    "d, blocks, tiles, stages",
    [
        (64, 256, 5, 3),  # the batch-64 TinyLlama step: two blocks of 3 stages an SM
        (64, 256, 2, 2),  # no more stages than a warp has tiles
        (64, 16, 1, 1),  # batch 1: one tile a warp
        (64, 400, 5, 1),  # four blocks an SM: only one stage fits them in one wave
        (128, 256, 5, 1),  # a 128-wide head's 256 blocks: three an SM, one stage each
        (128, 132, 8, 3),  # one block an SM: three stages of a 128-wide head
    ],
)
def test_paged_decode_mma_stages(d, blocks, tiles, stages, monkeypatch):
    """The tensor-core body's cp.async stages per warp: as many as a warp has tiles, up to
    three, while the grid still fits the SMs (132, 228 KB each) in one wave."""
    from pygpukit.backends.cuda.kernels import paged_decode

    cuda_fakes.install(monkeypatch, "sm_90")
    assert paged_decode.mma_stages(d, blocks, tiles) == stages
    assert paged_decode.mma_tiles(640, 1) == 5 and paged_decode.mma_tiles(512, 4) == 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "dtype, b, interleaved, fused",
    [
        ("bfloat16", 130, False, True),
        ("float16", 3, False, True),
        ("bfloat16", 130, True, False),
        ("float32", 3, False, False),
    ],
)
def test_paged_sdpa_rotates_q_in_its_kernels(arch, dtype, b, interleaved, fused, monkeypatch):
    """paged_attention with cos / sin: in bf16 / f16 with half-split tables the tensor-core
    decode body and the piece kernel rotate q as they read it (no rope launch; their
    arguments checked against the templates); interleaved tables or float32 run the rope
    kernel first, then the attention as without rope."""
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(6)
    d = 64
    kp = gpk.asarray(rng.standard_normal((40, 2, 16, d)).astype(np.float32)).astype(dtype)
    vp = gpk.asarray(rng.standard_normal((40, 2, 16, d)).astype(np.float32)).astype(dtype)
    q = gpk.asarray(rng.standard_normal((b, 8, 1, d)).astype(np.float32)).astype(dtype)
    ang = rng.uniform(0, 6, size=(b, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    table = rng.integers(0, 40, size=(b, 32)).astype(np.int32)
    lens = rng.integers(1, 32 * 16, size=b).astype(np.int32)
    for pieces in (True, False):
        names = [n for n, _ in _plan_attention(q, kp, vp, table, lens, pieces=pieces, cos=cos,
                                               sin=sin, interleaved=interleaved)]  # fmt: skip
        mma = dtype != "float32"
        assert ("pgk_paged_decode_mma" if mma else "pgk_paged_decode") in names
        assert ("pgk_paged_prefill" in names) == (pieces and mma and b > 1)
        assert ("pgk_rope" in names) == (not fused)
        if not fused:
            assert names.index("pgk_rope") < names.index(names[-1])


def test_write_vec_where_the_store_is_wide():
    """paged_write stores WRITE_VEC elements a thread only where D is a multiple and a
    block of threads an SM is left: the serving engine's 1024-token store (TinyLlama KV
    heads), not its 64-row decode step's or rows of 6."""
    vec = paged_plan.WRITE_VEC
    assert paged_plan.write_vec(1024 * 8 * 64, 64, 132) == vec
    assert paged_plan.write_vec(64 * 8 * 64, 64, 132) == 1
    assert paged_plan.write_vec(1 << 24, 6, 132) == 1
    assert paged_plan.write_vec(132 * 256 * vec, 64, 132) == vec
    assert paged_plan.write_vec(132 * 256 * vec - 1, 64, 132) == 1


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize(("dtype", "b", "fused"),
                         [("bfloat16", 6, True), ("float16", paged_plan.APPEND_MAX_ROWS, True),
                          ("bfloat16", paged_plan.APPEND_MAX_ROWS + 1, False),
                          ("float32", 6, False)])  # fmt: skip
def test_paged_sdpa_append_plans(arch, dtype, b, fused, slot_dtype, monkeypatch):
    """paged_sdpa_append (fuse_paged_append's node): in bf16 / f16 up to APPEND_MAX_ROWS
    rows the tensor-core decode kernel stores the new rows itself, int32 or int64 slots
    (the serving engine's) alike (no paged_write launch; its arguments checked against
    the template); more rows, or float32, store them with paged_write's kernel into the
    pool, then attend."""
    cuda_fakes.install(monkeypatch, arch)
    rng = np.random.default_rng(7)
    h, kv, d = 8, 2, 64
    pool = gpk.asarray(rng.standard_normal((40, 2 * kv, 16, d)).astype(np.float32)).astype(dtype)
    q = gpk.asarray(rng.standard_normal((b, h, 1, d)).astype(np.float32)).astype(dtype)
    new = gpk.asarray(rng.standard_normal((b, 2 * kv, d)).astype(np.float32)).astype(dtype)
    ang = rng.uniform(0, 6, size=(b, d // 2))
    cos, sin = (gpk.asarray(f(ang).astype(np.float32)).astype(dtype) for f in (np.cos, np.sin))
    table = gpk.asarray(rng.integers(0, 40, size=(b, 8)).astype(np.int32))
    lens = gpk.asarray(rng.integers(1, 8 * 16, size=b).astype(np.int32))
    slots = gpk.asarray(rng.integers(0, 40 * 16, size=b).astype(slot_dtype))
    ins = tuple(x.node for x in (q, pool, new, slots, table, lens, cos, sin))
    node = runtime.record("paged_sdpa_append", ins, {"rope": "half"})
    names = [name for name, _ in _plan_node(node)]
    assert ("pgk_paged_decode_mma" in names) == (dtype != "float32")
    assert any("paged_write" in n for n in names) == (not fused)
