"""The `pygpukit` command as a command: --version, one-line errors and exit codes, --debug,
Ctrl-C, a closed pipe, -v/-q over the `pygpukit` logger, --json, and `graph dump --skip`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pygpukit
from pygpukit import settings
from pygpukit.cli import main

MODEL = textwrap.dedent(
    """
    import logging

    import pygpukit as gpk

    w = gpk.random.normal((64, 32), seed=0)
    b = gpk.random.normal((64,), seed=1)
    g = gpk.random.normal((64,), seed=2)


    def block(x):
        h = gpk.nn.gelu(x @ w.T + b, approximate="tanh")
        return h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * g


    def wrong_shape(x):
        return x @ w


    def branches(x):
        if x.sum() > 0:
            return x
        return -x


    def divides(x):
        return 1 / 0


    def interrupted(x):
        raise KeyboardInterrupt


    def logs(x):
        logging.getLogger("pygpukit.user").info("an info record")
        logging.getLogger("pygpukit.user").warning("a warning record")
        return x * 2.0


    def waits(x):
        open(__file__ + ".started", "w").close()
        import time
        time.sleep(120)


    def long(x):
        for _ in range(100):  # about 300 KB of text
            x = gpk.exp(x) * 0.5
        return x
    """
)
# The line of MODEL the shape error must name.
WRONG_SHAPE_LINE = MODEL.splitlines().index("    return x @ w") + 1


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return str(p)


def run_cli(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYGPUKIT_BACKEND="cpu", **kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "pygpukit", *argv], capture_output=True,
                          text=True, env=env, timeout=300, **kw)  # fmt: skip


def one_error_line(err: str) -> str:
    """The stderr of a failed command: exactly one line, the error, no traceback."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pygpukit: error: ")
    return lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"pygpukit {pygpukit.__version__}\n"


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["{m}:block"], 2, "block(x) takes one --arg per parameter; got 0: missing a required"),
        (["{m}:block", "--arg", "f32[4,32]", "--arg", "3"], 2,
         "block(x) takes one --arg per parameter; got 2: too many positional arguments"),
        (["{m}:w", "--arg", "f32[4,32]"], 2, "model.py:w is a GPUArray, not a function"),
        (["{m}:block", "--arg", "f32[4,32]", "--skip", "nope"], 2, "--skip nope: no pass"),
        (["{m}:block", "--arg", "f32[4,32]", "--skip", "fuse_linear", "--after", "fuse_linear"],
         2, "--after fuse_linear: that pass is skipped"),
        (["{m}:wrong_shape", "--arg", "f32[4,32]"], 1,
         "ShapeError: matmul: matmul: inner dimensions differ: (4, 32) @ (64, 32)"),
        (["{m}:branches", "--arg", "f32[4,32]"], 1, "TraceError: "),
        (["{m}:divides", "--arg", "f32[4,32]"], 1,
         "ZeroDivisionError: division by zero (run with --debug for the traceback)"),
    ],
)  # fmt: skip
def test_dump_errors_are_one_line(model, capsys, argv, status, message):
    assert main(["graph", "dump", *(a.format(m=model) for a in argv)]) == status
    cap = capsys.readouterr()
    line = one_error_line(cap.err)
    assert message in line
    assert cap.out == ""


