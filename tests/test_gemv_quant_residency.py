"""gemv_quant's persistent grid: how many blocks of the staged kernel one SM holds, from
its shared memory and registers (no GPU needed: the launcher's arithmetic on the numbers
the driver reports)."""

from __future__ import annotations

import pytest

gemv_quant = pytest.importorskip("pygpukit.backends.cuda.kernels.gemv_quant")

H200_SMEM_PER_SM = 228 * 1024  # sm_90: 228 KiB per SM, 1 KiB of it reserved per block


def test_shared_memory_bounds_the_blocks():
    # int8 (8 warps, 2 stages of 4 KiB) and one row of x of K = 4096: 73.7 KiB a block.
    smem = 8 * 2 * 4096 + (4096 + 8) * 2
    assert gemv_quant.resident_blocks(64, 1600, 256, smem, H200_SMEM_PER_SM) == 3
    # K = 11008: x takes 21.5 KiB more, two blocks fit, not three (3 * 88.3 > 228).
    smem = 8 * 2 * 4096 + (11008 + 8) * 2
    assert gemv_quant.resident_blocks(64, 1600, 256, smem, H200_SMEM_PER_SM) == 2


def test_registers_bound_the_blocks():
    # 128 registers a thread: 4096 a warp, 32 Ki a block of 8 warps, two of 64 Ki.
    assert gemv_quant.resident_blocks(128, 0, 256, 1024, H200_SMEM_PER_SM) == 2
    # 72 registers round up to 2304 a warp (units of 256): 65536 // (8 * 2304) = 3.
    assert gemv_quant.resident_blocks(72, 0, 256, 1024, H200_SMEM_PER_SM) == 3


def test_staged_config_per_k():
    """The per-K defaults: int8 at small K on four warps (six blocks an SM under the warp
    cap), asymmetric int4 four chunks a stage only where no more of the warps' stages
    would go empty; symmetric int4 and fp8 keep the format's default."""
    from pygpukit.ir.quant import QuantSpec

    int8, asym = QuantSpec("int8"), QuantSpec("int4", group=128, has_zero=True)
    assert gemv_quant.staged_config(int8, 2048) == (4, 2, 4, 2)
    assert gemv_quant.STAGED_EARLY_WARPS_PER_SM // 4 == 6
    assert gemv_quant.staged_config(int8, 4096) == gemv_quant.STAGED_CONFIG["int8"]
    assert gemv_quant.staged_config(asym, 4096) == (8, 2, 4, 2)  # 4 chunks a warp
    assert gemv_quant.staged_config(asym, 2048) == gemv_quant.STAGED_CONFIG["int4"]  # 2
    assert gemv_quant.staged_config(asym, 5632) == gemv_quant.STAGED_CONFIG["int4"]  # 5.5
    sym = QuantSpec("int4", group=128)
    assert gemv_quant.staged_config(sym, 4096) == gemv_quant.STAGED_CONFIG["int4"]
    assert gemv_quant.staged_config(QuantSpec("fp8"), 2048) == gemv_quant.STAGED_CONFIG["fp8"]
    # Wide rows of one row of x: deeper, smaller stages for int8 and fp8 in the same shared
    # memory; more rows of x (and int4) keep the default.
    for spec in (int8, QuantSpec("fp8", block=128)):
        wide = gemv_quant.staged_config(spec, 11008)
        base = gemv_quant.STAGED_CONFIG[spec.format]
        assert wide[2:] == gemv_quant.WIDE_STAGES and wide[:2] == base[:2]
        third = gemv_quant.staged_smem(spec, (*base[:2], 4, 3), 11008, 1)  # a third 32 KB stage
        assert gemv_quant.staged_smem(spec, wide, 11008, 1) <= third
        assert gemv_quant.staged_config(spec, 11008, m=2) == base
        assert gemv_quant.staged_config(spec, 8192) == base
    assert gemv_quant.staged_config(sym, 11008) == gemv_quant.STAGED_CONFIG["int4"]


