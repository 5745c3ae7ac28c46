"""The quant_accuracy report on the CPU: its rows against an independent computation."""

from __future__ import annotations

import json
import os

import numpy as np

from pygpukit.bench import quant_accuracy as qa

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "llm", "llama")


def test_rows_on_the_small_random_model():
    rows = qa.run("small", prompts=24, prompt_len=8)
    assert [r["format"] for r in rows] == ["int8", "fp8", "int4"]
    assert [r["label"] for r in rows] == ["int8", "fp8 b128", "int4 g128"]
    for r in rows:
        assert r["prompts"] == 24 and 0.0 <= r["top1_agreement"] <= 1.0
        assert 0.0 < r["logits_rel_err"] < 1.0
        assert r["weight_bytes"] < r["float_weight_bytes"]
    # int8 rounds finer than e4m3 (3 mantissa bits), which rounds finer than int4.
    errs = [r["logits_rel_err"] for r in rows]
    assert errs[0] < errs[1] < errs[2]


def test_compare_by_hand():
    base = np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 1.0]], np.float32)
    quant = np.array([[1.0, 1.5, 0.0], [3.0, 0.0, 1.0]], np.float32)
    got = qa.compare(base, quant)
    assert got["top1_agreement"] == 1.0
    assert np.isclose(got["logits_rel_err"], 0.5 / np.sqrt(15.0))
    assert qa.compare(base, quant[:, ::-1])["top1_agreement"] == 0.5  # row 1 moves to 2


def test_cli_on_a_model_directory(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--model", FIXTURE, "--prompts", "8", "--prompt-len", "4", "--formats", "int8,int4",
            "--group", "32", "--json", str(out)]  # fmt: skip
    assert qa.main(argv) == 0
    printed = capsys.readouterr().out
    assert "int4 g32" in printed and "top-1 agreement" in printed
    rows = json.loads(out.read_text())
    assert [r["format"] for r in rows] == ["int8", "int4"] and rows[0]["model"] == FIXTURE
