"""Host rules of the FP8 GEMM path (fp8_quant.py): which weights take it, the activation
scales' layout, and the quantizing launcher's argument checks (raised before any launch,
so no GPU is needed)."""

from __future__ import annotations

import pytest

from pygpukit.errors import DTypeError, GPUKitError, ShapeError
from pygpukit.ir.quant import QuantSpec

fp8_quant = pytest.importorskip("pygpukit.backends.cuda.kernels.fp8_quant")


def test_scale_layout_per_128_columns_is_column_major_with_rows_in_fours() -> None:
    assert fp8_quant.scale_layout(128, 37, 656) == (40, 1, 40 * 6)
    assert fp8_quant.scale_layout(128, 64, 4096) == (64, 1, 64 * 32)
    assert fp8_quant.scale_layout(0, 37, 656) == (0, 1, 37)
    with pytest.raises(ShapeError, match="group 64"):
        fp8_quant.scale_layout(64, 8, 256)


@pytest.mark.parametrize(
    ("spec", "n", "scales", "want"),
    [
        (QuantSpec("fp8", block=128), 512, 4 * 8, fp8_quant.BLOCK_MODES),
        (QuantSpec("fp8"), 512, 512, fp8_quant.ROW_MODES),
        (QuantSpec("fp8"), 512, 1, None),  # per tensor: no algorithm with row scales of x
        (QuantSpec("fp8", block=32), 512, 16 * 32, None),
        (QuantSpec("int8"), 512, 512, None),
        (QuantSpec("int4", group=128), 512, 512 * 8, fp8_quant.GROUP_MODES),
        (QuantSpec("int4", group=128, has_zero=True), 512, 512 * 8, fp8_quant.GROUP_MODES),
        (QuantSpec("int4", group=64), 512, 512 * 16, None),
    ],
)
def test_which_weights_take_the_fp8_gemm(spec: QuantSpec, n: int, scales: int, want) -> None:
    assert fp8_quant.fp8_modes(spec, n, scales) == want


def test_the_setting_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGPUKIT_FP8_GEMM", "0")
    # Decided before the device is asked (this machine may have none).
    assert not fp8_quant.fp8_gemm_possible(QuantSpec("fp8", block=128), 512, 1024, "bfloat16",
                                           32)  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        (dict(q=8), ShapeError, "16-byte"),
        (dict(q_stride=1000), ShapeError, "16-byte"),
        (dict(x_stride=100), ShapeError, "x row stride 100"),
        (dict(m_x=41), ShapeError, "41 rows of x for 40"),
        (dict(m=-1), ShapeError, "m must be >= 0"),
        (dict(dtype="float32"), DTypeError, "float32"),
        (dict(group=64), ShapeError, "group 64"),
    ],
)
def test_quantize_rows_rejects_bad_arguments(kw: dict, err: type, match: str) -> None:
    args = dict(x=256, q=512, scale=1024, m=40, k=128, dtype="bfloat16", group=128,
                x_stride=128, q_stride=128)  # fmt: skip
    args.update(kw)
    with pytest.raises(err, match=match) as info:
        fp8_quant.quantize_rows(**args)
    assert isinstance(info.value, GPUKitError) and isinstance(info.value, ValueError | TypeError)


@pytest.mark.parametrize(
    ("spec", "k", "w", "out", "match"),
    [
        (QuantSpec("int8"), 256, 0, 0, "int8"),
        (QuantSpec("int4", group=16), 256, 0, 0, "groups"),
        (QuantSpec("int4", group=128), 272, 0, 0, "K=272"),
        (QuantSpec("int4", group=128), 256, 8, 0, "aligned"),
        (QuantSpec("int4", group=128), 256, 0, 8, "aligned"),
    ],
)
def test_int4_as_e4m3_rejects_bad_arguments(spec: QuantSpec, k: int, w: int, out: int,
                                            match: str) -> None:  # fmt: skip
    with pytest.raises(ShapeError, match=match):
        fp8_quant.int4_as_e4m3(256 + w, 0, 512 + out, spec, 64, k)


@pytest.mark.parametrize(("ld", "ld_t"), [(1, 64), (2, 60)])
def test_int4_as_e4m3_rejects_scale_strides_that_overlap(ld: int, ld_t: int) -> None:
    """The relaid scales of 64 rows of 2 groups: a row stride under the groups, or a
    transposed one under the rows, would overlap rows."""
    with pytest.raises(ShapeError, match="scale row strides"):
        fp8_quant.int4_as_e4m3(256, 0, 512, QuantSpec("int4", group=128), 64, 256,
                               scales=(1024, ld, 2048, ld_t))  # fmt: skip


def test_rows_from_which_the_fp8_gemm_takes_a_weight() -> None:
    """fp8 from MIN_ROWS rows, but at small K (TinyLlama's 2048) only past the rows where the
    quantized GEMV's one launch measured faster; int4 past the GEMV's 16 rows."""
    fp8, int4 = QuantSpec("fp8", block=128), QuantSpec("int4", group=128)
    assert fp8_quant.min_rows(fp8, 4096) == fp8_quant.MIN_ROWS["fp8"] == 9
    assert fp8_quant.min_rows(fp8, fp8_quant.FP8_SMALL_K) == fp8_quant.FP8_SMALL_K_ROWS
    assert 9 < fp8_quant.FP8_SMALL_K_ROWS <= 17
    assert fp8_quant.min_rows(int4, 2048) == fp8_quant.min_rows(int4, 4096) == 17
