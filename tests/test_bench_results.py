"""The benchmark result files: their stable names, the name a `--json` run without a FILE
picks, and the read-floor group's probe kernels (compiled by NVRTC; no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pygpukit.bench import results
from pygpukit.bench.__main__ import GROUPS, main

ROOT = Path(__file__).resolve().parents[1]
# Result groups written by other tools than `python -m pygpukit.bench`.
OTHER_GROUPS = {"scheduler": "bench/scheduler_experiment.py",
                "graphs-profile": "scripts/graph_profile.py",
                "serve": "pygpukit/bench/serve_load.py"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tag"),
    [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
     ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
     ("NVIDIA L40S", "l40s"), ("cpu", "cpu")],
)  # fmt: skip
def test_device_tag(name: str, tag: str) -> None:
    assert results.device_tag(name) == tag


def test_every_result_file_has_a_stable_name_and_a_readme_line() -> None:
    groups = set(results.RESULT_GROUPS) | set(results.LLM_GROUPS.values()) | set(OTHER_GROUPS)
    readme = (results.RESULTS_DIR / "README.md").read_text(encoding="ascii")
    files = sorted(results.RESULTS_DIR.glob("*.json"))
    assert files
    for path in files:
        device, _, group = path.stem.partition("-")
        assert group in groups, f"{path.name}: not <device>-<group>.json with a known group"
        assert results.device_tag(device) == device, path.name
        assert f"`{path.name}`" in readme, f"{path.name} has no line in bench/results/README.md"
        data = json.loads(path.read_text())
        meta = data.get("meta", data)
        assert meta.get("git_commit"), f"{path.name} records no commit"


@pytest.mark.parametrize(
    ("only", "model", "group"),
    [("gemm,copy,rms_norm,rope,softmax,gemv,decode", "tinyllama", "kernels"),
     ("gemm,rms_norm,rope,softmax,gemv,decode", "tinyllama", "kernels"),
     ("chain64,linear_gelu", "tinyllama", "compiled"),
     ("dispatch,compile_time", "tinyllama", "dispatch"),
     ("copy,read_floor", "tinyllama", "read-floor"),
     ("copy,sdpa", "tinyllama", "sdpa"),
     ("copy,llm", "tinyllama", "llm"),
     ("copy,llm", "llama2-7b", "llm-7b"),
     ("copy,quant,quant_llm", "tinyllama", "quant"),
     ("transfer", "tinyllama", "transfer")],
)  # fmt: skip
def test_result_group_of_a_run(only: str, model: str, group: str) -> None:
    assert results.result_group(set(only.split(",")), model) == group
    assert results.result_path("NVIDIA H200", group) == results.RESULTS_DIR / f"h200-{group}.json"


def test_result_groups_name_harness_groups() -> None:
    for members in results.RESULT_GROUPS.values():
        assert members <= set(GROUPS)


def test_result_groups_share_no_harness_group() -> None:
    seen: set[str] = set()
    for members in results.RESULT_GROUPS.values():
        assert not members & seen, f"{sorted(members & seen)} recorded in two result files"
        seen |= members


def test_json_without_file_needs_one_result_group() -> None:
    with pytest.raises(SystemExit, match="no result group"):
        main(["--only", "rope,softmax", "--json"])
    with pytest.raises(ValueError, match="no result file"):
        results.result_group({"llm"}, "mistral")


def test_result_path_outside_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="name the file"):
        results.result_path("NVIDIA H200", "kernels", tmp_path / "missing")


def test_read_floor_probe_compiles() -> None:
    toolchain = pytest.importorskip("pygpukit.backends.cuda.toolchain")
    try:
        toolchain.load_nvrtc()
    except Exception as exc:  # no NVRTC in this environment: nothing to compile with
        pytest.skip(f"NVRTC unavailable: {exc}")
    from pygpukit.backends.cuda.kernels import loader
    from pygpukit.bench import read_floor

    cubin = loader.compile_source(read_floor.probe_source(), "sm_90", ("-std=c++17",))
    assert cubin[:4] == b"\x7fELF"
    for name in (b"pgk_floor_read", b"pgk_floor_merge"):
        assert name in cubin


def test_read_floor_result_measured_the_decode_attentions_bytes() -> None:
    # The kept run (bench/results/h200-read-floor.json) timed the bytes this group times.
    from pygpukit.bench import read_floor

    data = json.loads((results.RESULTS_DIR / "h200-read-floor.json").read_text())
    measured = {r["bytes"] for r in data["rows"]}
    assert measured == {read_floor.decode_bytes(c) for c in read_floor.CONTEXTS}
    # K and V of 4 KV heads x 128 dims in bf16 over 8192 positions, plus q and o of 32 heads.
    assert read_floor.decode_bytes(8192) == 2 * 8192 * 4 * 128 * 2 + 2 * 32 * 128 * 2
