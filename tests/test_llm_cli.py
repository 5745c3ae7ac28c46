"""`pygpukit generate --model tiny` end to end on the CPU backend."""

from __future__ import annotations

import re

import pytest

from pygpukit.cli import main


def test_generate_tiny(capsys):
    rc = main(["generate", "--model", "tiny", "--prompt", "Alice was", "--max-new-tokens", "12",
               "--ignore-eos"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("Alice was")
    assert re.search(r"prefill\s+[\d.]+ ms", out)
    assert re.search(r"decode\s+[\d.]+ tok/s per sequence.*\(11 steps", out)
    bandwidth = r"[\d.]+ GB/s (host memcpy|device-to-device copy)"
    assert re.search(r"weights read [\d.]+ GB/s = [\d.]+% of the " + bandwidth, out)


def test_generate_tiny_sampled_batch(capsys):
    argv = ["generate", "--model", "tiny", "--max-new-tokens", "6", "--batch", "4",
            "--temperature", "0.8", "--top-k", "10", "--top-p", "0.9", "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert "[3] Alice was" in first
    text = [ln for ln in first.splitlines() if ln.startswith("[")]
    assert text == [ln for ln in second.splitlines() if ln.startswith("[")]  # seeded


def test_generate_bad_model_dir(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope")]) == 1
    assert "not a model directory" in capsys.readouterr().err


def test_generate_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    for opt in ("--temperature", "--top-k", "--top-p", "--seed", "--batch", "--max-new-tokens"):
        assert opt in out
