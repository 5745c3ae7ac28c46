"""gemv_quant's staged path (W, grouped scales and zero points through shared memory in
cp.async stages) in the geometries the launcher can be asked for: each stage depth and
slab, one block per tile or a persistent grid walking several tiles, early weight loads
or not, K that leaves the warps uneven ranges and a partial last chunk, N that leaves a
partial last tile; plain, and with the RMSNorm prologue, the SwiGLU epilogue and the
residual. Against float64 on the dequantized weight (rel. err. <= 1e-3, the output's bf16
rounding taken out: _err)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends.cuda.kernels import gemv_quant
from pygpukit.quant import quantize

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

BF16 = ml_dtypes.bfloat16
# (format, options, K): 8-bit K = 1040 is 16 chunks and one of 16 columns (uneven warp
# ranges, a lane-partial chunk); int4 K = 1152 is 9 groups over 4 warps.
FORMATS = [
    ("int8", {}, 1040),
    ("fp8", {"block": 0}, 1040),
    ("fp8", {"block": 128}, 1040),
    ("int4", {"group": 128}, 1152),
    ("int4", {"group": 128, "symmetric": False}, 1152),
]
# (warps, n8 tiles, chunks per stage, stages, blocks per SM (0: one per tile), w_early)
GEOMETRIES = [(4, 2, 4, 3, 0, True), (4, 2, 2, 4, 1, True), (8, 1, 4, 2, 1, False),
              (4, 1, 8, 2, 0, False)]  # fmt: skip


def _ptr(a: gpk.GPUArray) -> int:
    a.realize()
    return int(a.node.realized.ptr)


def _err(out: np.ndarray, ref: np.ndarray) -> float:
    """The kernel's relative error with the bf16 rounding of its output taken out: an
    element rounded as the reference rounds counts nothing, and one that rounded the other
    way (its value and the reference's on either side of a rounding boundary, an ulp apart
    after rounding however close before) counts what it lies beyond the reference's own
    rounding error, |out - ref|^2 - |round(ref) - ref|^2; a value further off counts about
    all of its distance."""
    rounded = ref.astype(BF16).astype(np.float64)
    o = out.astype(np.float64)
    e2 = float(np.sum((o - ref) ** 2) - np.sum((rounded - ref) ** 2))
    return float(np.sqrt(max(e2, 0.0)) / np.linalg.norm(ref))


def _norm_case(rng, fmt, kw, k, m, glu):
    """A fused launch's operands: W of 203 outputs (SwiGLU: 203 gate and 203 up rows, a
    partial last tile), x, the RMSNorm gain, the residual, and the output, on the device."""
    n = 2 * 203 if glu else 203
    q = quantize(rng.standard_normal((n, k)), fmt, **kw)
    x = rng.uniform(-1, 1, (m, k)).astype(BF16)
    g = rng.uniform(0.5, 1.5, k).astype(BF16)
    n_out = n // 2 if glu else n
    res = rng.uniform(-1, 1, (m, n_out)).astype(BF16)
    dev = [gpk.from_numpy(a).realize() for a in (x, g, res)]
    dev.append(gpk.zeros((m, n_out), gpk.bfloat16).realize())
    return q, x, g, res, dev


def _launch(q, dev, k, m, fused, **kw):
    """One gemv_quant launch of _norm_case's operands (dev: x, gain, residual, output on
    the device): plain, or with the RMSNorm prologue, SwiGLU and the residual; then wait."""
    xd, gd, rd, y = dev
    gemv_quant.gemv_quant(
        _ptr(xd), _ptr(q.data), _ptr(q.scale), _ptr(y), q.spec, q.data.shape[0], k, "bfloat16",
        scale_numel=q.scale.size, zero=_ptr(q.zero) if q.zero is not None else 0, m=m,
        prologue="rms_norm" if fused else "none", pro=_ptr(gd) if fused else 0, eps=1e-5,
        residual=_ptr(rd) if fused else 0, glu=fused, **kw,
    )  # fmt: skip
    gpk.synchronize()


def _norm_ref(x, g, wd, res, glu, eps=1e-5):
    """float64: x * gain rounded once to bf16 (as the kernel's packed multiply), 1 / rms on
    raw x; with glu silu(gate) * up + the residual."""
    x64 = x.astype(np.float64)
    xg = (x64 * g.astype(np.float64)).astype(BF16).astype(np.float64)
    rs = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)
    ref = rs * (xg @ wd.T)
    if glu:
        n_out = res.shape[1]
        gate, up = ref[:, :n_out], ref[:, n_out:]
        ref = gate / (1 + np.exp(-gate)) * up + res.astype(np.float64)
    return ref


# int4's forms under bf16 x: the codes less the zero point in bf16, the biased codes
# (PGK_QBIAS, gemv_quant.biased_codes; symmetric only) and f16 products (PGK_QF16). The 8-bit
# formats take their default (f16 products, gemv_quant.half_mma) in the first.
INT4_FORMS = {"codes": dict(biased=False, f16=False), "biased": dict(biased=True, f16=False),
              "f16": dict(biased=False, f16=True)}  # fmt: skip


@pytest.mark.parametrize("form", list(INT4_FORMS))
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm-glu-residual"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize(("fmt", "kw", "k"), FORMATS, ids=lambda v: str(v))
@pytest.mark.parametrize("m", [1, 5, 8, 13, 16])
def test_staged_geometries_match_float64(fmt, kw, k, geometry, fused, m, form):
    """form: int4's INT4_FORMS. Past 8 rows x's rows are two n8 tiles (PGK_QMX 2) under
    bf16 products."""
    if form != "codes" and fmt != "int4":
        pytest.skip("the 8-bit formats' forms are their default")
    if form == "f16" and m > gemv_quant.QUANT_ROWS:
        pytest.skip("f16 products take up to 8 rows (the launcher refuses more)")
    if form == "biased" and kw.get("symmetric", True) is False:
        pytest.skip("biased codes are a symmetric int4 form (the launcher refuses the rest)")
    opts = INT4_FORMS[form] if fmt == "int4" else {}
    gw, nt, u, stages, per_sm, early = geometry
    q, x, g, res, (xd, gd, rd, y) = _norm_case(np.random.default_rng(), fmt, kw, k, m, fused)
    _launch(q, (xd, gd, rd, y), k, m, fused, config=(gw, nt), slab=u, stages=stages,
            blocks_per_sm=per_sm, w_early=early, **opts)  # fmt: skip
    out = y.to_numpy()
    wd = q.dequantize()
    ref = _norm_ref(x, g, wd, res, True) if fused else x.astype(np.float64) @ wd.T
    assert _err(out, ref) <= 1e-3


# (gain read before the predecessor wait, gain pieces a lane loads at once): the launcher's
# default, late, each batch size, and one piece a batch (K = 4096 over 8 warps: two
# batches, the first loaded early, the second after x).
GAIN_PATHS = [(True, None), (False, None), (True, 1), (True, 2), (False, 4)]


@pytest.mark.parametrize("glu", [False, True], ids=["norm", "norm-glu-residual"])
@pytest.mark.parametrize("gain", GAIN_PATHS, ids=lambda g: "-".join(map(str, g)))
@pytest.mark.parametrize(("fmt", "kw"), [(f, kw) for f, kw, _ in FORMATS], ids=str)
@pytest.mark.parametrize("m", [1, 5])
def test_prologue_gain_paths_match_float64(fmt, kw, gain, glu, m):
    """The RMSNorm prologue's gain loads (pro_early, gain_batch) in the launcher's default
    geometry at the Llama-2-7B hidden size, persistent grid, early loads."""
    pro_early, gain_batch = gain
    k = 4096
    q, x, g, res, (xd, gd, rd, y) = _norm_case(np.random.default_rng(), fmt, kw, k, m, glu)
    n = q.data.shape[0]
    gemv_quant.gemv_quant(
        _ptr(xd), _ptr(q.data), _ptr(q.scale), _ptr(y), q.spec, n, k, "bfloat16",
        scale_numel=q.scale.size, zero=_ptr(q.zero) if q.zero is not None else 0, m=m,
        w_early=True, prologue="rms_norm", pro=_ptr(gd), eps=1e-5,
        residual=_ptr(rd) if glu else 0, glu=glu, pro_early=pro_early, gain_batch=gain_batch,
    )  # fmt: skip
    gpk.synchronize()
    out = y.to_numpy()
    assert _err(out, _norm_ref(x, g, q.dequantize(), res, glu)) <= 1e-3


@pytest.mark.parametrize("magnitude", [1.0, 2.0**-30, 2.0**40], ids=["unit", "tiny", "huge"])
@pytest.mark.parametrize("f16", [False, True], ids=["bf16-products", "f16-products"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm-glu-residual"])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize(("fmt", "kw"), [("int8", {}), ("fp8", {}), ("fp8", {"block": 0}),
                                         ("int4", {"group": 128}),
                                         ("int4", {"group": 128, "symmetric": False})],
                         ids=["int8", "fp8-b128", "fp8-tensor", "int4", "int4-asym"])  # fmt: skip
def test_f16_products_match_float64(fmt, kw, f16, magnitude, fused, m):
    """The staged kernel under bf16 x multiplies in f16 (gemv_quant.half_mma, PGK_QF16),
    x scaled per row and warp by a power of two (int4: and permuted into its pair order):
    rows far below and far above f16's range (with one element 2^12 times the rest) come
    out as the bf16 products do."""
    k = 4096
    rng = np.random.default_rng()
    q, x, g, res, (xd, gd, rd, y) = _norm_case(rng, fmt, kw, k, m, fused)
    x = (x.astype(np.float64) * magnitude).astype(BF16)
    x[:, rng.integers(k)] *= 4096
    xd = gpk.from_numpy(x).realize()
    n = q.data.shape[0]
    gemv_quant.gemv_quant(
        _ptr(xd), _ptr(q.data), _ptr(q.scale), _ptr(y), q.spec, n, k, "bfloat16",
        scale_numel=q.scale.size, zero=_ptr(q.zero) if q.zero is not None else 0, m=m,
        w_early=True, f16=f16, biased=False, prologue="rms_norm" if fused else "none",
        pro=_ptr(gd) if fused else 0, eps=1e-30, residual=_ptr(rd) if fused else 0, glu=fused,
    )  # fmt: skip
    gpk.synchronize()
    out = y.to_numpy()
    wd = q.dequantize()
    if fused:
        ref = _norm_ref(x, g, wd, res, True, eps=1e-30)
    else:
        ref = x.astype(np.float64) @ wd.T
    assert np.isfinite(out.astype(np.float64)).all()
    assert _err(out, ref) <= 1e-3


@pytest.mark.parametrize("early", [True, False], ids=["early", "late"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm-glu-residual"])
@pytest.mark.parametrize(("fmt", "kw"), [("int8", {}), ("fp8", {})], ids=["int8", "fp8-b128"])
def test_wide_rows_default_match_float64(fmt, kw, fused, early):
    """One row of x past gemv_quant.WIDE_K takes the deeper stages by default
    (staged_config): K = 8256 is 129 chunks over 8 warps (uneven ranges)."""
    k = 8256
    q, x, g, res, (xd, gd, rd, y) = _norm_case(np.random.default_rng(), fmt, kw, k, 1, fused)
    assert gemv_quant.staged_config(q.spec, k)[2:] == gemv_quant.WIDE_STAGES
    _launch(q, (xd, gd, rd, y), k, 1, fused, w_early=early)
    out = y.to_numpy()
    wd = q.dequantize()
    ref = _norm_ref(x, g, wd, res, True) if fused else x.astype(np.float64) @ wd.T
    assert _err(out, ref) <= 1e-3


@pytest.mark.parametrize("early", [True, False], ids=["early", "late"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm-glu-residual"])
def test_int8_output_projection_default_match_float64(fused, early):
    """One row of x at K = 4096 and a narrow N (the 7B output projection's shape) takes four
    warps holding their whole range in their stages by default (TILE_BLOCK_INT8)."""
    k = gemv_quant.TILE_BLOCK_INT8_K
    q, x, g, res, dev = _norm_case(np.random.default_rng(), "int8", {}, k, 1, fused)
    n = q.data.shape[0]
    assert gemv_quant.staged_config(q.spec, k, 1, n) == gemv_quant.TILE_BLOCK_INT8
    _launch(q, dev, k, 1, fused, w_early=early)
    out = dev[3].to_numpy()
    wd = q.dequantize()
    ref = _norm_ref(x, g, wd, res, True) if fused else x.astype(np.float64) @ wd.T
    assert _err(out, ref) <= 1e-3


@pytest.mark.parametrize("shift", [0.0, 4.0], ids=["centred", "mean-4"])
@pytest.mark.parametrize("magnitude", [1.0, 2.0**-30, 2.0**40], ids=["unit", "tiny", "huge"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm-glu-residual"])
@pytest.mark.parametrize("m", [1, 5])
def test_int8_biased_bytes_match_float64(monkeypatch, m, fused, magnitude, shift):
    """int8 past WIDE_K multiplies its biased bytes 1152 + q (PGK_QB8), 1152 times the
    warp's sums of x coming off after the tile: x whose mean is four times its spread (the
    biased sums far above the result), far below and above f16's range, as float64 has it,
    with the biased bytes and without them."""
    k = 8256
    rng = np.random.default_rng()
    q, x, g, res, (xd, gd, rd, y) = _norm_case(rng, "int8", {}, k, m, fused)
    assert gemv_quant.biased_bytes(q.spec, True, k)
    x = ((x.astype(np.float64) + shift) * magnitude).astype(BF16)
    xd = gpk.from_numpy(x).realize()
    wd = q.dequantize()
    ref = _norm_ref(x, g, wd, res, True, eps=1e-30) if fused else x.astype(np.float64) @ wd.T
    for biased in (True, False):
        monkeypatch.setattr(gemv_quant, "BIASED_INT8", biased)
        gemv_quant.gemv_quant(
            _ptr(xd), _ptr(q.data), _ptr(q.scale), _ptr(y), q.spec, q.data.shape[0], k,
            "bfloat16", scale_numel=q.scale.size, m=m, w_early=True,
            prologue="rms_norm" if fused else "none", pro=_ptr(gd) if fused else 0, eps=1e-30,
            residual=_ptr(rd) if fused else 0, glu=fused,
        )  # fmt: skip
        gpk.synchronize()
        assert _err(y.to_numpy(), ref) <= 1e-3, biased


@pytest.mark.parametrize("ask", ["float16-x", "biased"])
def test_f16_products_refused_where_they_do_not_apply(ask):
    """f16=True is the bf16-x staged kernel's and excludes the biased int4 codes: f16 x, or
    both forms at once, are refused by name."""
    q, _, _, _, (xd, _, _, y) = _norm_case(np.random.default_rng(), "int4", {}, 1024, 1,
                                           False)  # fmt: skip
    dtype, match = ("float16", "f16 products") if ask == "float16-x" else ("bfloat16", "biased")
    with pytest.raises(gpk.ShapeError, match=match):
        gemv_quant.gemv_quant(_ptr(xd), _ptr(q.data), _ptr(q.scale), _ptr(y), q.spec,
                              q.data.shape[0], 1024, dtype, scale_numel=q.scale.size,
                              f16=True, biased=ask == "biased")  # fmt: skip
