"""The CUDA backend plans and compiles every op kind without a GPU (NVRTC, sm_80/sm_90).

Graphs come from the real front end; each step is planned by the CUDA backend over
device values of several layouts (contiguous, transposed, broadcast, unaligned), and every
generated kernel is compiled, so a codegen or planner bug fails CI.
"""

from __future__ import annotations

import cuda_fakes
import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import runtime
from pygpukit.backends.cuda.codegen import elementwise, reduce
from pygpukit.backends.cuda.context import contiguous
from pygpukit.backends.cuda.plan import plan_step
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import dtypes, toposort
from pygpukit.passes import lower, run_pipeline

pytest.importorskip("nvidia")
ARCHS = ["sm_80", "sm_90"]
DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "bool"]


def _schedule(out: gpk.GPUArray) -> tuple[object, list]:
    pending = [out.node]
    order = toposort(pending, is_leaf=lambda n: n.realized is not None)
    graph, leaves = runtime._graph_of(order, pending)
    return lower(run_pipeline(graph)), leaves


def _values(leaves: list, layout: str) -> list[DeviceValue]:
    vals = []
    for n in leaves:
        shape, d = n.shape, n.dtype
        st = cuda_fakes.FakeStorage(max(1, int(np.prod(shape))) * d.itemsize * 2)
        strides = contiguous(shape)
        offset = 0
        if layout == "transposed" and len(shape) >= 2:
            # Same shape, column-major memory.
            rev = contiguous(shape[::-1])[::-1]
            strides = tuple(rev)
        elif layout == "broadcast" and len(shape) >= 1:
            strides = (0,) + strides[1:]
        elif layout == "unaligned":
            offset = 1
        vals.append(DeviceValue(st, shape, strides, offset, d))  # type: ignore[arg-type]
    return vals


def _plan_all(out: gpk.GPUArray, layout: str) -> int:
    sched, leaves = _schedule(out)
    ctx = cuda_fakes.FakeCtx()
    env: list = [None] * sched.n_slots  # type: ignore[attr-defined]
    for s, v in zip(sched.input_slots, _values(leaves, layout), strict=True):  # type: ignore[attr-defined]
        env[s] = v
    for step in sched.steps:  # type: ignore[attr-defined]
        ins = [env[i] for i in step.ins]
        run = plan_step(ctx, step, ins)  # type: ignore[arg-type]
        env[step.out] = run(ins)
        res = env[step.out]
        assert res.shape == step.shape and res.dtype == step.dtype, step.op
        # Compiled mode: the result lands in the slot handed in (at an arena offset), or in
        # memory of its own that the executor then copies; never elsewhere in the arena.
        arena = cuda_fakes.FakeStorage(1 << 20)
        slot = DeviceValue(arena, step.shape, contiguous(step.shape), 64, step.dtype)  # type: ignore[arg-type]
        ctx.out = slot
        got = run(ins)
        ctx.out = None
        assert got.storage is not arena or got.offset == 64, step.op
    return len(sched.steps)  # type: ignore[attr-defined]


def _arr(rng: np.random.Generator, shape: tuple[int, ...], d: str) -> gpk.GPUArray:
    if d == "bool":
        return gpk.asarray(rng.random(shape) < 0.5)
    if d in ("int8", "uint8", "int32", "int64"):
        return gpk.asarray(rng.integers(1, 9, shape).astype(d))
    return gpk.asarray(rng.standard_normal(shape).astype(dtypes.as_dtype(d).np))


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    cuda_fakes.install(monkeypatch, request.param)
    return request.param


UNARY_FLOAT = ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf"]


@pytest.mark.parametrize("d", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "broadcast", "unaligned"])
def test_elementwise_every_op(arch: str, d: str, layout: str) -> None:
    rng = np.random.default_rng(0)
    x, y = _arr(rng, (5, 7), d), _arr(rng, (5, 7), d)
    outs = [
        x + y,
        x * y,
        x == y,
        x < y,
        gpk.maximum(x, y),
        gpk.minimum(x, y),
        gpk.where(x > y, x, y),
        x.astype("float16"),
        x.astype("int32"),
        x.astype("bool"),
    ]
    if d != "bool":
        outs += [x - y, -x, abs(x), x / y, x**y]
    else:
        outs += [~x, x & y, x | y]
    if d not in ("bool",):
        outs += [getattr(gpk, f)(x) for f in UNARY_FLOAT]
        outs += [gpk.nn.gelu(x), gpk.nn.gelu(x, approximate="tanh"), gpk.nn.silu(x)]
    for o in outs:
        _plan_all(o, layout)