def test_int8_output_projection_takes_its_whole_range_before_the_wait():
    """int8 at the 7B output projection's shape ([4096 x 4096], one row of x) takes four
    warps whose stages hold each warp's whole range of K (all in flight before the
    predecessor wait), a tile a block; wider N, more rows, and the other formats keep the
    default."""
    from pygpukit.ir.quant import QuantSpec

    int8, k, n = QuantSpec("int8"), gemv_quant.TILE_BLOCK_INT8_K, gemv_quant.TILE_BLOCK_INT8_MAX_N
    gw, nt, u, ns = gemv_quant.staged_config(int8, k, 1, n)
    assert (gw, nt, u, ns) == gemv_quant.TILE_BLOCK_INT8 and gw == 4
    per_warp = -(-(k // gemv_quant.chunk_cols(int8)) // gw)  # chunks of a warp's range
    assert u * ns >= per_warp
    blocks = gemv_quant.STAGED_EARLY_WARPS_PER_SM // gw * 132
    assert n // (8 * nt) <= blocks  # a tile a block on an H200's 132 SMs
    assert gemv_quant.staged_config(int8, k) == gemv_quant.STAGED_CONFIG["int8"]
    assert gemv_quant.staged_config(int8, k, 1, 12288) == gemv_quant.STAGED_CONFIG["int8"]
    assert gemv_quant.staged_config(int8, k, 2, n) == gemv_quant.STAGED_CONFIG["int8"]
    for other in (QuantSpec("fp8", block=128), QuantSpec("int4", group=128)):
        assert gemv_quant.staged_config(other, k, 1, n) == gemv_quant.STAGED_CONFIG[other.format]


def test_biased_codes_where_measured():
    """The biased int4 codes: symmetric int4 under bf16 at K = 4096 and N from 8192 only
    (the H200 A/B), never asymmetric, f16, the 8-bit formats, other K or the 4096-row
    output projection; shared memory grows by the sums of x when they are on."""
    from pygpukit.ir.quant import QuantSpec

    sym, asym = QuantSpec("int4", group=128), QuantSpec("int4", group=128, has_zero=True)
    assert gemv_quant.biased_codes(sym, "bfloat16", 4096, 12288)
    assert not gemv_quant.biased_codes(sym, "bfloat16", 4096, 4096)
    assert not gemv_quant.biased_codes(sym, "float16", 4096, 12288)
    assert not gemv_quant.biased_codes(asym, "bfloat16", 4096, 12288)
    assert not gemv_quant.biased_codes(QuantSpec("int8"), "bfloat16", 4096, 12288)
    assert not any(gemv_quant.biased_codes(sym, "bfloat16", k, 12288)
                   for k in (2048, 5632, 11008))  # fmt: skip
    cfg = gemv_quant.staged_config(sym, 4096)
    plain = gemv_quant.staged_smem(sym, cfg, 4096, 1)
    # 32 chunks of 128 columns over 8 warps, one row of x: 32 floats.
    assert gemv_quant.staged_smem(sym, cfg, 4096, 1, biased=True) == plain + 32 * 4


@pytest.mark.parametrize(("fmt", "dtype", "zero"), [("int8", "bfloat16", False),
                                                    ("fp8", "bfloat16", False),
                                                    ("int4", "float16", False),
                                                    ("int4", "bfloat16", True)])  # fmt: skip
def test_biased_codes_refused_off_int4_bf16(fmt, dtype, zero):
    """Asking for the biased codes on a weight or x dtype they do not serve (anything but
    symmetric int4 under bf16) is a ShapeError (and a ValueError) naming the weight and the
    dtype, raised before anything launches."""
    from pygpukit.errors import ShapeError
    from pygpukit.ir.quant import QuantSpec

    spec = QuantSpec(fmt, group=128, has_zero=zero) if fmt == "int4" else QuantSpec(fmt)
    with pytest.raises(ShapeError, match=f"biased codes for a .*{dtype}") as info:
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 4096, 4096, dtype,
                              scale_numel=4096, biased=True)  # fmt: skip
    assert isinstance(info.value, ValueError)


class _FakeFn:
    num_regs = 0  # unknown here: the grid is sized by shared memory alone
    shared_bytes = 0


class _FakeKernel:
    """A kernel that records its defines and launch arguments instead of launching."""

    launched: list[tuple[dict[str, object], tuple[object, ...]]] = []

    def __init__(self, defines: dict[str, object]) -> None:
        self.defines, self.fn = defines, _FakeFn()

    def set_dynamic_smem(self, nbytes: int) -> None:
        """Nothing to set without a device."""

    def launch(self, grid: object, block: object, args: tuple[object, ...], smem: int = 0,
               stream: object = None) -> None:  # fmt: skip
        self.launched.append((self.defines, args))


@pytest.mark.parametrize(
    ("prologue", "w_early", "pro_early", "early_arg"),
    [("rms_norm", True, True, 3), ("rms_norm", True, False, 1), ("rms_norm", False, True, 0),
     ("none", True, True, 1)],
)  # fmt: skip
@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
def test_gain_batch_and_early_gain(monkeypatch, fmt, prologue, w_early, pro_early, early_arg):
    """The staged kernel's RMSNorm gain: the format's GAIN_BATCH pieces a lane at once
    (F16_GAIN_BATCH under f16 products; PGK_QGB, prologue kernels only), and bit 1 of the
    early-loads argument (the gain read before the predecessor wait) only with bit 0 and
    the prologue."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.ir.quant import QuantSpec

    info = {"sm_count": 132, "max_shared_per_block_optin": 227 * 1024,
            "max_shared_per_sm": H200_SMEM_PER_SM}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    monkeypatch.setattr(loader, "get_kernel", lambda family, name, d: _FakeKernel(d))
    _FakeKernel.launched = []
    spec = QuantSpec("int4", group=128) if fmt == "int4" else QuantSpec(fmt)
    gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 4096, 4096, "bfloat16",
                          scale_numel=4096, prologue=prologue,
                          pro=1 << 24 if prologue != "none" else 0, eps=1e-5,
                          w_early=w_early, pro_early=pro_early)  # fmt: skip
    ((defines, args),) = _FakeKernel.launched
    assert defines["PGK_QSTAGES"] > 0
    assert args[-1] == early_arg
    # f16 products (half_mma) take F16_GAIN_BATCH
    gb = gemv_quant.F16_GAIN_BATCH if gemv_quant.half_mma(spec, "bfloat16", 4096, prologue) else (
        gemv_quant.GAIN_BATCH[fmt])  # fmt: skip
    want = gb if prologue != "none" else None
    assert defines.get("PGK_QGB") == want


def test_half_mma_where_measured():
    """f16 products: int8 and fp8 under bf16 always; symmetric int4 under bf16 at the LM
    heads only (RMSNorm prologue, no SwiGLU, N from HALF_INT4_MIN_N), asymmetric int4 at
    K = 4096 and N from 8192 with any fusion; never under f16 x; int8 and fp8 up to
    half_max_rows rows of x."""
    from pygpukit.ir.quant import QuantSpec

    sym, asym = QuantSpec("int4", group=128), QuantSpec("int4", group=128, has_zero=True)
    for spec in (QuantSpec("int8"), QuantSpec("fp8", block=128)):
        assert gemv_quant.half_mma(spec, "bfloat16")
        assert not gemv_quant.half_mma(spec, "float16")
        # a pass per row of x turns it into f16: a few rows only
        rows = gemv_quant.HALF_MAX_ROWS
        assert gemv_quant.half_mma(spec, "bfloat16", 2048, k=2048, m=rows)
        assert not gemv_quant.half_mma(spec, "bfloat16", 2048, k=2048, m=rows + 1)
        wide = gemv_quant.HALF_FP8_WIDE_ROWS if spec.format == "fp8" else rows
        assert gemv_quant.half_mma(spec, "bfloat16", 12288, k=4096, m=wide)
        assert not gemv_quant.half_mma(spec, "bfloat16", 12288, k=4096, m=wide + 1)
    assert gemv_quant.half_mma(sym, "bfloat16", 32000, "rms_norm", m=8)
    assert gemv_quant.half_mma(sym, "bfloat16", 32000, "rms_norm")
    assert not gemv_quant.half_mma(sym, "bfloat16", 32000)
    assert not gemv_quant.half_mma(sym, "bfloat16", 22016, "rms_norm", glu=True)
    assert not gemv_quant.half_mma(sym, "bfloat16", 12288, "rms_norm")
    assert not gemv_quant.half_mma(sym, "float16", 32000, "rms_norm")
    assert gemv_quant.half_mma(asym, "bfloat16", 22016, "rms_norm", glu=True, k=4096)
    assert gemv_quant.half_mma(asym, "bfloat16", 12288, k=4096)
    assert not gemv_quant.half_mma(asym, "bfloat16", 4096, k=4096)
    assert not gemv_quant.half_mma(asym, "bfloat16", 32000, "rms_norm", k=2048)
    assert not gemv_quant.half_mma(asym, "bfloat16", 32000, k=11008)
    assert not gemv_quant.half_mma(asym, "float16", 12288, k=4096)
    # Bounded to two blocks an SM: asymmetric int4 under f16 only.
    assert gemv_quant.default_min_blocks(8, True, True, False, "int4", True) == 2
    assert gemv_quant.default_min_blocks(8, True, True, False, "int4", False) == 0
    # int8 and a bounded kernel keep one partial-sum buffer, the others take two.
    assert gemv_quant.red_buffers("int4", 2) == gemv_quant.red_buffers("int8", 0) == 1
    assert gemv_quant.red_buffers("fp8", 0) == gemv_quant.STAGED_RED_BUFFERS == 2


@pytest.mark.parametrize(("zero", "n", "prologue", "f16", "biased"),
                         [(False, 32000, "rms_norm", True, False),
                          (False, 12288, "rms_norm", False, True),
                          (False, 4096, "none", False, False),
                          (True, 12288, "rms_norm", True, False),
                          (True, 4096, "none", False, False)])  # fmt: skip
def test_int4_forms_by_shape(monkeypatch, zero, n, prologue, f16, biased):
    """The launcher's int4 form at K = 4096: symmetric, f16 products at the LM head, the
    biased codes at QKV, the plain codes at the output projection (one form each, never
    both); asymmetric, f16 products bounded to two blocks an SM from N = 8192."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.ir.quant import QuantSpec

    info = {"sm_count": 132, "max_shared_per_block_optin": 227 * 1024,
            "max_shared_per_sm": H200_SMEM_PER_SM}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    monkeypatch.setattr(loader, "get_kernel", lambda family, name, d: _FakeKernel(d))
    _FakeKernel.launched = []
    spec = QuantSpec("int4", group=128, has_zero=zero)
    gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, n, 4096, "bfloat16",
                          scale_numel=n * 32, zero=1 << 25 if zero else 0, prologue=prologue,
                          pro=1 << 24 if prologue != "none" else 0, eps=1e-5,
                          w_early=True)  # fmt: skip
    ((defines, _),) = _FakeKernel.launched
    assert bool(defines.get("PGK_QF16")) == f16
    assert bool(defines.get("PGK_QBIAS")) == biased
    assert defines.get("PGK_QMINB") == (gemv_quant.ASYM_F16_MIN_BLOCKS if f16 and zero else None)
    # the bounded kernel keeps one partial-sum buffer (the template's default is two)
    assert defines.get("PGK_QREDB") == (1 if f16 and zero else None)


