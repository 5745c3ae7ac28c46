"""A QuantizedWeight through gpk.nn.linear (lazy, eager, compiled) against the float64
product with the dequantized weight, each format; the folds of a decode step (RMSNorm
prologue, SwiGLU epilogue, residual) keep the weight's arrays; the printer names the
format; bad shapes and dtypes raise clear errors."""

from __future__ import annotations

import textwrap

import ml_dtypes
import numpy as np
import pytest
from passes_util import close, fused, rms64

import pygpukit as gpk
from pygpukit.cli import main
from pygpukit.ir import format_graph
from pygpukit.quant import QuantizedWeight, quantize

# (format, keyword arguments of quantize): every format and scale form of ir/quant.py.
FORMATS = [
    ("int8", {}),
    ("fp8", {"block": 0}),  # one per-tensor scale
    ("fp8", {}),  # 128 x 128 blocks
    ("int4", {}),  # group 128, symmetric
    ("int4", {"group": 64, "symmetric": False}),
]
IDS = ["int8", "fp8-tensor", "fp8-block", "int4-g128", "int4-g64-asym"]


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def _rand(rng: np.random.Generator, *shape: int, dtype: str = "float32") -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(_np_dtype(dtype))


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _channel_fp8(w: np.ndarray) -> QuantizedWeight:
    """fp8 with one scale per output channel (quantize makes the tensor and block forms)."""
    from pygpukit.ir.quant import QuantSpec

    w = _f64(w)
    scale = np.abs(w).max(axis=1) / 448.0
    data = (w / scale[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return QuantizedWeight(QuantSpec("fp8"), w.shape, gpk.from_numpy(data),
                           gpk.from_numpy(scale.astype(np.float32)))  # fmt: skip


@pytest.mark.parametrize("mode", ["lazy", "eager", "compiled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("fmt", "kw"), FORMATS, ids=IDS)
def test_linear_matches_the_dequantized_product(fmt, kw, dtype, mode):
    rng = np.random.default_rng()
    n, k = 72, 256
    q = quantize(_rand(rng, n, k), fmt, **kw)
    x, b = _rand(rng, 3, k, dtype=dtype), _rand(rng, n, dtype=dtype)

    def f(x, b):
        return gpk.nn.linear(x, q, b)

    if mode == "compiled":
        out = gpk.compile(f)(gpk.from_numpy(x), gpk.from_numpy(b)).to_numpy()
    elif mode == "eager":
        with gpk.eager():
            out = f(gpk.from_numpy(x), gpk.from_numpy(b)).to_numpy()
    else:
        out = f(gpk.from_numpy(x), gpk.from_numpy(b)).to_numpy()
    assert out.dtype == _np_dtype(dtype) and out.shape == (3, n)
    ref = _f64(x) @ q.dequantize().T + _f64(b)
    close(out, ref, dtype)


def test_channel_fp8_and_a_quantized_weight_argument_of_a_compiled_function():
    """Per-channel fp8 scales; the QuantizedWeight passed as an argument, not captured."""
    rng = np.random.default_rng()
    q = _channel_fp8(_rand(rng, 40, 128))
    x = _rand(rng, 2, 128)
    f = gpk.compile(lambda x, w: gpk.nn.linear(x, w, activation="silu"))
    out = f(gpk.from_numpy(x), q).to_numpy()
    y = _f64(x) @ q.dequantize().T
    close(out, y / (1 + np.exp(-y)))


def _silu64(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _rms_norm(x, g):
    x32 = x.astype(gpk.float32)
    normed = x32 * gpk.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-5)
    return normed.astype(x.dtype) * g


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("fmt", "kw"), FORMATS, ids=IDS)
def test_decode_step_folds_keep_the_quantized_weights(fmt, kw, dtype):
    """h = x + o(norm(x)); out = h + down(silu(gate) * up) of norm(h), every weight
    quantized: the norms fold in as prologues, the residuals as epilogues, the gate into
    the gate/up projection, and the result is the float64 block on the dequantized
    weights (lazy and compiled)."""
    rng = np.random.default_rng()
    d, inter = 128, 128
    x = _rand(rng, 1, d, dtype=dtype)
    g1, g2 = _rand(rng, d, dtype=dtype), _rand(rng, d, dtype=dtype)
    wo, wgu, wd = (quantize(_rand(rng, *s), fmt, **kw) for s in ((d, d), (2 * inter, d),
                                                                  (d, inter)))  # fmt: skip

    def block(x, g1, g2):
        h = x + gpk.nn.linear(_rms_norm(x, g1), wo)
        gu = gpk.nn.linear(_rms_norm(h, g2), wgu)
        return h + gpk.nn.linear(gpk.nn.silu(gu[..., :inter]) * gu[..., inter:], wd)

    g = fused(block, x, g1, g2)
    lin = [n for n in g.nodes if n.op == "linear"]
    assert len(lin) == 3 and all(n.attrs["quant"] for n in lin)
    assert sorted(n.attrs.get("prologue", "none") for n in lin) == ["none", "rms_norm",
                                                                     "rms_norm"]  # fmt: skip
    assert [n.attrs.get("glu", "none") for n in lin].count("swiglu") == 1
    assert sum(bool(n.attrs.get("has_residual")) for n in lin) == 2
    assert {n.op for n in g.nodes} <= {"input", "linear"}, [n.op for n in g.nodes]

    x64 = _f64(x)
    h = x64 + rms64(x64, _f64(g1), 1e-5) @ wo.dequantize().T
    gu = rms64(h, _f64(g2), 1e-5) @ wgu.dequantize().T
    ref = h + (_silu64(gu[..., :inter]) * gu[..., inter:]) @ wd.dequantize().T
    args = [gpk.from_numpy(a) for a in (x, g1, g2)]
    close(block(*args).to_numpy(), ref, dtype, factor=4)
    close(gpk.compile(block)(*args).to_numpy(), ref, dtype, factor=4)


def test_printer_and_graph_dump_name_the_format(tmp_path, capsys):
    rng = np.random.default_rng()
    q = quantize(_rand(rng, 32, 128), "int4", group=64, symmetric=False)
    x = gpk.from_numpy(_rand(rng, 1, 128))
    from passes_util import record

    graph, _ = record(lambda x: gpk.nn.linear(x, q), x.to_numpy())
    text = format_graph(graph)
    assert "linear[int4 g64 asym](in0, " in text and "quant=" not in text, text

    model = tmp_path / "qmodel.py"
    model.write_text(textwrap.dedent(
        """
        import numpy as np

        import pygpukit as gpk
        from pygpukit.quant import quantize

        rng = np.random.default_rng(0)
        wq = quantize(rng.standard_normal((64, 256)), "int8")
        w8 = quantize(rng.standard_normal((64, 256)), "fp8")
        g = gpk.random.normal((256,), seed=2)


        def block(x):
            h = x * gpk.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
            return gpk.nn.linear(h, wq) + gpk.nn.linear(h, w8)
        """
    ))  # fmt: skip
    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[1,256]"]) == 0
    out = capsys.readouterr().out
    assert "linear[int8](" in out and "linear[fp8 b128](" in out, out


def test_bad_shapes_and_dtypes_raise_clear_errors():
    rng = np.random.default_rng()
    w = _rand(rng, 16, 256)
    q = quantize(w, "int4")
    with pytest.raises(gpk.ShapeError, match=r"K=128") as e:
        gpk.nn.linear(gpk.from_numpy(_rand(rng, 2, 128)), q)  # x's last dim is not K
    assert isinstance(e.value, ValueError) and "test_quant_linear.py" in str(e.value)
    with pytest.raises(gpk.ShapeError, match="multiple of the group"):
        quantize(_rand(rng, 16, 96), "int4", group=64)
    with pytest.raises(gpk.ShapeError, match="data must be uint8"):
        QuantizedWeight(q.spec, (16, 256), gpk.from_numpy(np.zeros((16, 64), np.uint8)),
                        q.scale)  # fmt: skip
    with pytest.raises(gpk.ShapeError, match="scale shape"):
        QuantizedWeight(q.spec, (16, 256), q.data, gpk.from_numpy(np.ones(16, np.float32)))
    with pytest.raises(gpk.ShapeError, match="2-D"):
        quantize(_rand(rng, 256), "int8")
    with pytest.raises(gpk.errors.GPUKitValueError, match="unknown format"):
        quantize(w, "int3")
    with pytest.raises(gpk.DTypeError, match="float16, bfloat16 or float32"):
        gpk.nn.linear(gpk.from_numpy(np.ones((1, 256), np.int32)), q)
