"""Every NVRTC kernel template compiles, in every variant its launcher can ask for, to a
CUBIN for sm_80 and sm_90 (no GPU needed: NVRTC and the CUDA headers come from pip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pygpukit.errors import CompileError

toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
from pygpukit.backends.cuda.kernels import attention, loader, variants  # noqa: E402

ARCHS = ("sm_80", "sm_90")
VARIANTS = variants.all_variants()


def _nvrtc_or_skip() -> None:
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")


def _id(v: variants.Variant) -> str:
    fam, _, defines = v
    return fam + "-" + "-".join(f"{k}={v}".replace(" ", "_") for k, v in sorted(defines.items()))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", VARIANTS, ids=[_id(v) for v in VARIANTS])
def test_template_compiles(variant: variants.Variant, arch: str) -> None:
    _nvrtc_or_skip()
    family, names, defines = variant
    cubin = loader.compile_family(family, defines, arch)
    assert cubin[:4] == b"\x7fELF", "NVRTC must return CUBIN (ELF), never PTX"
    for name in names:
        assert name.encode() in cubin, f"kernel {name} missing from the {family} CUBIN"


@pytest.mark.parametrize("variant", VARIANTS, ids=[_id(v) for v in VARIANTS])
def test_variant_declares_its_kernels(variant: variants.Variant) -> None:
    """Each kernel a variant names is an extern "C" kernel of that variant's source, and
    the launch format parsed from it is the one the launchers use (loader.kernel_format,
    parsed once per family from the template without defines)."""
    from pygpukit.backends.cuda import signature

    family, names, defines = variant
    src = loader.kernel_source(family, defines)
    declared = signature.kernel_names(src)
    for name in names:
        assert name in declared, f'{family}: {name} is not an extern "C" kernel'
        assert signature.launch_format(src, name, family) == loader.kernel_format(family, name)


def test_every_family_is_covered() -> None:
    # A family declares kernels; a header (common.cuh, quant_format.cuh) only helps them.
    files = {p.stem for p in loader.kernel_dir().glob("*.cuh")
             if 'extern "C" __global__' in p.read_text()}  # fmt: skip
    assert files == {fam for fam, _, _ in VARIANTS}


@pytest.mark.parametrize("path", sorted(loader.kernel_dir().glob("*.cuh")), ids=lambda p: p.name)
def test_templates_are_ascii(path: object) -> None:
    data = path.read_bytes()  # type: ignore[attr-defined]
    assert data.isascii()


def test_broken_template_fails() -> None:
    _nvrtc_or_skip()
    src = loader.kernel_source("softmax", loader.type_defines("float32")) + "\nthis is not C++;\n"
    with pytest.raises(CompileError):
        loader.compile_source(src, "sm_90")


def test_source_inlines_common() -> None:
    src = loader.kernel_source("rope", {"PGK_T": "float"})
    assert '#include "common.cuh"' not in src
    assert src.startswith("#define PGK_T float\n")
    assert "pgk_read_i32" in src


@pytest.mark.parametrize("path", sorted(loader.kernel_dir().glob("*.cuh")), ids=lambda p: p.name)
def test_every_kernel_waits_on_its_predecessor(path: object) -> None:
    """Kernels launch as programmatic dependents on SM 9.0+ (loader.pdl_enabled): each must
    call pgk_pdl_wait() before it touches memory another kernel writes. Code ahead of the
    wait may only trigger the next launch, issue L2 prefetch hints, or read settled
    operands under an early-load flag the launcher sets (gemv w_early, decode kv_early)."""
    import re

    text = path.read_text()  # type: ignore[attr-defined]
    for body in re.split(r'extern "C" __global__', text)[1:]:
        assert "pgk_pdl_wait()" in body, f"{path}: a kernel never calls pgk_pdl_wait()"
        start = body.index("{", body.index(")"))
        before = body[start : body.index("pgk_pdl_wait()")]
        code = re.sub(r"//[^\n]*", "", before).replace("pgk_pdl_trigger();", "")
        allowed = "prefetch" in code or re.search(r"\b\w+_early\b", code)
        assert allowed or not code.strip("{ \\\n"), (
            f"{path}: a kernel runs code before pgk_pdl_wait(): {before[:200]!r}"
        )


def test_generated_kernels_wait_on_their_predecessor() -> None:
    import inspect

    from pygpukit.backends.cuda.codegen import elementwise, fill, gather, prelude, reduce

    assert "griddepcontrol.wait" in prelude.PRELUDE
    for module in (elementwise, reduce, gather, fill):
        assert "PGK_PDL_ENTRY" in inspect.getsource(module), module.__name__


def test_templates_ship_beside_the_loader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The templates are package data next to loader.py (so the wheel carries them where
    the loader looks); PYGPUKIT_KERNEL_DIR overrides, and a directory without them is a
    clear error."""
    monkeypatch.delenv("PYGPUKIT_KERNEL_DIR", raising=False)
    here = Path(loader.__file__).resolve().parent
    assert loader.kernel_dir() == here
    assert {p.stem for p in here.glob("*.cuh")} >= {"common"} | {f for f, _, _ in VARIANTS}
    monkeypatch.setenv("PYGPUKIT_KERNEL_DIR", str(tmp_path))
    with pytest.raises(CompileError, match="no common.cuh in"):
        loader.kernel_dir()