@pytest.mark.parametrize(("fmt", "k", "b8"), [("int8", 11008, True), ("int8", 4096, False),
                                             ("fp8", 11008, False)])  # fmt: skip
def test_int8_biased_bytes_at_wide_rows(monkeypatch, fmt, k, b8):
    """int8 under f16 products multiplies its biased bytes (PGK_QB8) past WIDE_K only: the
    Llama-2-7B down projection, not the K = 4096 launches; never fp8."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.ir.quant import QuantSpec

    info = {"sm_count": 132, "max_shared_per_block_optin": 227 * 1024,
            "max_shared_per_sm": H200_SMEM_PER_SM}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    monkeypatch.setattr(loader, "get_kernel", lambda family, name, d: _FakeKernel(d))
    _FakeKernel.launched = []
    spec = QuantSpec(fmt, block=128) if fmt == "fp8" else QuantSpec(fmt)
    assert gemv_quant.biased_bytes(spec, True, k) == b8
    assert not gemv_quant.biased_bytes(spec, False, k)  # bf16 products: the plain pairs
    gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 4096, k, "bfloat16",
                          scale_numel=4096 * 88, w_early=True)  # fmt: skip
    ((defines, _),) = _FakeKernel.launched
    assert defines.get("PGK_QF16") == 1
    assert bool(defines.get("PGK_QB8")) == b8


def test_gain_batch_must_be_positive(monkeypatch):
    """A gain batch under one piece is a ShapeError naming it, before anything compiles."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.errors import ShapeError
    from pygpukit.ir.quant import QuantSpec

    info = {"sm_count": 132, "max_shared_per_block_optin": 227 * 1024,
            "max_shared_per_sm": H200_SMEM_PER_SM}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    with pytest.raises(ShapeError, match="gain batch of 0"):
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, QuantSpec("int8"), 4096,
                              4096, "bfloat16", scale_numel=4096, prologue="rms_norm",
                              pro=1 << 24, gain_batch=0)  # fmt: skip


