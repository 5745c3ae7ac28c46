"""A long elementwise chain fuses into one expression hundreds of levels deep: running it,
compiling it and printing it (`pygpukit graph dump`) must not exhaust the Python stack
(the printer once took two frames a level and failed near 330 levels)."""

from __future__ import annotations

import numpy as np

import pygpukit as gpk
from pygpukit.cli import main

DEPTH = 200


def chain(x: gpk.GPUArray) -> gpk.GPUArray:
    for _ in range(DEPTH):
        x = gpk.sin(x) * 0.9
    return x


def _ref(a: np.ndarray) -> np.ndarray:
    r = a.astype(np.float64)
    for _ in range(DEPTH):
        r = np.sin(r) * 0.9
    return r


def test_deep_chain_runs_lazy_and_compiled() -> None:
    a = np.random.default_rng(8).standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(chain(gpk.from_numpy(a)).to_numpy(), _ref(a), rtol=1e-4, atol=1e-6)
    out = gpk.compile(chain)(gpk.from_numpy(a)).to_numpy()
    np.testing.assert_allclose(out, _ref(a), rtol=1e-4, atol=1e-6)


def test_deep_chain_graph_dump(tmp_path, capsys) -> None:
    src = tmp_path / "deep.py"
    src.write_text(
        "import pygpukit as gpk\n\n\ndef f(x):\n    for _ in range(200):\n"
        "        x = gpk.sin(x) * 0.9\n    return x\n"
    )
    assert main(["graph", "dump", f"{src}:f", "--arg", "f32[8]"]) == 0
    out = capsys.readouterr().out
    assert "# kernels (1)" in out and "fused_elementwise" in out