def test_shape_error_names_the_users_line(model, capsys):
    assert main(["graph", "dump", f"{model}:wrong_shape", "--arg", "f32[4,32]"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.endswith(f"at {model}:{WRONG_SHAPE_LINE}")


def test_debug_flag_and_env_show_the_traceback(model, capsys, monkeypatch):
    argv = ["graph", "dump", f"{model}:wrong_shape", "--arg", "f32[4,32]"]
    monkeypatch.delenv("PYGPUKIT_DEBUG", raising=False)
    assert main([*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "ShapeError" in err
    assert err.splitlines()[-1].startswith("pygpukit: error: ShapeError: matmul")
    assert main(["--debug", *argv]) == 1  # before the subcommand too
    assert capsys.readouterr().err.startswith("Traceback")
    monkeypatch.setenv("PYGPUKIT_DEBUG", "1")
    settings.reload()  # kept from its first read
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("Traceback")


def test_keyboard_interrupt_is_one_line(model, capsys):
    assert main(["graph", "dump", f"{model}:interrupted", "--arg", "f32[4]"]) == 130
    assert capsys.readouterr().err == "pygpukit: interrupted\n"


def test_diff_bad_inputs_exit_2(model, tmp_path, capsys):
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    no_graphs = tmp_path / "obj.json"
    no_graphs.write_text('{"name": "f"}')
    bad_node = tmp_path / "node.json"
    bad_node.write_text('{"graphs": [{"graph": {"nodes": [[1]]}}]}')
    cases = [
        (listed, "list.json is not the output of `pygpukit graph dump --format json` "
                 "(the top level is a JSON list, not an object)"),
        (no_graphs, "obj.json is not the output of `pygpukit graph dump --format json` "
                    "(no 'graphs')"),
        (bad_node, "node.json is not the output"),
        (tmp_path / "missing.json", "cannot read"),
    ]  # fmt: skip
    for path, message in cases:
        assert main(["graph", "diff", str(path), str(path)]) == 2
        cap = capsys.readouterr()
        assert message in one_error_line(cap.err)
        assert cap.out == ""  # nothing printed before the check


def test_diff_exit_status_like_diff(model, tmp_path, capsys):
    """0 equal, 1 different: a pass skipped makes the graphs differ."""
    dumps = {}
    for name, extra in (("a", []), ("b", ["--skip", "fuse_rms_norm"])):
        assert main(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]", "--format",
                     "json", *extra]) == 0  # fmt: skip
        dumps[name] = tmp_path / f"{name}.json"
        dumps[name].write_text(capsys.readouterr().out)
    assert main(["graph", "diff", str(dumps["a"]), str(dumps["a"])]) == 0
    assert capsys.readouterr().out.rstrip().endswith("(no differences)")
    assert main(["graph", "diff", str(dumps["a"]), str(dumps["b"])]) == 1
    out = capsys.readouterr().out
    assert "rms_norm" in out and "(no differences)" not in out


def final_ops(doc: dict) -> list[str]:
    return [n["op"] for n in doc["graphs"][-1]["graph"]["nodes"] if n["op"] != "input"]


def dump_json(model: str, capsys, *extra: str) -> dict:
    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]", "--format", "json",
                 *extra]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_dump_skip_runs_without_the_pass(model, capsys, monkeypatch):
    monkeypatch.delenv("PYGPUKIT_SKIP_PASSES", raising=False)
    assert final_ops(dump_json(model, capsys)) == ["linear", "rms_norm"]
    skipped = dump_json(model, capsys, "--skip", "fuse_linear")
    ops = final_ops(skipped)
    assert "linear" not in ops and "matmul" in ops and "rms_norm" in ops
    assert "fuse_linear" not in [p["pass"] for p in skipped["provenance"]]
    assert "PYGPUKIT_SKIP_PASSES" not in os.environ  # only for the command
    # The same setting as the environment variable: the same dump.
    monkeypatch.setenv("PYGPUKIT_SKIP_PASSES", "fuse_linear")
    settings.reload()  # kept from its first read
    from_env = dump_json(model, capsys)
    assert from_env["graphs"] == skipped["graphs"] and from_env["kernels"] == skipped["kernels"]
    # Repeatable, and added to what the environment names.
    both = dump_json(model, capsys, "--skip", "fuse_rms_norm")
    assert "linear" not in final_ops(both) and "rms_norm" not in final_ops(both)
    assert os.environ["PYGPUKIT_SKIP_PASSES"] == "fuse_linear"
    monkeypatch.delenv("PYGPUKIT_SKIP_PASSES")
    twice = dump_json(model, capsys, "--skip", "fuse_linear", "--skip", "fuse_rms_norm")
    assert twice["graphs"] == both["graphs"]


def test_verbosity_levels(model, capsys):
    logger = logging.getLogger("pygpukit")
    handlers, level = list(logger.handlers), logger.level
    argv = ["graph", "dump", f"{model}:logs", "--arg", "f32[4]", "--format", "dot"]
    for extra, shown in (([], ["a warning record"]),
                         (["-v"], ["an info record", "a warning record"]),
                         (["-q"], [])):  # fmt: skip
        assert main([*extra, *argv]) == 0
        err = capsys.readouterr().err
        assert [ln for ln in err.splitlines() if "record" in ln] == [
            f"pygpukit: {s}" for s in shown
        ]
        assert main([*argv, *extra]) == 0  # after the subcommand: the same
        assert capsys.readouterr().err == err
    assert main(["-vv", *argv]) == 0
    assert "pygpukit: pygpukit.user: an info record" in capsys.readouterr().err
    assert (logger.handlers, logger.level) == (handlers, level)  # left as it was


