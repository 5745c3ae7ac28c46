"""The serving load generator end to end (tiny model, few clients; CI: the CPU backend)."""

from __future__ import annotations

import json
import time

import pytest

from pygpukit.backends import get_backend

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("single", [False, True])
def test_load_generator_rows(tmp_path, single):
    from pygpukit.bench.serve_load import main

    out, tl = tmp_path / "rows.json", tmp_path / "timeline.json"
    assert main(["--model", "tiny", "--clients", "3", "--max-tokens", "5", "--prompt-min", "8",
                 "--prompt-max", "30", "--step-tokens", "64", "--save", str(out),
                 "--timeline", str(tl)] + ["--single-process"] * single) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert "serve_load" in data["meta"]["command"]
    (row,) = data["rows"]
    assert row["front_end"] == ("thread" if single else "process") and row["client"] == "httpx"
    assert row["clients"] == 3 and row["output_tokens"] == 15
    assert row["output_tok_s"] > 0 and row["ttft_p50_ms"] <= row["ttft_p99_ms"]
    assert row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert row["step_tokens"] == 64 and row["steps"] >= row["decode_steps"] >= 4
    # Where the wall went, on the clients' clock: the front end's arrival stamp (in its own
    # process, or thread) precedes the engine's submit, which precedes the first step.
    (rnd,) = json.loads(tl.read_text())
    reqs = rnd["engine"]["requests"]
    on_gpu = get_backend().name == "cuda"  # the steps' GPU marks: CUDA events
    assert len(reqs) == 3 and len(rnd["client_results"]) == 3
    assert (rnd["gpu"] is not None) == on_gpu
    assert all(rnd["t0"] <= r["arrived"] <= r["submitted"] <= r["started"] for r in reqs)
    assert 0 <= row["tl_arrived_first_ms"] <= row["tl_arrived_last_ms"]
    assert row["tl_arrived_last_ms"] <= row["tl_submitted_last_ms"] <= row["tl_started_last_ms"]
    assert row["tl_prefilled_last_ms"] <= row["tl_first_token_last_ms"] <= row["tl_ended_last_ms"]
    assert row["tl_ended_last_ms"] <= 1e3 * row["wall_s"] and row["tl_tail_ms"] >= 0
    kinds = row["tl_decode_steps"] + row["tl_mixed_steps"] + row["tl_prefill_steps"]
    assert kinds == row["steps"] and row["tl_prefill_steps"] + row["tl_mixed_steps"] >= 1
    assert ("tl_gpu_busy_ms" in row) == on_gpu and ("tl_handoff_p99_ms" in row) == on_gpu
    # Every step's tokens were handed on after its launch returned.
    steps = rnd["engine"]["steps"]
    assert steps and all(s["emitted"] >= s["end"] >= s["start"] for s in steps)


def test_clients_send_their_requests_one_after_another(tmp_path):
    """--requests 3: each of 2 clients sends 3 requests in turn (sustained load), so every
    request is answered in full and at most 2 are ever in the engine at once."""
    from pygpukit.bench.serve_load import main

    out, tl = tmp_path / "rows.json", tmp_path / "timeline.json"
    assert main(["--model", "tiny", "--clients", "2", "--requests", "3", "--max-tokens", "4",
                 "--prompt-min", "8", "--prompt-max", "30", "--procs", "0", "--save", str(out),
                 "--timeline", str(tl)]) == 0  # fmt: skip
    (row,) = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "pygpukit serve"]
    assert row["clients"] == 2 and row["requests_per_client"] == 3
    assert row["output_tokens"] == 2 * 3 * 4 and row["used_blocks_after"] == 0
    (rnd,) = json.loads(tl.read_text())
    reqs = rnd["engine"]["requests"]
    assert len(reqs) == 6 and len(rnd["client_results"]) == 6
    assert all(r["tokens"] == 4 for r in reqs)
    edges = sorted([(r["arrived"], 1) for r in reqs] + [(r["ended"], -1) for r in reqs])
    running = [sum(d for _, d in edges[: i + 1]) for i in range(len(edges))]
    assert max(running) <= 2


def test_a_round_needs_whole_clients():
    from pygpukit.bench.serve_load import _round

    with pytest.raises(ValueError, match="5 prompts are not 2 a client"):
        _round("http://127.0.0.1:9", [[5]] * 5, 1, requests=2)