@pytest.mark.parametrize("d", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_reductions(arch: str, d: str, layout: str) -> None:
    rng = np.random.default_rng(1)
    x = _arr(rng, (6, 300), d)
    for op in ("sum", "mean", "max", "min", "argmax", "prod", "any", "all", "argmin"):
        for axis, keep in ((None, False), (0, True), (1, False), ((0, 1), True)):
            if op in ("argmax", "argmin") and isinstance(axis, tuple):
                continue
            _plan_all(getattr(x, op)(axis=axis, keepdims=keep), layout)


@pytest.mark.parametrize("d", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_numpy_breadth_ops(arch: str, d: str, layout: str) -> None:
    """// and %, scans, sorts, var/std, dot/einsum, linspace/eye plan and compile."""
    rng = np.random.default_rng(2)
    x, y = _arr(rng, (6, 300), d), _arr(rng, (6, 300), d)
    outs = [gpk.cumsum(x, 1), gpk.cumprod(x, 0), gpk.cumsum(x), x // y, x % y, 3 % x,
            gpk.sort(x, 0), gpk.argsort(x), *gpk.topk(x, 5), *gpk.topk(x, 2, 0, False),
            gpk.var(x, 1), gpk.std(x, 0, ddof=1), gpk.dot(x, x.T),
            gpk.einsum("ij,kj->ki", x, y), gpk.linspace(-1, 2, 7, dtype=x.dtype),
            gpk.eye(3, 5, 1, dtype=x.dtype)]  # fmt: skip
    for o in outs:
        _plan_all(o, layout)


def test_sort_rows_past_one_block_are_unsupported(arch: str) -> None:
    x = gpk.asarray(np.ones((2, 1 << 15), np.float64))  # 393 KB of keys and positions a row
    with pytest.raises(gpk.errors.UnsupportedError, match="sort: rows of 32768 float64") as e:
        _plan_all(gpk.sort(x), "contiguous")
    assert isinstance(e.value, NotImplementedError) and "16384" in str(e.value)
    # A sampler's top-k (descending, k <= 64, floats) takes the radix select: any length.
    y = gpk.asarray(np.ones((2, 1 << 15), np.float32))
    cuda_fakes.LAUNCHES.clear()
    for part in gpk.topk(y, 50):
        _plan_all(part, "contiguous")
    assert {name for name, _, _ in cuda_fakes.LAUNCHES} == {"pgk_topk"}


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16", "float64", "int32", "bool"])
def test_movement_and_indexing(arch: str, d: str) -> None:
    rng = np.random.default_rng(2)
    x = _arr(rng, (4, 6, 8), d)
    pos = gpk.asarray(np.array(2, np.int64))
    idx = gpk.asarray(np.array([[0, 3], [-1, 2]], np.int32))
    outs = [
        x.reshape(6, 32),
        x.transpose(2, 0, 1).reshape(-1),
        x[1:3, ::2, None, -1],
        x[pos],
        x[:, pos],
        gpk.concatenate([x, x[:, :2]], axis=1),
        gpk.take(x, idx, axis=1),
        gpk.stack([x, x], axis=0),
        x.expand(2, 4, 6, 8) if False else gpk.broadcast_to(x, (2, 4, 6, 8)),
        gpk.full((3, 5), 2, dtype=d),
        gpk.arange(17, dtype=d if d != "bool" else "int32"),
        gpk.arange(0.5, 9.0, 0.25),
    ]
    for o in outs:
        for layout in ("contiguous", "transposed", "unaligned"):
            _plan_all(o, layout)
    c = gpk.asarray(np.zeros((2, 16, 8), dtypes.as_dtype(d).np))
    c[:, pos] = x[0, :2]
    _plan_all(c, "contiguous")
    c2 = gpk.asarray(np.zeros((2, 16, 8), dtypes.as_dtype(d).np))
    c2[1, 3:9:2] = 1
    _plan_all(c2, "transposed")


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16", "float64"])
def test_fused_nn_and_matmul(arch: str, d: str) -> None:
    rng = np.random.default_rng(3)
    x = _arr(rng, (2, 4, 8, 64), d)
    w, b = _arr(rng, (64,), d), _arr(rng, (64,), d)
    cos, sin = _arr(rng, (8, 32), d), _arr(rng, (8, 32), d)
    k = _arr(rng, (2, 2, 8, 64), d)
    lw, lb = _arr(rng, (48, 64), d), _arr(rng, (48,), d)
    outs = [
        gpk.nn.softmax(x),
        gpk.nn.softmax(x, axis=1),
        gpk.nn.log_softmax(x),
        gpk.nn.rms_norm(x, w),
        gpk.nn.layer_norm(x, w, b),
        gpk.nn.rope(x, cos, sin),
        gpk.nn.rope(x, cos, sin, interleaved=True),
        gpk.nn.scaled_dot_product_attention(x, k, k, is_causal=True),
        gpk.nn.scaled_dot_product_attention(
            x[:, :, :2],
            k,
            k,
            is_causal=True,
            kv_len=gpk.asarray(np.array(5)),
            kv_start=gpk.asarray(np.array([0, 2], np.int32)),
        ),
        gpk.nn.scaled_dot_product_attention(x[..., :40], k[..., :40], k[..., :40]),
        # head dim 40 with masks: zero-padded to 64 for the fused kernels
        gpk.nn.scaled_dot_product_attention(
            x[..., :40], k[..., :40], k[..., :40], is_causal=True, window=3
        ),  # fmt: skip
        gpk.nn.linear(x, lw, lb, activation="gelu_tanh"),
        gpk.nn.linear(x, lw),
        x @ x.swapaxes(-1, -2),
        x[0, 0] @ w,
        gpk.nn.swiglu(x, x),
        gpk.nn.swiglu(x, w),
        # Folded linears (passes/fold_into_linear.py): RMSNorm or SwiGLU prologue, residual.
        _folded(x, _arr(rng, (64, 64), d), x, w, "rms_norm"),
        _folded(x, lw, _arr(rng, (2, 4, 8, 48), d), x, "swiglu", bias=lb),
        _folded(x[:, :1, :1], lw, None, w, "rms_norm"),
    ]
    for o in outs:
        for layout in ("contiguous", "transposed"):
            _plan_all(o, layout)


def _folded(x: gpk.GPUArray, w: gpk.GPUArray, res: gpk.GPUArray | None, pro_arg: gpk.GPUArray,
            prologue: str, bias: gpk.GPUArray | None = None) -> gpk.GPUArray:  # fmt: skip
    from pygpukit import runtime

    ins = [x._node, w._node] + [a._node for a in (bias, res, pro_arg) if a is not None]
    attrs = {"has_bias": bias is not None, "has_residual": res is not None,
             "prologue": prologue, "eps": 1e-5, "activation": "none"}  # fmt: skip
    return gpk.GPUArray(runtime.record("linear", tuple(ins), attrs))


@pytest.mark.parametrize("d", ["int8", "int32", "int64"])
def test_integer_matmul_and_pow(arch: str, d: str) -> None:
    rng = np.random.default_rng(4)
    a, b = _arr(rng, (3, 5, 7), d), _arr(rng, (7, 4), d)
    _plan_all(a @ b, "contiguous")
    _plan_all(a**a, "transposed")


def test_fused_expression_kernels_compile(arch: str) -> None:
    f16, f32, i8, b = dtypes.float16, dtypes.float32, dtypes.int8, dtypes.bool_
    expr = (
        "where",
        ("gt", ("in", 0), ("const", 0.5, "float32")),
        ("gelu", "tanh", ("mul", ("in", 0), ("cast", "float16", ("in", 1)))),
        ("exp", ("neg", ("in", 0))),
    )
    for modes, out_mode, vec in [
        (("contig", "contig"), "contig", 8),
        (("strided", "scalar"), "strided", 1),
    ]:
        spec = elementwise.EwSpec(expr, (f16, f32), f16, modes, out_mode, 3, (), vec)
        cuda_fakes.FakeFunction(
            "x",
            __import__("pygpukit.backends.cuda.toolchain", fromlist=["x"]).compile_kernel(
                elementwise.generate(spec).text, arch
            ),
        )
    for op, od in (
        ("sum", f32),
        ("max", f16),
        ("argmax", dtypes.int64),
        ("min", b),
        ("sum", dtypes.int64),
        ("mean", dtypes.float64),
    ):
        e = ("add", ("in", 0), ("in", 1)) if od != b else ("in", 0)
        ins = (f16, f16) if od not in (b, dtypes.int64) else ((b,) if od == b else (i8, i8))
        if od == dtypes.float64:
            ins = (i8, i8)
        for strat in ("block", "thread"):
            spec = reduce.ReduceSpec(e, ins, op, od, 2, 1, strat)
            from pygpukit.backends.cuda.toolchain import compile_kernel

            assert compile_kernel(reduce.generate(spec).text, arch)


def test_backend_choice_without_gpu() -> None:
    import subprocess
    import sys

    from pygpukit import _native

    if _native.driver_available():
        pytest.skip("this host has a driver; tests/gpu covers the CUDA choice")
    code = "import pygpukit as g; print(g.backend_name())"
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYGPUKIT_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "cpu"
    notices = [ln for ln in out.stderr.splitlines() if "NumPy backend" in ln]
    assert len(notices) == 1, out.stderr
    env["PYGPUKIT_BACKEND"] = "cuda"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "CUDAError" in out.stderr and "libcuda" in out.stderr


def test_jit_parameter_parsing() -> None:
    from pygpukit.errors import CompileError, DTypeError
    from pygpukit.jit import parse_params

    src = """extern "C" __global__ void __launch_bounds__(256) k(float* __restrict__ y,
        const __half* x, double a, unsigned int m, long long n, int i) {}"""
    assert [p[2] for p in parse_params(src, "k")] == list("PPdIqi")
    assert [p[1] for p in parse_params(src, "k")] == ["y", "x", "a", "m", "n", "i"]
    with pytest.raises(DTypeError, match="'h'"):
        parse_params('extern "C" __global__ void k(__half h) {}', "k")
    with pytest.raises(CompileError, match='extern "C"'):
        parse_params("__global__ void k(int n) {}", "k")
    with pytest.raises(CompileError, match="no __global__"):
        parse_params('extern "C" __global__ void other(int n) {}', "k")


@pytest.mark.parametrize("d", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rope", ["half", "interleaved", "none"])
def test_sdpa_append_plans(arch: str, d: str, rope: str) -> None:
    """The decode kernel's append mode (16-bit types) and the composed path (float32, or
    caches at an odd offset) plan and compile: ropes, cache stores, attention."""
    rng = np.random.default_rng(5)
    b, h, kvh, s, hd = 2, 8, 2, 64, 64
    q = _arr(rng, (b, h, 1, hd), d)
    kc, vc = _arr(rng, (b, kvh, s, hd), d), _arr(rng, (b, kvh, s, hd), d)
    kn, vn = _arr(rng, (b, kvh, 1, hd), d), _arr(rng, (b, kvh, 1, hd), d)
    pos = gpk.asarray(np.array(7))
    tables = [_arr(rng, (1, hd // 2), "float32") for _ in range(2)] if rope != "none" else []
    start = gpk.asarray(np.array([0, 2], np.int64))
    ins = [q, kc, vc, kn, vn, pos, *tables, gpk.asarray(np.array(8)), start]
    attrs = {"rope": rope, "kv_len": True, "kv_start": True, "causal": False, "scale": 0.125}
    out = gpk.GPUArray(runtime.record("sdpa_append", tuple(a._node for a in ins), attrs))
    cuda_fakes.LAUNCHES.clear()
    for layout in ("contiguous", "unaligned"):
        _plan_all(out, layout)
    names = {n for n, *_ in cuda_fakes.LAUNCHES}
    assert ("pgk_attn_decode_mma" in names) == (d != "float32")
    assert any(n.startswith("pgk_ew") for n in names)  # the composed stores ran somewhere


@pytest.mark.parametrize("d", ["bfloat16", "float16", "float32"])
def test_rms_norm_residual_plans(arch: str, d: str) -> None:
    """rms_norm(x + r) written out (fp32 upcast, as HF) fuses to one rms_norm with the
    residual, planned as one pgk_rms_norm_add launch; row-strided inputs are copied first."""
    rng = np.random.default_rng(6)
    x, r, w = _arr(rng, (2, 8, 64), d), _arr(rng, (2, 8, 64), d), _arr(rng, (64,), d)
    h = x + r
    h32 = h.astype("float32")
    y = (h32 * gpk.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-6)).astype(d) * w
    sched, _ = _schedule(y)
    assert [s.op for s in sched.steps] == ["rms_norm"]  # type: ignore[attr-defined]
    assert sched.steps[0].attrs["has_residual"]  # type: ignore[attr-defined]
    # The fused node recorded directly, with a gain wider than x (an upcast weight).
    w32, attrs = _arr(rng, (64,), "float32"), {"eps": 1e-5, "has_residual": True}
    direct = gpk.GPUArray(runtime.record("rms_norm", (x._node, w32._node, r._node), attrs))
    for out in (y, direct):
        for layout in ("contiguous", "transposed", "unaligned"):
            cuda_fakes.LAUNCHES.clear()
            _plan_all(out, layout)
            names = [n for n, *_ in cuda_fakes.LAUNCHES]
            assert names.count("pgk_rms_norm_add") == 2, (layout, names)  # planned run + slot run
            assert "pgk_rms_norm" not in names


def test_zero_and_negative_zero_constants_get_their_own_kernels() -> None:
    """0.0 == -0.0, so specs differing only in the constant's sign compare equal: the
    kernel made for one was handed out for the other (x * 0.0 gave x * -0.0 on the GPU)."""
    f32 = dtypes.float32
    texts = []
    for zero in (-0.0, 0.0, -0.0):
        expr = ("mul", ("in", 0), ("const", zero, "float32"))
        texts.append(
            elementwise.generate(
                elementwise.EwSpec(expr, (f32,), f32, ("contig",), "contig", 1)
            ).text
        )
    assert texts[0] == texts[2] != texts[1]
    reds = []
    for zero in (-0.0, 0.0):
        expr = ("add", ("in", 0), ("const", zero, "float32"))
        reds.append(
            reduce.generate(reduce.ReduceSpec(expr, (f32,), "sum", f32, 1, 1, "block")).text
        )
    assert reds[0] != reds[1]
