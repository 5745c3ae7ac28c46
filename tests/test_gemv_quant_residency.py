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


def test_biased_codes_where_measured():
    """The biased int4 codes: symmetric int4 under bf16 at K = 4096 only (the H200 A/B),
    never asymmetric, f16, the 8-bit formats or other K; shared memory grows by the sums of
    x when they are on."""
    from pygpukit.ir.quant import QuantSpec

    sym, asym = QuantSpec("int4", group=128), QuantSpec("int4", group=128, has_zero=True)
    assert gemv_quant.biased_codes(sym, "bfloat16", 4096)
    assert not gemv_quant.biased_codes(sym, "float16", 4096)
    assert not gemv_quant.biased_codes(asym, "bfloat16", 4096)
    assert not gemv_quant.biased_codes(QuantSpec("int8"), "bfloat16", 4096)
    assert not any(gemv_quant.biased_codes(sym, "bfloat16", k) for k in (2048, 5632, 11008))
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


class _Fn:
    """The driver's attributes of a loaded kernel, as the launcher reads them."""

    def __init__(self, num_regs: int, local_bytes: int = 0) -> None:
        self.num_regs, self.shared_bytes, self.local_bytes = num_regs, 256, local_bytes


@pytest.mark.parametrize(
    ("fmt", "regs", "bounded", "want"),
    [("int8", 68, (80, 0), None),  # three blocks by registers already: fn itself
     ("int8", 100, (80, 0), 3),  # two by registers, three by shared memory: bounded
     ("int8", 100, (80, 48), None),  # the bounded build spills: fn
     ("int8", 100, (88, 0), None),  # the bounded build still misses the third block
     ("int4", 87, (80, 0), None)],  # two blocks by shared memory either way
)  # fmt: skip
def test_register_bounded_where_registers_bind(monkeypatch, fmt, regs, bounded, want):
    """register_bounded: the build with __launch_bounds__ asking for the blocks an SM's
    shared memory holds (PGK_QMINB), only where the registers alone held fewer and the
    bounded build reaches them without local memory."""
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.ir.quant import QuantSpec

    spec = QuantSpec("int8") if fmt == "int8" else QuantSpec("int4", group=128)
    cfg = gemv_quant.staged_config(spec, 4096)
    biased = gemv_quant.biased_codes(spec, "bfloat16", 4096)
    smem = gemv_quant.staged_smem(spec, cfg, 4096, 1, biased)
    asked: list[dict[str, object]] = []

    def get_kernel(family: str, name: str, d: dict[str, object]) -> loader.Kernel:
        asked.append(d)
        return loader.Kernel(name, _Fn(*bounded), "")

    monkeypatch.setattr(gemv_quant.loader, "get_kernel", get_kernel)
    monkeypatch.setattr(gemv_quant.toolchain, "device_info",
                        lambda device=None: {"max_shared_per_sm": H200_SMEM_PER_SM})  # fmt: skip
    fn = loader.Kernel("pgk_gemv_quant", _Fn(regs), "")
    d = {"PGK_PRO": 1}
    got = gemv_quant.register_bounded(fn, d, cfg[0], smem)
    if want is None:
        assert got is fn
    else:
        assert got is not fn and asked == [{"PGK_PRO": 1, "PGK_QMINB": want}]
    if regs == 68 or fmt == "int4":
        assert not asked  # nothing compiled where the registers do not bind