def test_load_generator_client_processes_and_step_times(tmp_path):
    """Clients in worker processes (their stamps on the shared monotonic clock) and the
    decode step timed alone first, then mixed with prompt pieces filling each budget the
    free token slots can fill (here: 128 and 256 leave 127 and 255 tokens beside the one
    decode row, one and two 203-token prompts' pieces; 512 needs three prompts, and the
    engine has two slots besides the decode row's)."""
    from pygpukit.bench.serve_load import main

    out = tmp_path / "rows.json"
    assert main(["--model", "tiny", "--clients", "3", "--max-tokens", "4", "--prompt-min", "8",
                 "--prompt-max", "200", "--procs", "2", "--step-times", "--save",
                 str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    steps = [r for r in rows if r["impl"] == "pygpukit serve decode step"]
    assert [r["batch"] for r in steps] == [1]  # the engine's max_batch is the 3 clients
    assert all(r["step_ms"] > 0 for r in steps)
    mixed = [r for r in rows if r["impl"] == "pygpukit serve mixed step"]
    got = [(r["batch"], r["step_tokens"], r["prefill_tokens"]) for r in mixed]
    assert got == [(1, 128, 127), (1, 256, 255)]
    assert all(r["step_ms"] > 0 for r in mixed)
    (row,) = [r for r in rows if r["impl"] == "pygpukit serve"]
    assert row["client_procs"] == 2 and row["output_tokens"] == 12
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and row["wall_s"] > 0


def test_mixed_step_timing_leaves_the_engine_as_it_found_it():
    """The mixed steps' launches can finish a (fake) prompt (here the first of the two
    whose pieces fill 124 tokens: 99 and 25): it must not stay in the engine's running
    batch afterwards (it did, and the started engine then spun), nor stream its token."""
    from pygpukit import llm
    from pygpukit.bench.serve_load import step_times
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine

    e = Engine(llm.load(write_tiny_model()), max_model_len=100, prefill_chunk=128,
               max_batch=8, kv_blocks=400)  # fmt: skip
    free, blocks = len(e._tok_free), e.blocks.free
    rows = step_times(e, [4], 40, steps=2, budgets=(128,))
    assert [r["impl"] for r in rows] == ["pygpukit serve decode step", "pygpukit serve mixed step"]
    assert not e._running and not e._prefilling and not e._inflight
    assert len(e._tok_free) == free and e.blocks.free == blocks
    assert e.stats()["finished"] == 0


@pytest.mark.parametrize(("procs", "kind"), [(0, "openai"), (0, "httpx"), (2, "httpx")])
def test_a_round_warms_its_clients_outside_the_row(procs, kind):
    """Every client completes a small warm-up request (an 8-token prompt, one token) per
    stream before the round starts; at_start runs once they all ended, so the engine's
    timeline from there holds the timed requests alone, and every timed stream starts
    after t0."""
    from pygpukit import llm
    from pygpukit.bench.serve_load import WARMUP_PROMPT, _prompts, _round
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    model = llm.load(write_tiny_model())
    engine = Engine(model, max_model_len=128, kv_blocks=200)
    server = Server(model, engine, "bench", port=0).start()
    try:
        prompts = _prompts(3, model.config.vocab_size, 10, 40, 7)
        seen: dict = {}

        def at_start():
            seen["warm"] = engine.timeline(0.0)["requests"]
            seen["since"] = time.perf_counter()

        row, res, t0 = _round(server.url, prompts, 3, procs, at_start, kind)
    finally:
        server.stop()
    warm = seen["warm"]
    assert sorted((r["prompt"], r["tokens"]) for r in warm) == [(WARMUP_PROMPT, 1)] * 3
    assert max(r["ended"] for r in warm) <= seen["since"] <= t0
    # The whole prompts reached the engine (with the openai client the ids travel in
    # extra_body, replacing ""); a stream behind sends its queued tokens in one chunk.
    timed = engine.timeline(seen["since"])["requests"]
    assert sorted(r["prompt"] for r in timed) == sorted(len(p) for p in prompts)
    assert row["client"] == kind
    assert row["prompt_ids_in"] == ("extra_body" if kind == "openai" else "body")
    assert all(1 <= len(r["stamps"]) <= 3 and r["tokens"] == 3 for r in res)
    assert all(r["tokens"] == 3 for r in timed)
    assert row["warm_clients"] is True and row["output_tokens"] == 9
    assert all(r["start"] >= t0 for r in res) and len(res) == 3


def test_repeated_rounds_send_new_prompts(tmp_path):
    """Two rounds of the same client count: the second's prompts are new, so the engine's
    prefix cache serves none of their tokens (it would serve most of a repeated prompt)."""
    from pygpukit.bench.serve_load import main

    out = tmp_path / "rows.json"
    assert main(["--model", "tiny", "--clients", "2", "2", "--max-tokens", "3", "--prompt-min",
                 "40", "--prompt-max", "60", "--procs", "0", "--save", str(out)]) == 0  # fmt: skip
    rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "pygpukit serve"]
    assert [r["prefix_hit_tokens"] for r in rows] == [0, 0]


def test_a_shared_system_prompt_is_computed_once(tmp_path):
    """--shared-prefix: every prompt starts with the same 48 tokens; with the prefix cache
    most of them are not prefilled again, without it every prompt is prefilled whole."""
    from pygpukit.bench.serve_load import main

    rows = []
    for extra in ([], ["--no-prefix-caching"]):
        out = tmp_path / "rows.json"
        assert main(["--model", "tiny", "--clients", "3", "--max-tokens", "4", "--prompt-min",
                     "10", "--prompt-max", "20", "--procs", "0", "--shared-prefix", "48",
                     "--save", str(out), *extra]) == 0  # fmt: skip
        (row,) = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "pygpukit serve"]
        rows.append(row)
    assert rows[0]["shared_prefix"] == 48 and rows[0]["prefix_caching"]
    assert rows[0]["prefix_hit_tokens"] > 0 and not rows[1]["prefix_caching"]
    assert rows[1]["prefix_hit_tokens"] == 0
