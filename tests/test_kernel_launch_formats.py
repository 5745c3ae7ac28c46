"""Every launcher launches kernels its template declares, with the argument list their
`extern "C"` signatures give: the format is parsed from the template (loader.get_kernel),
and cuda_fakes checks each launch's arguments against it in number and kind. No GPU: NVRTC
compiles each variant, only the launch itself is faked."""

from __future__ import annotations

from collections.abc import Callable

import cuda_fakes
import pytest

from pygpukit.backends.cuda import signature
from pygpukit.backends.cuda.kernels import (
    activation,
    argmax_topk,
    attention,
    dequant,
    embedding,
    gemm_mma,
    gemv,
    gemv_quant,
    layer_norm,
    loader,
    matmul_simple,
    rms_norm,
    rope,
    scan,
    softmax,
    sort,
)
from pygpukit.errors import CompileError
from pygpukit.ir.quant import QuantSpec

pytest.importorskip("nvidia")

# Fake device addresses, 16-byte aligned and distinct.
A, B, C, D, E, F, G = ((i + 1) << 24 for i in range(7))

# (kernels the call launches, the call): every launcher and each kernel it can pick.
CASES: list[tuple[tuple[str, ...], Callable[[], None]]] = [
    (("pgk_softmax",), lambda: softmax.softmax(A, B, 4, 64, "float32")),
    (("pgk_log_softmax",), lambda: softmax.log_softmax(A, B, 4, 64, "float16")),
    (("pgk_rms_norm",), lambda: rms_norm.rms_norm(A, B, C, 4, 64, 1e-6, "bfloat16")),
    (
        ("pgk_rms_norm_add",),
        lambda: rms_norm.rms_norm(A, B, C, 4, 64, 1e-6, "bfloat16", residual=D, h_out=E),
    ),
    (("pgk_layer_norm",), lambda: layer_norm.layer_norm(A, B, C, D, 4, 64, 1e-5, "float16")),
    (("pgk_gelu_tanh",), lambda: activation.gelu_tanh(A, B, 256, "float32")),
    (("pgk_gelu_erf",), lambda: activation.gelu_erf(A, B, 256, "bfloat16")),
    (("pgk_silu",), lambda: activation.silu(A, B, 256, "float64")),
    (("pgk_swiglu",), lambda: activation.swiglu(A, B, C, 4, 64, "bfloat16")),
    (("pgk_rope",), lambda: rope.rope(A, B, C, D, 1, 2, 8, 64, "bfloat16", pos_offset=E)),
    (("pgk_argmax",), lambda: argmax_topk.argmax(A, B, 4, 100, "float32")),
    (("pgk_topk",), lambda: argmax_topk.topk(A, B, C, 4, 100, 5, "float32")),
    (("pgk_cumsum",), lambda: scan.scan(A, B, 4, 100, "bfloat16")),
    (("pgk_cumprod",), lambda: scan.scan(A, B, 4, 1000, "int8", kind="mul", x_row_stride=1024)),
    (("pgk_sort",), lambda: sort.sort(A, B, 0, 4, 100, 100, "float32")),
    (("pgk_sort",), lambda: sort.sort(A, 0, B, 4, 4096, 7, "int64", descending=True)),
    (("pgk_embedding",), lambda: embedding.embedding(A, B, C, 4, 64, 100, "float16")),
    (("pgk_gemm_mma",), lambda: gemm_mma.gemm(A, B, C, 32, 32, 64, "bfloat16", bias=D)),
    (("pgk_matmul",), lambda: matmul_simple.matmul(A, B, C, 8, 8, 8, "int32")),
    (("pgk_gemv",), lambda: gemv.gemv(A, B, C, 64, 128, "float32", bias=D)),
    (("pgk_gemv_mma",), lambda: gemv.gemv(A, B, C, 64, 128, "bfloat16", m=2)),
    (
        ("pgk_gemv_mma",),
        lambda: gemv.gemv(
            A, B, C, 64, 128, "float16", prologue="rms_norm", pro=D, eps=1e-6, residual=E, glu=True
        ),  # fmt: skip
    ),
    (
        ("pgk_gemv_quant",),
        lambda: gemv_quant.gemv_quant(
            A,
            B,
            C,
            D,
            QuantSpec("int4", group=128, has_zero=True),
            64,
            256,
            "bfloat16",
            scale_numel=128,
            zero=E,
            m=3,
            prologue="rms_norm",
            pro=F,
            eps=1e-6,
            residual=G,
            glu=True,
            w_early=True,
        ),  # fmt: skip
    ),
    (
        ("pgk_gemv_quant",),
        lambda: gemv_quant.gemv_quant(
            A,
            B,
            C,
            D,
            QuantSpec("fp8"),
            64,
            128,
            "float16",
            scale_numel=1,
            bias=E,
            activation="silu",
        ),  # fmt: skip
    ),
    (
        ("pgk_dequant",),
        lambda: dequant.dequantize(
            A, B, C, QuantSpec("fp8", block=128), 200, 256, "bfloat16", scale_numel=4
        ),  # fmt: skip
    ),
    (
        ("pgk_dequant_each",),
        lambda: dequant.dequantize(
            A,
            B,
            C,
            QuantSpec("int4", group=4, has_zero=True),
            20,
            172,
            "float16",
            scale_numel=20 * 43,
            zero=D,
        ),  # fmt: skip
    ),
    (
        ("pgk_attention_prefill",),
        lambda: attention.prefill(A, B, C, D, 1, 4, 2, 16, 16, 64, "float16"),
    ),
    (
        ("pgk_attention_prefill",),
        lambda: attention.prefill(
            A,
            B,
            C,
            D,
            2,
            4,
            2,
            16,
            16,
            128,
            "float32",
            causal=True,
            masks=attention.Masks(
                kv_len=E, kv_start=F, kv_start_dtype="int64", window=5, err=G, tag=3
            ),
        ),  # fmt: skip
    ),
    (
        ("pgk_attention_flash",),
        lambda: attention.flash(A, B, C, D, 1, 32, 4, 2048, 2048, 64, "bfloat16"),
    ),
    (
        ("pgk_attention_flash",),
        lambda: attention.flash(
            A,
            B,
            C,
            D,
            2,
            4,
            2,
            16,
            40,
            128,
            "float16",
            causal=True,
            masks=attention.Masks(
                kv_len=E, kv_len_dtype="int64", kv_start=F, window=7, err=G, tag=1
            ),
        ),  # fmt: skip
    ),
    (
        ("pgk_attn_decode_mma", "pgk_attn_decode_reduce"),
        lambda: attention.decode(A, B, C, D, E, F, 1, 8, 2, 256, 128, "bfloat16", splits=2),
    ),
    (
        ("pgk_attn_decode_split", "pgk_attn_decode_reduce"),
        lambda: attention.decode(A, B, C, D, E, F, 1, 8, 2, 256, 64, "float32", splits=2),
    ),
    (
        ("pgk_attn_decode_mma",),
        lambda: attention.decode(
            A,
            B,
            C,
            D,
            E,
            0,
            1,
            8,
            2,
            256,
            64,
            "float16",
            splits=1,
            append=attention.Append(F, G, (128, 64), (128, 64), A, "half", B, C, "float32"),
        ),  # fmt: skip
    ),
]


