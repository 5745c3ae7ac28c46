"""`pygpukit generate --model tiny` end to end on the CPU backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pygpukit.cli import main
from pygpukit.llm.tiny import write_tiny_model


def test_generate_tiny(capsys):
    rc = main(["generate", "--model", "tiny", "--prompt", "Alice was", "--max-new-tokens", "12",
               "--ignore-eos"])  # fmt: skip
    cap = capsys.readouterr()
    out, err = cap.out, cap.err
    assert rc == 0
    # stdout is the text alone: the prompt, its continuation, a newline.
    assert out.startswith("Alice was") and out.count("\n") == 1 and out.endswith("\n")
    assert re.search(r"prefill\s+[\d.]+ ms \(\d+ tokens, padded to 16 in 1 chunk, batch 1\)", err)
    load = re.search(r"load\s+([\d.]+) MB in ([\d.]+) s = ([\d.]+) GB/s", err)
    assert load is not None
    mb, seconds, gbs = (float(g) for g in load.groups())
    weights = os.path.getsize(os.path.join(write_tiny_model(), "model.safetensors")) / 1e6
    assert abs(mb - weights) <= 0.1 and seconds > 0 and gbs >= 0
    assert re.search(r"decode\s+[\d.]+ tok/s per sequence.*\(11 steps", err)
    bandwidth = r"[\d.]+ GB/s (host memcpy|device-to-device copy)"
    assert re.search(r"weights read [\d.]+ GB/s = [\d.]+% of the " + bandwidth, err)


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


def test_generate_zero_new_tokens_is_the_prompt(capsys):
    """--max-new-tokens 0: the prompt alone and exit 0, as Hugging Face's generate."""
    assert (
        main(["generate", "--model", "tiny", "--prompt", "Alice was", "--max-new-tokens", "0"]) == 0
    )
    cap = capsys.readouterr()
    assert cap.out == "Alice was\n"
    assert "prefill      not run" in cap.err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
        (["--seed", "-1", "--temperature", "0.5"], "seed must be None or an integer >= 0"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--temperature", "-2"], "temperature must be >= 0"),
    ],
)
def test_generate_bad_flags_one_line(capsys, flags, message):
    assert main(["generate", "--model", "tiny", *flags]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("pygpukit generate: ")
    assert message in cap.err


def test_generate_bad_flag_subprocess(tmp_path):
    """The installed entry point: one line on stderr, a non-zero status, no traceback."""
    env = dict(os.environ, PYGPUKIT_BACKEND="cpu")
    argv = [sys.executable, "-m", "pygpukit", "generate", "--model", "tiny", "--batch", "0"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("pygpukit: no usable CUDA")]
    assert lines == ["pygpukit generate: --batch must be >= 1, got 0"]


def test_generate_tiny_without_tokenizers_names_the_extra(tmp_path):
    """`pip install .` has no `tokenizers`: the command says which extra brings it."""
    code = ("import sys; sys.modules['tokenizers'] = None\n"
            "from pygpukit.cli import main\n"
            "sys.exit(main(['generate', '--model', 'tiny', '--max-new-tokens', '2']))")  # fmt: skip
    env = dict(os.environ, PYGPUKIT_BACKEND="cpu", PYGPUKIT_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pygpukit")
    assert 'pip install "pygpukit[llm]"' in lines[0]


@pytest.mark.parametrize("flags, label", [(["--quantize", "int8"], "int8"),
                                          (["--quantize", "fp8"], "fp8 b128"),
                                          (["--quantize", "int4", "--quant-group", "4"],
                                           "int4 g4")])  # fmt: skip
def test_generate_tiny_quantized(capsys, flags, label):
    argv = ["generate", "--model", "tiny", "--max-new-tokens", "5", "--ignore-eos", *flags]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"float32 (linears {label})" in err
    assert re.search(r"decode\s+[\d.]+ tok/s per sequence.*\(4 steps", err)


def test_generate_quantize_bad_values(capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", "tiny", "--quantize", "int3"])
    assert info.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err
    # The tiny model's K=64 is no multiple of the group 128: one line naming both, exit 1.
    assert main(["generate", "--model", "tiny", "--quantize", "int4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "group 128 does not divide K=64" in err
