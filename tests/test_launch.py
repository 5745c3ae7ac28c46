"""`pygpukit launch`: its arguments, the one-line error without enough GPUs, the
torchrun-style environment each rank gets, and stopping the others when one rank fails."""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

import pygpukit as gpk
from pygpukit.cli import main
from pygpukit.distributed import launch as launcher


def test_needs_one_gpu_per_process(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(launcher, "gpus_available", lambda: (0, "no driver here"))
    assert main(["launch", "-n", "2", "script.py", "--flag"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pygpukit: error: DistributedError: launch: -n 2 needs 2 GPUs, one per "
                   "process; this machine has 0 (no driver here)"]  # fmt: skip


def test_bad_arguments(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(launcher, "gpus_available", lambda: (8, ""))
    with pytest.raises(SystemExit) as e:
        main(["launch", "script.py"])  # no -n
    assert e.value.code == 2
    assert "-n/--nproc" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["launch", "-n", "two", "script.py"])
    assert e.value.code == 2
    assert main(["launch", "-n", "0", "script.py"]) == 1
    assert "-n must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["launch", "-n", "2", str(tmp_path / "missing.py")]) == 1
    assert "no such script" in capsys.readouterr().err


def test_ranks_get_torchrun_variables(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(launcher, "gpus_available", lambda: (4, ""))
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "PYGPUKIT_RENDEZVOUS_FILE", "NCCL_NVLS_ENABLE"]
        out = {k: os.environ.get(k) for k in keys}
        out["argv"] = sys.argv[1:]
        with open(os.path.join(os.path.dirname(__file__), f"out{out['RANK']}.json"), "w") as f:
            json.dump(out, f)
    """)
    )
    assert main(["launch", "-n", "3", str(script), "--tp", "3", "-x"]) == 0
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(3)]
    for r, o in enumerate(outs):
        assert o["RANK"] == o["LOCAL_RANK"] == str(r)
        assert o["WORLD_SIZE"] == o["LOCAL_WORLD_SIZE"] == "3"
        assert o["NCCL_NVLS_ENABLE"] == "0" and o["MASTER_ADDR"] == "127.0.0.1"
        assert o["argv"] == ["--tp", "3", "-x"]
    assert len({o["MASTER_PORT"] for o in outs}) == 1
    assert len({o["PYGPUKIT_RENDEZVOUS_FILE"] for o in outs}) == 1


def test_a_failing_rank_stops_the_others(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(launcher, "gpus_available", lambda: (2, ""))
    script = tmp_path / "fail.py"
    body = "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)"
    script.write_text(f"import os, sys, time\n{body}\n")
    t0 = time.monotonic()
    assert launcher.launch(2, str(script), []) == 3
    assert time.monotonic() - t0 < 60  # rank 0 was stopped, not waited for


def test_rendezvous_through_a_file(tmp_path, monkeypatch) -> None:
    from pygpukit.distributed import rendezvous

    monkeypatch.setenv(rendezvous.RENDEZVOUS_FILE, str(tmp_path / "id"))
    uid = bytes(range(128))
    assert rendezvous.exchange_unique_id(0, 2, lambda: uid) == uid
    assert rendezvous.exchange_unique_id(1, 2, lambda: b"unused") == uid


def test_launch_runs_a_module(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(launcher, "gpus_available", lambda: (2, ""))
    (tmp_path / "rankmod.py").write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], 'm' + os.environ['RANK']), 'w').close()\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert main(["launch", "-n", "2", "-m", "rankmod", str(tmp_path)]) == 0
    assert (tmp_path / "m0").exists() and (tmp_path / "m1").exists()


def test_generate_tp_outside_launch_is_one_line(capsys, monkeypatch) -> None:
    assert main(["generate", "--model", "tiny", "--tp", "2", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    launched = "`pygpukit launch -n 2 -m pygpukit generate ... --tp 2`"
    assert err[-1] == (f"pygpukit generate: --tp 2 runs as 2 processes: start it with "
                       f"{launched} (this process is one of 1)")  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["generate", "--model", "tiny", "--tp", "2", "--max-new-tokens", "2"]) == 1
    # Rank 1 of 2 without `pygpukit launch`: the NumPy backend has no second rank to give;
    # a GPU backend has, but no rendezvous to meet it at.
    err_text = capsys.readouterr().err
    assert ("needs one GPU each" if gpk.backend_name() == "cpu" else "to meet at") in err_text
    assert main(["generate", "--model", "tiny", "--tp", "0"]) == 1
    assert "--tp must be >= 1, got 0" in capsys.readouterr().err
