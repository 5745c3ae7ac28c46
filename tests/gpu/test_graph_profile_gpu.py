"""`pygpukit graph profile` on the GPU: the per-kernel table and the whole function's CUDA
Graph replay time, in the text and the JSON output. Timings are only checked loosely (a
positive replay time, below the per-kernel sum plus a generous launch allowance)."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

import pytest

from pygpukit.cli import main

pytestmark = pytest.mark.gpu

FUNCTIONS = textwrap.dedent(
    """
    import pygpukit as gpk

    w = gpk.random.normal((256, 256), seed=0)


    def chain(x):
        for i in range(8):
            x = gpk.tanh(x * 0.9 + 0.01 * (i + 1)) * 1.5
        return x


    def mm(x):
        return gpk.nn.gelu(x @ w, approximate="tanh") * 0.5 + gpk.exp(x)


    def scaled(x, k):
        return (x @ w) * k
    """
)

# The replay is timed per call with the host dispatch included when it is the longer side;
# the kernels are timed one by one with an event pair (and a launch) each. 1 ms is far more
# than either side's overhead for graphs of a few small kernels.
ALLOWANCE_MS = 1.0

ROW = re.compile(r"^ *(\d+) (\S+) +([0-9.]+)us +([0-9,]+) +([0-9.]+) +([0-9.]+)%", re.M)
REPLAY = re.compile(r"^    replay ([0-9.]+)us per call \(CUDA Graph.*per-kernel sum ([0-9.]+)us",
                    re.M)  # fmt: skip

CASES = [
    ("chain", ["f32[65536]"], {"fused_elementwise"}),
    ("mm", ["f32[128,256]"], {"fused_elementwise"}),
    ("scaled", ["f32[64,256]", "0.5"], set()),
]


@pytest.fixture
def functions(tmp_path: Any) -> str:
    p = tmp_path / "gp_functions.py"
    p.write_text(FUNCTIONS)
    return str(p)


def _run(capsys: Any, target: str, args: list[str], *extra: str) -> str:
    argv = ["graph", "profile", target]
    for a in args:
        argv += ["--arg", a]
    assert main(argv + ["--repeat", "3", "--replays", "10", *extra]) == 0
    return str(capsys.readouterr().out)


@pytest.mark.parametrize(("name", "args", "ops"), CASES, ids=[c[0] for c in CASES])
def test_profile_text_lists_kernels_and_replay(
    cuda: Any, functions: str, capsys: Any, name: str, args: list[str], ops: set[str]
) -> None:
    out = _run(capsys, f"{functions}:{name}", args)
    rows = ROW.findall(out)
    assert rows, out
    assert ops <= {r[1] for r in rows}, out
    for _, _, us, nbytes, _, _ in rows:
        assert float(us) >= 0 and int(nbytes.replace(",", "")) > 0, out
    assert "copy bandwidth" in out and f"in {len(rows)} kernels" in out, out
    m = REPLAY.search(out)
    assert m is not None, out  # captured: a time, not "not captured"
    replay_us, sum_us = float(m.group(1)), float(m.group(2))
    assert replay_us > 0, out
    assert replay_us < sum_us + ALLOWANCE_MS * 1e3, out


@pytest.mark.parametrize(("name", "args", "ops"), CASES, ids=[c[0] for c in CASES])
def test_profile_json_has_replay(
    cuda: Any, functions: str, capsys: Any, name: str, args: list[str], ops: set[str]
) -> None:
    doc = json.loads(_run(capsys, f"{functions}:{name}", args, "--format", "json"))
    assert doc["name"] == name
    kernels = doc["kernels"]
    assert kernels and ops <= {k["op"] for k in kernels}
    for k in kernels:
        assert {"step", "op", "loc", "origin", "ms", "bytes", "gbs"} <= set(k)
        assert k["ms"] >= 0 and k["bytes"] > 0
    assert doc["copy_gbs"] is None or doc["copy_gbs"] > 0
    assert doc["kernel_sum_ms"] == pytest.approx(sum(k["ms"] for k in kernels))
    replay = doc["replay"]
    assert replay["captured"] is True and replay["fallback"] is None, replay
    assert replay["num_nodes"] >= 1 and replay["calls"] == 10
    assert 0 < replay["ms"] < doc["kernel_sum_ms"] + ALLOWANCE_MS, doc