def _sections(elf: bytes) -> dict[str, bytes]:
    """The ELF64 sections of a CUBIN by name (NOBITS ones left out)."""
    import struct

    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names_at = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    strings = heads[names_at][4]

    def name(off: int) -> str:
        return elf[strings + off : elf.index(b"\0", strings + off)].decode()

    return {name(h[0]): elf[h[4] : h[4] + h[5]] for h in heads if h[1] != 8}


def _first_variant_of_each_kernel() -> list[tuple[str, str, dict[str, object]]]:
    """(family, kernel, defines) for the first variant naming each kernel of a template
    that guards its kernels (loader.module_defines)."""
    seen: dict[tuple[str, str], dict[str, object]] = {}
    for family, names, defines in VARIANTS:
        for name in names:
            if "PGK_ONLY" in loader.module_defines(family, name, defines):
                seen.setdefault((family, name), defines)
    return [(f, n, d) for (f, n), d in seen.items()]


ONE_KERNEL = _first_variant_of_each_kernel()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ONE_KERNEL, ids=[f"{f}-{n}" for f, n, _ in ONE_KERNEL])
def test_module_holds_the_kernel_asked_for(case: tuple[str, str, dict[str, object]],
                                           arch: str) -> None:  # fmt: skip
    """A guarded template's module (the loader's, for one kernel) holds that kernel alone,
    compiled to the same code as in the module of every kernel of the family."""
    from pygpukit.backends.cuda import signature

    _nvrtc_or_skip()
    family, name, defines = case
    declared = signature.kernel_names(loader.kernel_source(family, defines))
    assert len(declared) > 1 and name in declared
    full = _sections(loader.compile_family(family, defines, arch))
    alone = _sections(loader.compile_family(family, loader.module_defines(family, name, defines),
                                            arch))  # fmt: skip
    assert {s[6:] for s in alone if s.startswith(".text.")} == {name}
    for sec in (f".text.{name}", f".nv.shared.{name}", f".nv.constant0.{name}"):
        assert alone.get(sec) == full.get(sec), f"{family}: {name}'s {sec} differs"


def test_unguarded_template_module_keeps_its_defines() -> None:
    """A template without kernel guards compiles every kernel in one module, whichever the
    launcher asks for (activation's four share one)."""
    d = loader.type_defines("float16")
    assert loader.module_defines("activation", "pgk_silu", d) == d
    assert loader.module_defines("rms_norm", "pgk_rms_norm_add", d) == {
        **d, "PGK_ONLY": 1, "PGK_ONLY_pgk_rms_norm_add": 1}  # fmt: skip


def _own_option_cases(family: str) -> list[tuple[str, dict[str, object], str]]:
    """(kernel, defines, arch) of a family with its own options to compile both ways: the
    decode attention's first variant's first and last kernels; the flash attention's
    variant of the TinyLlama prefill's long chunks (bf16, head dim 64, its geometry)."""
    if family == "attention_flash":
        geo = attention.FLASH_GEOMETRY[64]
        return [("pgk_attention_flash", attention.flash_defines("bfloat16", 64, geo), "sm_90")]
    _, names, defines = next(v for v in VARIANTS if v[0] == family)
    return [(names[0], defines, "sm_80"), (names[-1], defines, "sm_90")]


@pytest.mark.parametrize("family", ["attention_decode", "attention_flash"])
def test_family_options_reach_nvrtc_and_keep_the_code(family: str) -> None:
    """A family's own NVRTC options (loader.FAMILY_OPTIONS: the decode and the flash
    attention's ptxas -O2, their cold compiles being the first decode and prefill calls'
    critical paths) are in its modules' compile, and keep the code: every section of the
    CUBIN but the note that records ptxas's options is byte-identical to the default (-O3)
    compile's (all 176 compiles of the decode family were, all 48 of the flash family's
    variants on sm_80 and sm_90; a kernel or two of each here)."""
    _nvrtc_or_skip()
    extra = loader.FAMILY_OPTIONS[family]
    assert loader.template_options(family)[len(loader.template_options()) :] == extra
    assert not set(extra) & set(loader.template_options("gemv"))
    for name, defines, arch in _own_option_cases(family):
        mod = loader.module_defines(family, name, defines)
        src = loader.kernel_source(family, mod)
        own = _sections(loader.compile_family(family, mod, arch))
        plain = _sections(loader.compile_source(src, arch, loader.template_options()))
        assert set(own) == set(plain) and f".text.{name}" in own
        assert [k for k in own if own[k] != plain[k]] == [".note.nv.tkinfo"]  # the options
