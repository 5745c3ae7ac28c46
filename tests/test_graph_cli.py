"""`pygpukit graph dump | diff | profile` in each format, on a model file written here."""

from __future__ import annotations

import json
import textwrap

import pytest

from pygpukit.cli import main

MODEL = textwrap.dedent(
    """
    import math

    import pygpukit as gpk

    w = gpk.random.normal((64, 32), seed=0)
    b = gpk.random.normal((64,), seed=1)
    g = gpk.random.normal((64,), seed=2)


    def block(x):
        h = gpk.nn.gelu(x @ w.T + b, approximate="tanh")
        return h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * g


    def norm_eps(x, eps):
        return x * gpk.rsqrt((x * x).mean(-1, keepdims=True) + eps)


    def chain(x, k):
        return (gpk.exp(x * 2.0 + 1.0) * x).sum(-1) * k


    @gpk.compile
    def compiled(x):
        return gpk.tanh(x) * 2.0
    """
)


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return str(p)


def test_dump_text(model, capsys):
    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]"]) == 0
    out = capsys.readouterr().out
    assert "# after traced" in out and "# after fuse_linear" in out
    assert "def block(in0: f32[4,32]" in out
    assert "linear(in0, in1, in2, activation='gelu_tanh', has_bias=True)" in out
    assert "# model.py:12; fuse_linear from permute, matmul, add, gelu" in out
    assert "rms_norm: matched at model.py:13 (6 ops -> 1)" in out
    assert "# provenance" in out and "fuse_rms_norm" in out
    assert "# memory plan: arena" in out and "naive" in out
    assert "# kernels (2)" in out


