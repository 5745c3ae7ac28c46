"""The Hopper prefill kernel's host side without a GPU: the planner takes it on SM 9.0
devices only, its tensor maps describe [batch, heads, seq, D] operands (a size-one dim gets
a packed stride, since a stride there is never used), and its launch format passes the three
maps by value (format T)."""

from __future__ import annotations

from typing import Any

import pytest

from pygpukit.backends.cuda import signature
from pygpukit.backends.cuda.kernels import attention_sm90, loader


@pytest.mark.parametrize(("cc", "want"), [((9, 0), True), ((8, 0), False), ((8, 9), False),
                                          ((10, 0), False), ((12, 0), False)])  # fmt: skip
def test_chosen_on_sm90_only(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int],
                             want: bool) -> None:  # fmt: skip
    monkeypatch.setattr(attention_sm90.toolchain, "device_info",
                        lambda device=None: {"compute_capability": cc})  # fmt: skip
    assert attention_sm90.chosen(64) is (want and 64 in attention_sm90.PREFERRED_HEAD_DIMS)
    assert attention_sm90.chosen(128) is (want and 128 in attention_sm90.PREFERRED_HEAD_DIMS)
    assert not attention_sm90.chosen(96)


def test_tensor_map_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[tuple[Any, ...]] = []
    monkeypatch.setattr(attention_sm90._native, "tensor_map_tiled",
                        lambda *a: got.append(a) or b"\0" * 128)  # fmt: skip
    # [2, 8, 300, 64] viewed from [B, S, H, D]: strides (S*H*D, D, H*D) elements.
    attention_sm90._tensor_map(4096, "bfloat16", 300, 8, 2, (300 * 8 * 64, 64, 8 * 64), 64, 64)
    # One K / V for every batch row (batch stride 0), one head, one key.
    attention_sm90._tensor_map(8192, "float16", 1, 1, 1, (0, 999, 7), 128, 128)
    assert got[0] == ("bfloat16", 4096, [64, 300, 8, 2], [2 * 512, 2 * 64, 2 * 153600],
                      [64, 64, 1, 1])  # fmt: skip
    assert got[1] == ("float16", 8192, [128, 1, 1, 1], [256, 256, 256], [64, 128, 1, 1])


def test_launch_format_takes_three_maps() -> None:
    fmt = loader.kernel_format(attention_sm90.FAMILY, attention_sm90.KERNEL)
    assert fmt.startswith("TTTPqqqP")
    src = loader.kernel_source(attention_sm90.FAMILY, attention_sm90.defines("bfloat16", 64))
    params = signature.parse_params(src, attention_sm90.KERNEL)
    assert [p[1] for p in params[:3]] == ["tm_q", "tm_k", "tm_v"]


def test_compiles_for_sm90a_whatever_arch() -> None:
    assert loader.family_arch(attention_sm90.FAMILY, "sm_90") == "sm_90a"
    assert loader.family_arch(attention_sm90.FAMILY, "sm_80") == "sm_90a"
    assert loader.family_arch("attention_flash", "sm_80") == "sm_80"


def test_smem_fits_the_h200() -> None:
    # 227 KB opt-in on SM 9.0.
    assert attention_sm90.smem_bytes(128) <= 227 * 1024
    assert attention_sm90.smem_bytes(64) < attention_sm90.smem_bytes(128)
