"""`python -m pygpukit.benchmark` (the original project's command) on the CPU backend, and
`python -m pygpukit.bench` without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pygpukit as gpk
from pygpukit import benchmark


def test_quick_save_compare_markdown(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    saved = tmp_path / "base.json"
    assert benchmark.main(["--quick", "--save", str(saved)]) == 0
    first = json.loads(saved.read_text())
    # (the backend of this process: PYGPUKIT_BACKEND counts only before the first array)
    assert first["backend"] == gpk.backend_name() and first["quick"] is True
    names = {"matmul", "elementwise", "reduction", "compiled_block"}
    assert set(first["median_ms"]) == names and all(v > 0 for v in first["median_ms"].values())
    capsys.readouterr()
    # Against itself with a huge threshold: nothing regresses.
    argv = ["--quick", "--compare", str(saved), "--markdown", "--threshold", "1e9"]
    assert benchmark.main([*argv, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "| workload | ms | before ms | ratio |  |"
    assert {ln.split(" | ")[0].lstrip("| ") for ln in out[3:]} == names
    # A baseline a million times faster: every workload regressed, exit 1 only when asked.
    fast = dict(first, median_ms={k: v / 1e6 for k, v in first["median_ms"].items()})
    fast_file = tmp_path / "fast.json"
    fast_file.write_text(json.dumps(fast))
    assert benchmark.main(["--quick", "--compare", str(fast_file)]) == 0
    assert benchmark.main(["--quick", "--compare", str(fast_file), "--fail-on-regression"]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("REGRESSED") == 8
    assert "regression (> 20% slower): matmul, elementwise" in captured.err


def test_compare_refuses_other_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit):
        benchmark.main(["--quick", "--compare", str(bad)])
    with pytest.raises(SystemExit):
        benchmark.main(["--fail-on-regression"])
    other = tmp_path / "full.json"
    other.write_text(json.dumps({"format": benchmark.FORMAT, "backend": gpk.backend_name(),
                                 "quick": False,
                                 "median_ms": {"matmul": 1.0}}))  # fmt: skip
    with pytest.raises(SystemExit, match="quick=False"):
        benchmark.main(["--quick", "--compare", str(other)])


def test_bench_without_torch_runs_our_rows_alone(tmp_path) -> None:
    """Without torch the peers cannot run: the bench says which extra brings them and
    times PyGPUkit's own workloads alone."""
    out = tmp_path / "own.json"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from pygpukit.bench.__main__ import main\n"
            f"sys.exit(main(['--quick', '--json', {str(out)!r}]))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "pygpukit[bench]"' in proc.stderr and "no peers" in proc.stderr
    assert "Traceback" not in proc.stderr
    saved = json.loads(out.read_text())
    assert set(saved["median_ms"]) >= {"matmul", "elementwise"}
    assert all(v > 0 for v in saved["median_ms"].values())