def test_row_groups_split_rows_evenly_up_to_the_limit():
    """Rows past one launch's QUANT_ROWS go in even groups, a launch each, until the
    launches would read more bytes than dequantizing the weight once (None: that path)."""
    rows = gemv_quant.QUANT_ROWS
    assert gemv_quant.row_groups(1) == [(0, 1)]
    assert gemv_quant.row_groups(rows) == [(0, rows)]
    assert gemv_quant.row_groups(rows + 1) == [(0, 5), (5, 4)]
    assert gemv_quant.row_groups(15) == [(0, 8), (8, 7)]
    most = gemv_quant.MAX_ROW_GROUPS * rows
    groups = gemv_quant.row_groups(most)
    assert groups is not None and all(g == rows for _, g in groups)
    assert [r0 for r0, _ in groups] == list(range(0, most, rows))
    assert gemv_quant.row_groups(most + 1) is None
    assert gemv_quant.row_groups(0) is None


def test_sixteen_rows_one_launch_where_they_fit(monkeypatch):
    """9-16 rows of x take one launch (two n8 tiles of rows, PGK_QMX 2, bf16 products) where
    the staged kernel holds them beside its stages (TinyLlama's K = 2048; at K = 5632 with
    fewer stages and warps), two of up to 8 where not (K = 11008); more than 16, f16
    products past 8 rows, or the register path for them, are ShapeErrors naming the rows."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.errors import ShapeError
    from pygpukit.ir.quant import QuantSpec

    info = {"sm_count": 132, "max_shared_per_block_optin": 227 * 1024,
            "max_shared_per_sm": H200_SMEM_PER_SM}  # fmt: skip
    monkeypatch.setattr(toolchain, "device_info", lambda device=None: info)
    monkeypatch.setattr(loader, "get_kernel", lambda family, name, d: _FakeKernel(d))
    wide = gemv_quant.WIDE_ROWS
    for spec in (QuantSpec("int8"), QuantSpec("fp8", block=128), QuantSpec("int4", group=128),
                 QuantSpec("int4", group=128, has_zero=True)):  # fmt: skip
        assert gemv_quant.rows_a_launch(spec, 2048, "bfloat16", 8) == gemv_quant.QUANT_ROWS
        assert gemv_quant.rows_a_launch(spec, 2048, "bfloat16", 13) == wide
        assert gemv_quant.rows_a_launch(spec, 5632, "bfloat16", 13) == wide
        gw, _, _, ns = gemv_quant.wide_rows_config(spec, 5632, "bfloat16") or (0, 0, 0, 0)
        assert gw == 4 and ns == gemv_quant.WIDE_ROWS_STAGES
        assert gemv_quant.rows_a_launch(spec, 11008, "bfloat16", 13) == gemv_quant.QUANT_ROWS
        assert gemv_quant.rows_a_launch(spec, 2048, "bfloat16", wide + 1) == (
            gemv_quant.QUANT_ROWS)  # fmt: skip
        _FakeKernel.launched = []
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 2560, 2048, "bfloat16",
                              scale_numel=2560 * 16, m=13, w_early=True)  # fmt: skip
        ((defines, _),) = _FakeKernel.launched
        assert defines["PGK_QMX"] == 2 and defines["PGK_QSTAGES"] > 0
        assert "PGK_QF16" not in defines
    assert gemv_quant.row_groups(13, wide) == [(0, 13)]
    spec = QuantSpec("int8")
    with pytest.raises(ShapeError, match="m=17 rows"):
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 2560, 2048, "bfloat16",
                              scale_numel=2560, m=wide + 1)  # fmt: skip
    with pytest.raises(ShapeError, match="13 rows of x"):
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 2560, 2048, "bfloat16",
                              scale_numel=2560, m=13, f16=True)  # fmt: skip
    with pytest.raises(ShapeError, match="13 rows of x"):
        gemv_quant.gemv_quant(1 << 20, 1 << 21, 1 << 22, 1 << 23, spec, 2560, 2048, "bfloat16",
                              scale_numel=2560, m=13, stages=0)  # fmt: skip