def test_dump_reports_near_miss_with_line(model, capsys):
    assert main(["graph", "dump", f"{model}:norm_eps", "--arg", "f32[4,32]", "--arg",
                 "f32[1]"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "rms_norm: missed at model.py:17, eps is a tensor" in out
    assert "fused_elementwise[" in out  # the generic fusion still runs


def test_dump_after_pass_and_static_arg(model, capsys):
    assert main(["graph", "dump", f"{model}:chain", "--arg", "f32[3,8]", "--arg", "2.5",
                 "--after", "fuse_elementwise"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("# after ") == 1 and "# after fuse_elementwise (" in out
    assert "fused_reduce[sum(mul(exp(add(mul(in0, 2.0), 1.0)), in0)" in out
    assert main(["graph", "dump", f"{model}:chain", "--arg", "f32[3,8]", "--arg", "1",
                 "--after", "nope"]) == 2  # fmt: skip
    assert "pygpukit: error: --after nope: no pass named 'nope'" in capsys.readouterr().err


def test_dump_json_dot_and_diff(model, tmp_path, capsys):
    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]", "--format",
                 "json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    final = doc["graphs"][-1]["graph"]
    assert [n["op"] for n in final["nodes"] if n["op"] != "input"] == ["linear", "rms_norm"]
    assert doc["memory_plan"]["arena_bytes"] <= doc["memory_plan"]["naive_bytes"]
    assert [p["pass"] for p in doc["provenance"]][0] == "dead_code_elimination"
    assert {r["pattern"] for r in doc["report"]} == {"linear", "rms_norm"}
    assert len(doc["kernels"]) == 2
    a = tmp_path / "a.json"
    a.write_text(json.dumps(doc))

    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[8,32]", "--format",
                 "json"]) == 0  # fmt: skip
    b = tmp_path / "b.json"
    b.write_text(capsys.readouterr().out)
    assert main(["graph", "diff", str(a), str(a)]) == 0
    assert "(no differences)" in capsys.readouterr().out
    assert main(["graph", "diff", str(a), str(b)]) == 1  # as diff(1): they differ
    out = capsys.readouterr().out
    assert "- linear float32[4, 64] model.py:12" in out
    assert "+ linear float32[8, 64] model.py:12" in out

    assert main(["graph", "dump", f"{model}:compiled", "--arg", "f32[4]", "--format",
                 "dot"]) == 0  # fmt: skip
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "compiled" {') and '"in0" -> "t0";' in dot


def test_bad_targets(model, capsys):
    for argv, message in (
        (["model.py"], "expected FILE.py:FUNC, got 'model.py'"),
        ([f"{model}:nope"], "has no 'nope'"),
        ([f"{model}:block", "--arg", "f32[4,"], "--arg 'f32[4,' is neither dtype[shape]"),
    ):
        assert main(["graph", "dump", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("pygpukit: error: ") and message in err and err.count("\n") == 1


def test_profile_needs_cuda(model, capsys, monkeypatch):
    from pygpukit.backends import get_backend

    if get_backend().name == "cuda":
        pytest.skip("runs on the GPU; covered by the GPU suite")
    assert main(["graph", "profile", f"{model}:block", "--arg", "f32[4,32]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pygpukit: error: graph profile needs the CUDA backend")
    assert err.count("\n") == 1


def test_debug_env_prints_kernel_table(monkeypatch, caplog):
    import numpy as np

    import pygpukit as gpk
    from pygpukit import settings

    monkeypatch.setenv("PYGPUKIT_DEBUG", "1")
    settings.reload()  # kept from its first read
    x = gpk.from_numpy(np.arange(6, dtype=np.float32))
    with caplog.at_level("WARNING", logger="pygpukit"):
        (gpk.exp(x) * 2.0 + x).sum().to_numpy()
    text = caplog.text  # the `pygpukit` logger: stderr without logging set up
    assert "realize: 1 steps" in text and "fused_reduce" in text and "GB/s" in text


def test_format_replay_line():
    from pygpukit.profiling import format_replay

    replay = {"captured": True, "ms": 0.0125, "calls": 20, "reps": 15, "num_nodes": 3,
              "fallback": None}  # fmt: skip
    line = format_replay(replay, 0.025)
    assert line == ("    replay 12.5us per call (CUDA Graph of 3 nodes, median of 15 x 20 "
                    "calls; per-kernel sum 25.0us, 0.50x)")  # fmt: skip
    assert "per-kernel sum 0.0us)" in format_replay(replay, 0.0)  # no ratio without a sum
    missed = dict(replay, captured=False, ms=None, fallback="softmax at m.py:3: CUDAError: x")
    assert format_replay(missed, 0.025) == (
        "    replay: not captured as a CUDA Graph (softmax at m.py:3: CUDAError: x); no replay time"
    )
    none = format_replay({"captured": False, "ms": None}, 0.025, "cpu")
    assert "not captured" in none and "cpu backend made no capture" in none
    assert "us per call" not in none


def test_time_calls_host_timer():
    from pygpukit.profiling import time_calls

    n = []
    ms = time_calls(lambda: n.append(sum(range(2000))), calls=4, reps=3)
    assert len(n) == 12 and 0 < ms < 1000


def test_profile_pieces_on_cpu(model, capsys):
    """What `graph profile` runs after its CUDA check, on the NumPy backend: the kernel
    table, the replay profile (no capture here: no replay time) and both output formats."""
    import pygpukit as gpk
    from pygpukit.backends import get_backend
    from pygpukit.cli import graph as cli
    from pygpukit.passes import lower, run_pipeline
    from pygpukit.profiling import profile as run_profile
    from pygpukit.profiling import replay_profile

    backend = get_backend()
    if backend.name == "cuda":
        pytest.skip("the GPU suite runs the command itself")
    fn = cli.load_function(f"{model}:chain")
    parsed = tuple(cli.parse_arg(a) for a in ("f32[3,8]", "2.5"))
    traced = cli.trace_function(fn, parsed)
    host = cli.random_inputs(traced)
    assert [a.shape for a in host] == [(3, 8)]
    args = cli.call_args(parsed, host)
    assert args[1] == 2.5 and args[0].shape == (3, 8)
    inputs = [backend.from_numpy(a) for a in host]
    inputs += [p._node.realized for p in traced.persistent] + list(traced.constants)
    rows = run_profile(lower(run_pipeline(traced.graph)), inputs, repeats=1, backend=backend)
    f = gpk.compile(fn, static_outputs=True)
    replay = replay_profile(f, args, calls=2, reps=2, backend=backend)
    assert replay["captured"] is False and replay["ms"] is None
    assert f.stats()["misses"] == 1 and f.stats()["calls"] >= 2

    cli.print_profile("text", "chain", rows, 100.0, replay)
    out = capsys.readouterr().out
    assert "fused_reduce" in out and "total " in out and "GB/s" in out
    assert out.rstrip().endswith("no replay time")
    cli.print_profile("json", "chain", rows, float("inf"), replay)
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "chain" and doc["copy_gbs"] is None
    assert [r["op"] for r in doc["kernels"]] == [r["op"] for r in rows]
    assert {"step", "op", "loc", "origin", "ms", "bytes", "gbs"} <= set(doc["kernels"][0])
    assert doc["kernel_sum_ms"] == pytest.approx(sum(r["ms"] for r in rows))
    assert doc["replay"]["captured"] is False and doc["replay"]["ms"] is None