def test_verbose_shows_loading_progress(capsys):
    """-v: the loader's progress record (stderr is no terminal here, so no bar)."""
    argv = ["generate", "--model", "tiny", "--max-new-tokens", "1", "--ignore-eos"]
    assert main(["-v", *argv]) == 0
    err = capsys.readouterr().err
    loading = [ln for ln in err.splitlines() if ln.startswith("pygpukit: loading: ")]
    assert len(loading) == 1 and " MB in " in loading[0] and "GB/s" in loading[0]
    assert "\r" not in err and "[#" not in err
    assert main(argv) == 0
    assert "pygpukit: loading" not in capsys.readouterr().err


def test_info_json(monkeypatch, capsys):
    from pygpukit import _native
    from pygpukit.backends.cuda import toolchain

    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["backend"] == "cpu"
    assert facts["driver_unavailable"] == (_native.driver_unavailable_reason() or None)
    assert len(facts["devices"]) == (0 if facts["driver_unavailable"] else _native.device_count())
    assert facts["cuda_headers"] == list(toolchain.include_dirs())
    assert facts["cublaslt"] == (toolchain.cublaslt_path() or None)
    if facts["nvrtc"] is not None:
        assert facts["nvrtc"]["path"] == toolchain.load_nvrtc()
        assert facts["nvrtc"]["version"] == "{}.{}".format(*toolchain.nvrtc_version())
    # The table says the same.
    assert main(["info"]) == 0
    table = dict(ln.split(None, 1) for ln in capsys.readouterr().out.splitlines()
                 if not ln.startswith(" "))  # fmt: skip
    assert table["backend"] == "cpu" and table["cuBLASLt"] == (facts["cublaslt"] or "not found")
    monkeypatch.setenv("PYGPUKIT_BACKEND", "tpu")
    assert main(["info", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["backend"] is None and "'tpu'" in bad["backend_error"]


def test_cache_ls_json(tmp_path, monkeypatch, capsys):
    from pygpukit import _native
    from pygpukit.backends.cuda import toolchain
    from pygpukit.errors import CompileError

    try:
        toolchain.load_nvrtc()
    except CompileError as e:
        pytest.skip(f"no NVRTC: {e}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "kernels"))
    _native.kernel_cache_clear_memory()
    assert main(["cache", "ls", "--json"]) == 0
    empty = json.loads(capsys.readouterr().out)
    assert empty["dir"] == str(tmp_path / "kernels") and empty["entries"] == []
    for k in (1, 2):
        src = f'extern "C" __global__ void f{k}(float* y) {{ y[threadIdx.x] += {k}.0f; }}\n'
        toolchain.compile_kernel(src, "sm_80")
    assert main(["cache", "ls", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    files = {p.stem: p.stat().st_size for p in (tmp_path / "kernels").glob("*.cubin")}
    assert {e["key"]: e["bytes"] for e in doc["entries"]} == files and len(files) == 2
    assert doc["total_bytes"] == sum(files.values())
    assert doc["limit_bytes"] == _native.kernel_cache_max_bytes()
    mtimes = [e["mtime"] for e in doc["entries"]]
    assert mtimes == sorted(mtimes, reverse=True)  # newest first, as the table


def test_subprocess_errors_are_one_line(model):
    r = run_cli(["graph", "dump", f"{model}:wrong_shape", "--arg", "f32[4,32]"])
    assert r.returncode == 1 and r.stdout == ""
    assert one_error_line(r.stderr).endswith(f"at {model}:{WRONG_SHAPE_LINE}")
    r = run_cli(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]", "--arg", "1"])
    assert r.returncode == 2 and "takes one --arg per parameter" in one_error_line(r.stderr)


def _sigint_default() -> None:
    # SIGINT at its default in the child even where the runner ignores it (a background
    # job of a non-interactive shell): an ignored SIGINT is inherited, and Python then
    # installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_subprocess_ctrl_c(model):
    """A real SIGINT while the command runs: exit 130 and one line, no traceback."""
    started = model + ".started"
    env = dict(os.environ, PYGPUKIT_BACKEND="cpu")
    p = subprocess.Popen([sys.executable, "-m", "pygpukit", "graph", "dump", f"{model}:waits",
                          "--arg", "f32[4]"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=_sigint_default)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not os.path.exists(started):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the command never reached the function"
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130
    assert err == "pygpukit: interrupted\n" and out == ""


def test_subprocess_closed_pipe_is_quiet(model):
    """`pygpukit graph dump ... | head -1`: the reader leaves early; no error, no traceback."""
    env = dict(os.environ, PYGPUKIT_BACKEND="cpu")
    p = subprocess.Popen([sys.executable, "-m", "pygpukit", "graph", "dump", f"{model}:long",
                          "--arg", "f32[4]"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=240)
    assert first.startswith(b"# after traced")
    assert err == "" and p.returncode == 141
