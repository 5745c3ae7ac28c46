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


def test_floor_rows_against_float32():
    """--floor: the unquantized bf16 model first (format none: its own reference), then
    each format, all also against the float32 model's logits computed here."""
    rows = qa.run("small", prompts=16, prompt_len=8, formats=["int8"], dtype="bfloat16",
                  floor=True)  # fmt: skip
    assert [r["format"] for r in rows] == ["none", "int8"]
    assert rows[0]["top1_agreement"] == 1.0 and rows[0]["logits_rel_err"] == 0.0
    cfg = qa.small_config()
    host = qa.random_weights(cfg, 0)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (16, 8))
    ref32 = qa.last_logits(qa.build_model(cfg, host, "float32"), ids).astype(np.float64)
    bf16 = qa.last_logits(qa.build_model(cfg, host, "bfloat16"), ids).astype(np.float64)
    err = np.linalg.norm(bf16 - ref32) / np.linalg.norm(ref32)
    assert np.isclose(rows[0]["logits_rel_err_vs_float32"], err)
    assert rows[0]["top1_agreement_vs_float32"] == (bf16.argmax(-1) == ref32.argmax(-1)).mean()
    assert 0.0 < rows[1]["logits_rel_err_vs_float32"] < 1.0
    assert rows[0]["median_top1_gap"] == qa.median_top1_gap(ref32)


def test_median_top1_gap_by_hand():
    logits = np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 5.0, 1.0, 1.0], [0.0, 4.0, 0.0, 0.0]])
    gaps = [1.0 / np.std(logits[0]), 0.0, 4.0 / np.std(logits[2])]
    assert np.isclose(qa.median_top1_gap(logits), np.median(gaps))


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


def test_cli_floor_prints_the_float32_columns(capsys):
    argv = ["--model", "small", "--prompts", "4", "--prompt-len", "4", "--formats", "int8",
            "--dtype", "bfloat16", "--floor"]  # fmt: skip
    assert qa.main(argv) == 0
    printed = capsys.readouterr().out
    assert "vs float32" in printed and "bfloat16 (unquantized)" in printed
    assert "median top-1 gap" in printed