@pytest.mark.parametrize("names, call", CASES, ids=[",".join(c[0]) for c in CASES])
def test_launcher_arguments_match_the_template(
    monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...], call: Callable[[], None]
) -> None:
    cuda_fakes.install(monkeypatch, "sm_90")
    cuda_fakes.LAUNCHES.clear()
    call()
    assert tuple(name for name, _, _ in cuda_fakes.LAUNCHES) == names


def test_kernel_format_comes_from_the_signature() -> None:
    src = (loader.kernel_dir() / "layer_norm.cuh").read_text()
    params = signature.parse_params(src, "pgk_layer_norm", "layer_norm")
    assert [p[1] for p in params] == ["x", "w", "b", "y", "cols", "eps", "x_stride", "y_stride"]
    assert loader.kernel_format("layer_norm", "pgk_layer_norm") == "".join(p[2] for p in params)


def test_macro_stamped_kernels_are_found() -> None:
    """activation.cuh stamps its unary kernels out of one macro."""
    src = (loader.kernel_dir() / "activation.cuh").read_text()
    names = signature.kernel_names(src)
    assert names == ["pgk_gelu_tanh", "pgk_gelu_erf", "pgk_silu", "pgk_swiglu"]
    params = signature.parse_params(src, "pgk_silu", "activation")
    assert [(p[1], p[2]) for p in params] == [("x", "P"), ("y", "P"), ("n", "q")]


def test_unknown_kernel_name_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="softmax: no __global__ void pgk_nope"):
        loader.kernel_format("softmax", "pgk_nope")
