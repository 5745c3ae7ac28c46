"""The skinny GEMM's launch geometry and routing rule (no GPU needed)."""

from __future__ import annotations

import itertools

import pytest

from pygpukit.backends.cuda.kernels import gemm_skinny as gs


@pytest.mark.parametrize("sms", [108, 132])
@pytest.mark.parametrize("clusters", [False, True])
def test_every_slice_has_stages_and_the_grid_fits(sms, clusters):
    for m, n, k in itertools.product((1, 16, 17, 64), (8, 200, 2048, 32000),
                                     (8, 64, 520, 2048, 5632, 11008)):  # fmt: skip
        smt, tiles, per, slices = gs.geometry(m, n, k, sms, clusters)
        stages = -(-k // gs.BLOCK_K)
        assert smt == -(-m // 16) and tiles == -(-n // gs.BLOCK_N)
        assert slices in (1, 2, 4, 8) and (clusters or slices == 1)
        assert per * slices >= stages and (slices - 1) * per < stages  # none empty
        assert slices == 1 or (tiles * slices <= gs.BLOCKS_PER_SM * sms and per >= gs.MIN_SLICE)
        assert gs.smem_bytes(smt, gs.STAGES) <= 227 * 1024
        # the blocks an SM the int8 geometry counts on fit
        assert gs.INT8_BLOCKS_PER_SM * gs.smem_bytes(smt, gs.STAGES, int8=True) <= 228 * 1024
        *_, slices8 = gs.geometry(m, n, k, sms, clusters, gs.INT8_BLOCKS_PER_SM)
        assert slices8 >= slices


def test_routing_takes_the_measured_winners_only():
    assert gs.beats_gemm(5, 2560, 2048) and gs.beats_gemm(32, 2048, 5632)
    assert not gs.beats_gemm(4, 2560, 2048)  # the GEMV's
    assert not gs.beats_gemm(33, 2560, 2048)  # 64 rows measured slower than cuBLASLt
    assert not gs.beats_gemm(16, 32000, 2048) and not gs.beats_gemm(16, 12288, 4096)


def test_supported_needs_aligned_row_strides():
    assert gs.supported("bfloat16", 24, 2048, (2048, 2048))
    assert not gs.supported("float32", 24, 2048, (2048, 2048))
    assert not gs.supported("float16", 24, 2044, (2048, 2048))
    assert not gs.supported("float16", 24, 2048, (2052, 2048))
    assert not gs.supported("float16", gs.MAX_ROWS + 1, 2048, (2048, 2048))


def test_int8_route_takes_decode_batches_of_row_scaled_int8():
    from pygpukit.backends.cuda.kernels import gemv_quant
    from pygpukit.ir.quant import QuantSpec

    int8 = QuantSpec("int8")
    assert gs.int8_possible(int8, 2048, "bfloat16", 64, 2560, 2560)
    assert gs.int8_possible(int8, 2048, "float16", 1, 2560, 2560)
    assert not gs.int8_possible(int8, 2048, "bfloat16", gs.MAX_ROWS + 1, 2560, 2560)  # prefill
    assert not gs.int8_possible(int8, 2056, "bfloat16", 24, 2560, 2560)  # K % 16
    assert not gs.int8_possible(int8, 2048, "float32", 24, 2560, 2560)
    assert not gs.int8_possible(QuantSpec("fp8"), 2048, "bfloat16", 24, 2560, 2560)
    assert gs.INT8_MIN_ROWS == gemv_quant.QUANT_ROWS + 1  # past one quantized GEMV launch
