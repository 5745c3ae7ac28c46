"""The template variants the launchers can ask for, for ahead-of-time compile checks.

tests/test_kernel_templates.py compiles every entry for sm_80 and sm_90, so a template
that stops compiling in any dtype fails CI rather than on a user's first call.
"""

from __future__ import annotations

from pygpukit.ir.quant import QuantSpec

from . import (
    attention,
    attention_sm90,
    dequant,
    fp8_quant,
    gemm_skinny,
    gemv,
    gemv_quant,
    loader,
    paged_prefill,
    scan,
    sort,
)

Variant = tuple[str, tuple[str, ...], dict[str, object]]  # (family, kernel names, defines)


def _t(dtype: str, **extra: object) -> dict[str, object]:
    return {**loader.type_defines(dtype), **extra}


def gemv_sweep() -> tuple[tuple[int, int, int, int], ...]:
    """The tensor-core GEMV geometries the benchmark sweeps (pygpukit.bench.kernels)."""
    return ((8, 1, 8, 0), (8, 1, 8, 2), (4, 1, 8, 2), (8, 1, 4, 3), (4, 1, 8, 3), (8, 2, 4, 2))


def all_variants() -> list[Variant]:
    out: list[Variant] = []
    floats = loader.FLOAT_DTYPES
    for dt in floats:
        vec = 16 // loader.itemsize(dt)
        max_items = (32 if dt != "float64" else 16) // vec
        scalar_items = 32 if dt != "float64" else 16  # PGK_VEC = 1 for unaligned rows
        cached = [(1 << i, vec) for i in range(max_items.bit_length())]
        cached += [(1 << i, 1) for i in range(scalar_items.bit_length())]
        for items, v in [*cached, (0, 1), (0, vec)]:
            out.append(
                ("softmax", ("pgk_softmax", "pgk_log_softmax"), _t(dt, PGK_VEC=v, PGK_ITEMS=items))
            )
            out.append(("rms_norm", ("pgk_rms_norm",), _t(dt, PGK_VEC=v, PGK_ITEMS=items)))
            out.append(("layer_norm", ("pgk_layer_norm",), _t(dt, PGK_VEC=v, PGK_ITEMS=items)))
        out.append(
            (
                "activation",
                ("pgk_gelu_tanh", "pgk_gelu_erf", "pgk_silu", "pgk_swiglu"),
                _t(dt, PGK_VEC=vec),
            )
        )
        out.append(("activation", ("pgk_swiglu",), _t(dt, PGK_VEC=1)))
    # float32 weights with half inputs (a common checkpoint layout)
    out.append(
        ("rms_norm", ("pgk_rms_norm",), _t("bfloat16", PGK_W="float", PGK_VEC=8, PGK_ITEMS=4))
    )
    out.append(
        ("layer_norm", ("pgk_layer_norm",), _t("float16", PGK_W="float", PGK_VEC=8, PGK_ITEMS=2))
    )
    for dt in ("float32", "float16", "bfloat16"):
        vec = 16 // loader.itemsize(dt)
        for inter in (0, 1):
            out.append(
                (
                    "rope",
                    ("pgk_rope", "pgk_rope_kv_write"),
                    _t(dt, PGK_VEC=vec, PGK_INTERLEAVED=inter, PGK_CS=loader.ctype(dt)),
                )
            )
            out.append(
                (
                    "rope",
                    ("pgk_rope", "pgk_rope_kv_write"),
                    _t(dt, PGK_VEC=1, PGK_INTERLEAVED=inter, PGK_CS="float"),
                )
            )
        for avec in (1, vec):
            out.append(("argmax_topk", ("pgk_argmax", "pgk_topk"),
                        _t(dt, PGK_TOPK_THREADS=512, PGK_AVEC=avec)))  # fmt: skip
        for act in (0, 1, 2, 3):
            out.append(("gemv", ("pgk_gemv",), _t(dt, PGK_VEC=vec, PGK_WARPS=8, PGK_ACT=act)))
        out.append(("gemv", ("pgk_gemv",), _t(dt, PGK_VEC=1, PGK_WARPS=8, PGK_ACT=0)))
        for d in (64, 128):
            out.append(
                (
                    "attention_prefill",
                    ("pgk_attention_prefill",),
                    _t(dt, PGK_D=d, PGK_ROWS=8, PGK_ERR_INDEX=1),
                )
            )
            for g, stages, mp in ((1, 2, 16), (8, 4, 8), (16, 3, 4), (4, 1, 2)):
                dec = _t(dt, PGK_D=d, PGK_G=g, PGK_STAGES=stages, PGK_MSTAGES=min(stages, 3))
                dec["PGK_MP"] = mp  # splits in flight in the last block's merge
                names = ("pgk_attn_decode_split", "pgk_attn_decode_reduce", "pgk_attn_decode_mma")
                out.append(("attention_decode", names, dec))
            for g, stages in ((1, 2), (8, 4), (16, 3)):
                pd = _t(dt, PGK_D=d, PGK_G=g, PGK_STAGES=stages, PGK_ERR_INDEX=1)
                out.append(("paged_decode", ("pgk_paged_decode",), pd))
    for dt in loader.HALF_DTYPES:
        for d in paged_prefill.HEAD_DIMS:  # the decode rows' tensor-core body
            for g, stages in ((1, 1), (8, 2), (8, 3), (16, 2), (4, 1)):
                pm = _t(dt, PGK_D=d, PGK_G=g, PGK_MSTAGES=stages, PGK_ERR_INDEX=1)
                out.append(("paged_decode", ("pgk_paged_decode_mma",), pm))
            # q rotated as it is read (paged_sdpa with rope: the serving step's form).
            pr = _t(dt, PGK_D=d, PGK_G=8, PGK_MSTAGES=3, PGK_ERR_INDEX=1, PGK_QROPE=1)
            out.append(("paged_decode", ("pgk_paged_decode_mma",), pr))
            # ... and storing the step's keys and values (paged_sdpa_append), at each depth,
            # captured (its first stages filled before its wait) or not.
            for stages in (1, 2, 3):
                for slot in ({}, {"PGK_PSLOT": "long long"}):  # int32 / int64 slots
                    for early in ({}, {"PGK_KVEARLY": 1}):
                        out.append(("paged_decode", ("pgk_paged_decode_mma",),
                                    {**pr, "PGK_MSTAGES": stages, "PGK_PAPPEND": 1,
                                     **slot, **early}))  # fmt: skip
    for dt in loader.HALF_DTYPES:
        for d in paged_prefill.HEAD_DIMS:  # the prompt pieces' tensor-core kernel
            for phg in sorted({1, paged_prefill.HEADS_PER_BLOCK}):  # odd groups; even ones
                pp = _t(dt, PGK_D=d, PGK_PSTAGES=paged_prefill.STAGES, PGK_PHG=phg, PGK_ERR_INDEX=1)
                out.append(("paged_prefill", ("pgk_paged_prefill",), pp))
                out.append(("paged_prefill", ("pgk_paged_prefill",), {**pp, "PGK_QROPE": 1}))
    for idx in attention.LENGTH_DTYPES:
        defines = {"PGK_IDX": attention.length_ctype(idx), "PGK_ERR_INDEX": 1}
        out.append(("attention_lengths", ("pgk_attention_check_lengths",), defines))
    for dt in loader.HALF_DTYPES:
        # The tensor-core prefill kernel: each head dim's geometry and the small-grid one.
        for d in (64, 128):
            for geo in attention.FLASH_SWEEP:
                flash = attention.flash_defines(dt, d, geo)
                out.append(("attention_flash", ("pgk_attention_flash",), flash))
        # The Hopper prefill kernel (compiled for sm_90a whatever the arch asked for).
        for d in (64, 128):
            out.append((attention_sm90.FAMILY, (attention_sm90.KERNEL,),
                        attention_sm90.defines(dt, d)))  # fmt: skip
        # Append mode (sdpa_append): each rope layout, tables in the element type or float.
        for d, g in ((64, 8), (128, 16)):
            for rope, cs in ((0, dt), (1, dt), (1, "float32"), (2, "float32")):
                dec = _t(dt, PGK_D=d, PGK_G=g, PGK_MSTAGES=2, PGK_APPEND=1, PGK_ROPE=rope,
                         PGK_CS=loader.ctype(cs))  # fmt: skip
                out.append(("attention_decode", ("pgk_attn_decode_mma",), dec))
        for act in (0, 1, 2, 3):
            out.append(("gemm_mma", ("pgk_gemm_mma",), _t(dt, PGK_ACT=act)))
        # The skinny GEMM: every row-tile count and split, each epilogue; element loads.
        for smt in range(1, gemm_skinny.MAX_ROWS // 16 + 1):
            for scl in (1, 2, 4, 8):
                for act, align in ((0, 1), (1, 1), (2, 1), (3, 1), (0, 0)):
                    out.append(("gemm_skinny", ("pgk_gemm_skinny",),
                                _t(dt, PGK_SMT=smt, PGK_SST=gemm_skinny.STAGES, PGK_SCL=scl,
                                   PGK_ACT=act, PGK_SALIGN=align)))  # fmt: skip
                for act, align in ((0, 1), (1, 1), (0, 0)):  # int8 W (w8a16)
                    out.append(("gemm_skinny", ("pgk_gemm_skinny",),
                                _t(dt, PGK_SMT=smt, PGK_SST=gemm_skinny.STAGES, PGK_SCL=scl,
                                   PGK_ACT=act, PGK_SALIGN=align, PGK_SQ8=1)))  # fmt: skip
        # The tensor-core GEMV: the default geometry with every epilogue, then the others
        # the benchmark sweeps.
        for gw, nt, u, st in gemv.DEFAULT_CONFIGS:
            for act in (0, 1, 2, 3):
                for pro in gemv.PROLOGUES.values():  # none, RMSNorm
                    mma = _t(dt, PGK_GW=gw, PGK_NT=nt, PGK_U=u, PGK_ACT=act, PGK_PRO=pro,
                             PGK_GSTAGES=st)  # fmt: skip
                    if st:
                        mma["PGK_PF"] = gemv.STAGED_PREFETCH
                    out.append(("gemv", ("pgk_gemv_mma",), mma))
        for gw, nt, u, st in gemv.GLU_CONFIGS:  # the SwiGLU epilogue, with and without RMSNorm
            for pro in gemv.PROLOGUES.values():
                mma = _t(dt, PGK_GW=gw, PGK_NT=nt, PGK_U=u, PGK_ACT=0, PGK_PRO=pro,
                         PGK_GSTAGES=st, PGK_GLU=1)  # fmt: skip
                out.append(("gemv", ("pgk_gemv_mma",), mma))
        for gw, nt, u, st in gemv.EARLY_CONFIGS + (gemv.MMA_CONFIG_GLU,):  # early loads
            for pro in gemv.PROLOGUES.values():
                mma = _t(dt, PGK_GW=gw, PGK_NT=nt, PGK_U=u, PGK_ACT=0, PGK_PRO=pro,
                         PGK_GSTAGES=st, PGK_PF=gemv.STAGED_PREFETCH)  # fmt: skip
                out.append(("gemv", ("pgk_gemv_mma",), mma))
            mma = _t(dt, PGK_GW=gw, PGK_NT=nt, PGK_U=u, PGK_ACT=0, PGK_PRO=1, PGK_GSTAGES=st,
                     PGK_PF=gemv.STAGED_PREFETCH, PGK_GLU=1)  # fmt: skip
            out.append(("gemv", ("pgk_gemv_mma",), mma))
        for gw, nt, u, st in gemv_sweep():
            mma = _t(dt, PGK_GW=gw, PGK_NT=nt, PGK_U=u, PGK_ACT=0, PGK_PRO=0, PGK_GSTAGES=st)
            out.append(("gemv", ("pgk_gemv_mma",), mma))
    out += quant_variants()
    for dt in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"):
        out.append(("matmul_simple", ("pgk_matmul",), _t(dt)))
    for dt in scan.DTYPES:  # every dtype: int64 results for integers and bools
        out.append(("scan", ("pgk_cumsum", "pgk_cumprod"), scan.scan_defines(dt)))
        out.append(("sort", ("pgk_sort",), sort.sort_defines(dt)))
    for dt in floats + ("int8", "uint8", "int32", "int64"):
        for idx in ("int32", "int64"):
            vec = 16 // loader.itemsize(dt)
            out.append(
                (
                    "embedding",
                    ("pgk_embedding",),
                    {"PGK_T": loader.ctype(dt), "PGK_IDX": loader.ctype(idx), "PGK_VEC": vec},
                )
            )
    return out


# Every format and scale form of ir/quant.py (fp8 per-tensor and per-row scales differ by
# PGK_QTENSOR alone).
QUANT_SPECS = (
    (QuantSpec("int8"), 64),
    (QuantSpec("fp8"), 1),
    (QuantSpec("fp8"), 64),
    (QuantSpec("fp8", block=128), 4),
    (QuantSpec("int4", group=128), 64),
    (QuantSpec("int4", group=128, has_zero=True), 64),
    (QuantSpec("int4", group=64), 64),
    (QuantSpec("int4", group=64, has_zero=True), 64),
)


def _half_defines(spec: QuantSpec, dtype: str, gw: int, glu: int,
                  always: bool = False) -> dict[str, object]:  # fmt: skip
    """The staged kernel's f16-product macros where the launcher sets them by default at
    any shape (int8, fp8), or with `always` (int4, by shape)."""
    if not (always or gemv_quant.half_mma(spec, dtype)):
        return {}
    minb = gemv_quant.default_min_blocks(gw, True, True, bool(glu), spec.format,
                                         spec.has_zero)  # fmt: skip
    return {"PGK_QF16": 1, **({"PGK_QMINB": minb} if minb else {})}


def _bf16_product_defines(spec: QuantSpec, pro: int) -> dict[str, object]:
    """The staged kernel's macros the launcher sets under bf16 products beside the
    geometry: int8's one partial-sum buffer, and the prologue's gain batch."""
    d: dict[str, object] = {"PGK_QREDB": 1} if spec.format == "int8" else {}
    if pro:
        d["PGK_QGB"] = gemv_quant.default_gain_batch(spec, False)
    return d


def quant_variants() -> list[Variant]:
    """gemv_quant: each format in both dtypes plain and with the decode step's fusions
    (RMSNorm prologue, SwiGLU epilogue, SiLU), on the register path and (16-byte chunks)
    the staged one, its other slab and stage depths for sweeps, and the dequantize
    kernels (each vector width)."""
    out: list[Variant] = []
    for spec, numel in QUANT_SPECS:
        gw, nt, pipe = gemv_quant.FORMAT_CONFIG[spec.format]
        sgw, snt, su, sns = gemv_quant.STAGED_CONFIG[spec.format]
        staged = gemv_quant.words_per_lane(spec) == 4
        # The per-K defaults beside the format's (staged_config: small, large, wide K, and
        # the 7B output projection's shape).
        per_k = {gemv_quant.staged_config(spec, k) for k in (2048, 4096, 11008)}
        per_k.add(gemv_quant.staged_config(spec, gemv_quant.TILE_BLOCK_INT8_K, 1,
                                           gemv_quant.TILE_BLOCK_INT8_MAX_N))  # fmt: skip
        per_k.discard((sgw, snt, su, sns))
        for dt in loader.HALF_DTYPES:
            base = gemv_quant.defines(spec, dt, numel)
            fused = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 0, 3)] if dt == "bfloat16" else [
                (0, 0, 0)]  # fmt: skip
            for pro, glu, act in fused:
                f = {"PGK_PRO": pro, "PGK_GLU": glu, "PGK_ACT": act}
                out.append(("gemv_quant", ("pgk_gemv_quant",),
                            {**base, **f, "PGK_GW": gw, "PGK_NT": nt, "PGK_U": 4,
                             "PGK_QPIPE": int(pipe), "PGK_QSTAGES": 0}))  # fmt: skip
                if not staged:
                    continue
                deep = (pro, glu, act) == (0, 0, 0) and dt == "bfloat16"
                # int8 and fp8 under bf16 multiply in f16 by default (gemv_quant.half_mma;
                # int4 by shape, below); the bf16 products stay an option (f16=False).
                half = _half_defines(spec, dt, sgw, glu)
                if half:
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": sgw, "PGK_NT": snt, "PGK_U": su,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": sns}))  # fmt: skip
                for u, ns in ((su, sns), (2, 4), (8, 2)) if deep else ((su, sns),):
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": sgw, "PGK_NT": snt, "PGK_U": u,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": ns, **half}))  # fmt: skip
                for kgw, knt, ku, kns in sorted(per_k):
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": kgw, "PGK_NT": knt, "PGK_U": ku,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": kns,
                                 **_half_defines(spec, dt, kgw, glu)}))  # fmt: skip
                # 9-16 rows in one launch (two n8 tiles of x's rows, gemv_quant.WIDE_ROWS):
                # the geometry of K = 2048 under bf16 products, int4's biased codes, and
                # the fewer stages and warps of wider rows (gemv_quant.wide_rows_config).
                plain = _bf16_product_defines(spec, pro)
                wgw, wnt, wu, wns = gemv_quant.staged_config(spec, 2048, gemv_quant.WIDE_ROWS)
                for ggw, gns in ((wgw, wns), (4, gemv_quant.WIDE_ROWS_STAGES)):
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": ggw, "PGK_NT": wnt, "PGK_U": wu,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": gns, "PGK_QMX": 2,
                                 **plain}))  # fmt: skip
                if spec.format == "int4" and not spec.has_zero and dt == "bfloat16":
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": wgw, "PGK_NT": wnt, "PGK_U": wu,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": wns, "PGK_QMX": 2, **plain,
                                 "PGK_QBIAS": 1}))  # fmt: skip
                # Past half_max_rows rows of x the same geometries take bf16 products, with
                # the launcher's buffers and gain batch for them.
                if half:
                    for kgw, knt, ku, kns in sorted(per_k):
                        out.append(("gemv_quant", ("pgk_gemv_quant",),
                                    {**base, **f, "PGK_GW": kgw, "PGK_NT": knt, "PGK_U": ku,
                                     "PGK_QPIPE": 0, "PGK_QSTAGES": kns, **plain}))  # fmt: skip
                # int8's biased bytes at wide K (gemv_quant.biased_bytes): one row of x
                # (the wide stages) and more (the format's stages).
                wide = gemv_quant.WIDE_K + 1
                if half and gemv_quant.biased_bytes(spec, True, wide):
                    for wm in (1, 2):
                        wgw, wnt, wu, wns = gemv_quant.staged_config(spec, wide, wm)
                        out.append(("gemv_quant", ("pgk_gemv_quant",),
                                    {**base, **f, "PGK_GW": wgw, "PGK_NT": wnt, "PGK_U": wu,
                                     "PGK_QPIPE": 0, "PGK_QSTAGES": wns, "PGK_QB8": 1,
                                     **_half_defines(spec, dt, wgw, glu)}))  # fmt: skip
                # The prologue's gain batch where it is not the template's 4.
                gb = gemv_quant.default_gain_batch(spec, bool(half))
                if pro and gb != 4:
                    out.append(("gemv_quant", ("pgk_gemv_quant",),
                                {**base, **f, "PGK_GW": sgw, "PGK_NT": snt, "PGK_U": su,
                                 "PGK_QPIPE": 0, "PGK_QSTAGES": sns, **half,
                                 "PGK_QGB": gb}))  # fmt: skip
                # int4 under bf16: the symmetric biased codes (gemv_quant.biased_codes), and
                # f16 products where half_mma takes them (symmetric LM heads, asymmetric
                # K = 4096, registers bounded) or asked for.
                if spec.format == "int4" and dt == "bfloat16":
                    if not spec.has_zero:
                        out.append(("gemv_quant", ("pgk_gemv_quant",),
                                    {**base, **f, "PGK_GW": sgw, "PGK_NT": snt, "PGK_U": su,
                                     "PGK_QPIPE": 0, "PGK_QSTAGES": sns,
                                     "PGK_QBIAS": 1}))  # fmt: skip
                    f16_gain = {"PGK_QGB": gemv_quant.default_gain_batch(spec, True)} if pro else {}
                    for kgw, knt, ku, kns in sorted({(sgw, snt, su, sns), *per_k}):
                        h4 = _half_defines(spec, dt, kgw, glu, always=True)
                        out.append(("gemv_quant", ("pgk_gemv_quant",),
                                    {**base, **f, "PGK_GW": kgw, "PGK_NT": knt, "PGK_U": ku,
                                     "PGK_QPIPE": 0, "PGK_QSTAGES": kns, **f16_gain,
                                     **h4}))  # fmt: skip
        for dt in dequant.DTYPES:
            d = dequant.defines(spec, dt, numel)
            out.append(("dequant", ("pgk_dequant_each",), d))
            for b in dequant.widths(spec, dt):
                out.append(("dequant", ("pgk_dequant",), {**d, **dequant.vector_defines(b)}))
    # One partial-sum buffer where the launcher keeps one (the template's default is two).
    fmt_names = {code: name for name, code in gemv_quant.FORMATS.items()}
    for family, _, d in out:
        fmt, minb = d.get("PGK_QFMT"), d.get("PGK_QMINB", 0)
        if family == "gemv_quant" and d["PGK_QSTAGES"] and isinstance(fmt, int) and isinstance(
                minb, int):  # fmt: skip
            buffers = gemv_quant.red_buffers(fmt_names[fmt], minb)
            if buffers != 2:
                d["PGK_QREDB"] = buffers
    for dt in loader.HALF_DTYPES:  # the FP8 GEMM's activations: per 128 columns, per row
        for group in (fp8_quant.GROUP, 0):
            out.append(("fp8_quant", ("pgk_fp8_quant",),
                        {**loader.type_defines(dt), "PGK_FQG": group}))  # fmt: skip
    for zero in (0, 1):  # its int4 weights as e4m3, symmetric and with zero points
        out.append(("fp8_quant", ("pgk_int4_e4m3",), {"PGK_QZERO": zero}))
    return out
