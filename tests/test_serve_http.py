"""The OpenAI-compatible server driven by the real `openai` client on 127.0.0.1 (CPU
backend, the tiny model): completions and chat, streamed and not, 32 concurrent streams
equal to the same prompts generated alone, a client disconnecting mid-stream (its blocks
return to the pool), malformed and hostile requests answered with errors while the server
keeps serving. Every server test runs in both modes: the HTTP app in a process of its own
(the default) and beside the engine (processes=1)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time

import numpy as np
import pytest

from pygpukit import llm

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def model():
    from pygpukit.llm.tiny import write_tiny_model

    return llm.load(write_tiny_model())


@pytest.fixture(scope="module", params=[2, 1], ids=["split", "single"])
def server(model, request):
    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    engine = Engine(model, max_model_len=256, prefill_chunk=64, kv_blocks=600, max_queue=64)
    s = Server(model, engine, "tiny", port=0, processes=request.param).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                         timeout=300)  # fmt: skip


def _idle(server, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = server.engine.stats()
        if st["used_blocks"] == 0 and st["running"] == 0 and st["waiting"] == 0:
            return st
        time.sleep(0.05)
    raise AssertionError(f"the engine did not go idle: {server.engine.stats()}")


def test_models_and_health(client, server):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok"


def test_completion_equals_generate(client, model):
    r = client.completions.create(model="tiny", prompt="Alice was", max_tokens=10,
                                  temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    ids = model.encode("Alice was")
    want = model.generate_ids([ids], 10, stop_at_eos=False).tokens[0]
    assert r.choices[0].text == model.tokenizer.decode(want)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 10)


def test_usage_counts_the_prompt_tokens_the_cache_served(client, model, server):
    """A prompt sent again: its usage says how many prompt tokens came from the prefix
    cache (prompt_tokens_details.cached_tokens, OpenAI's field), streamed and not, and
    the text is the same."""
    ids = [int(x) for x in np.random.default_rng(31).integers(3, 300, size=70)]
    body = {"prompt": ids, "ignore_eos": True}
    first = client.completions.create(model="tiny", prompt="", max_tokens=4, temperature=0,
                                      extra_body=body)  # fmt: skip
    before = server.engine.stats()["prefix_hit_tokens"]
    again = client.completions.create(model="tiny", prompt="", max_tokens=4, temperature=0,
                                      extra_body=body)  # fmt: skip
    hits = server.engine.stats()["prefix_hit_tokens"] - before
    chunks = list(client.completions.create(
        model="tiny", prompt="", max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=body))  # fmt: skip
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == hits == 48  # blocks 1-3
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 48
    assert again.choices[0].text == first.choices[0].text
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text


def test_chat_streamed_equals_not_streamed(client, model):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Alice"}]
    whole = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 12 == whole.usage.completion_tokens
    ids = model.chat_ids(msgs)
    assert whole.usage.prompt_tokens == len(ids)
    want = model.generate_ids([ids], 12, stop_at_eos=False).tokens[0]
    assert text == model.tokenizer.decode(want)


def test_stop_string_cuts_the_text(client, model):
    base = client.completions.create(
        model="tiny",
        prompt="Alice was",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    ).choices[0]
    stop = base.text[3:6]
    r = client.completions.create(
        model="tiny",
        prompt="Alice was",
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == base.text[: base.text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt="Alice was", max_tokens=12,
                                         temperature=0, stop=stop, stream=True,
                                         extra_body={"ignore_eos": True})  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_32_concurrent_streams_equal_alone(client, server, model):
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 300, size=int(rng.integers(4, 90)))]
               for _ in range(32)]  # fmt: skip

    def stream(p):
        out = client.completions.create(
            model="tiny",
            prompt=p,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return "".join(c.choices[0].text for c in out)

    # One stream first: the openai client's pydantic models build on first use, which is
    # not thread-safe ("BaseModel cannot be instantiated directly" when 32 threads race).
    first = stream(prompts[0])
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(stream, prompts))
    assert texts[0] == first
    alone = [model.tokenizer.decode(server.engine.generate([p], 8, ignore_eos=True)[0])
             for p in prompts]  # fmt: skip
    assert texts == alone
    _idle(server)


def test_disconnect_mid_stream_frees_blocks(server):
    body = json.dumps({"model": "tiny", "prompt": "Alice was", "max_tokens": 200,
                       "stream": True, "ignore_eos": True}).encode()  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    got = b""
    while got.count(b"data:") < 3:
        got += sock.recv(4096)
    assert server.engine.stats()["used_blocks"] > 0
    sock.close()
    st = _idle(server)
    assert st["cancelled"] >= 1


def _post(server, body: bytes, path="/v1/completions", ctype="application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", path, body=body, headers={"Content-Type": ctype})
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"prompt": "x", "max_tokens": "10"}).encode(), 400, "'max_tokens' must be"),
    (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, "'temperature'"),
    (json.dumps({"prompt": "x", "temperature": 7}).encode(), 400, "'temperature'"),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, "'stream'"),
    (json.dumps({"prompt": 5}).encode(), 400, "'prompt'"),
    (json.dumps({"prompt": [1, 99999]}).encode(), 400, "outside the vocabulary"),
    (json.dumps({"prompt": [1, True]}).encode(), 400, "'prompt'"),
    (json.dumps({"prompt": [1, 2.0]}).encode(), 400, "'prompt'"),
    (json.dumps({"prompt": list(range(3, 300))}).encode(), 400, "context length"),
    (json.dumps({"prompt": "x", "max_tokens": 10**12}).encode(), 400, "context length"),
    (json.dumps({"prompt": "x", "stop": [1]}).encode(), 400, "'stop'"),
    (json.dumps({"prompt": "x", "n": 3}).encode(), 400, "n=1"),
    (json.dumps({"prompt": "x", "qos": "vip"}).encode(), 400, "'qos'"),
    (json.dumps({"prompt": "x", "model": "gpt-4"}).encode(), 404, "does not exist"),
])  # fmt: skip
def test_bad_requests_get_openai_errors(server, body, status, words):
    got, obj = _post(server, body)
    assert got == status, obj
    assert words in obj["error"]["message"]
    assert obj["error"]["type"]


def test_hostile_requests_and_the_server_keeps_serving(server, client):
    big = ("Alice was beginning " * 60000).encode()[: 1 << 20]  # a 1 MB prompt
    got, obj = _post(server, json.dumps({"prompt": big.decode()}).encode())
    assert got == 400 and "context length" in obj["error"]["message"]
    got, obj = _post(server, b"x" * (9 << 20))
    assert got == 413
    got, obj = _post(server, json.dumps({"messages": [{"role": 3}]}).encode(),
                     "/v1/chat/completions")  # fmt: skip
    assert got == 400 and "role" in obj["error"]["message"]
    got, obj = _post(server, json.dumps({"messages": "hi"}).encode(), "/v1/chat/completions")
    assert got == 400
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=-1)
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    conn.request("GET", "/v1/nothing")
    assert conn.getresponse().status == 404
    r = client.completions.create(model="tiny", prompt="Alice", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3
    _idle(server)


def test_token_id_prompts_skip_the_thread_hop_and_keep_their_errors(model, monkeypatch):
    """A token-id prompt is taken on the event loop (no worker-thread round trip before
    its submit); a text prompt still goes to a thread to be tokenized. The token-id
    prompt's errors are still 400s naming the fault."""
    import asyncio

    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    hops: list[str] = []
    real = asyncio.to_thread

    async def counted(func, *args, **kwargs):
        hops.append(getattr(func, "__name__", "?"))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    engine = Engine(model, max_model_len=64, kv_blocks=40)
    s = Server(model, engine, "tiny", port=0, processes=1).start()
    try:
        # h11 whatever else is installed (server.HTTP_PROTOCOL: httptools measured worse).
        from uvicorn.protocols.http.h11_impl import H11Protocol

        assert s.server.config.http_protocol_class is H11Protocol
        ids = [int(t) for t in np.random.default_rng(5).integers(3, 300, size=12)]
        got, obj = _post(s, json.dumps({"prompt": ids, "max_tokens": 6, "temperature": 0,
                                        "ignore_eos": True}).encode())  # fmt: skip
        assert got == 200, obj
        want = model.tokenizer.decode(engine.generate([ids], 6, ignore_eos=True)[0])
        assert obj["choices"][0]["text"] == want
        for body, words in (({"prompt": [1, 99999]}, "outside the vocabulary"),
                            ({"prompt": ids, "max_tokens": 60}, "context length"),
                            ({"prompt": [1, False]}, "'prompt'")):  # fmt: skip
            got, obj = _post(s, json.dumps(body).encode())
            assert got == 400 and words in obj["error"]["message"], obj
        assert "prompt_ids" not in hops
        got, obj = _post(s, json.dumps({"prompt": "Alice", "max_tokens": 2}).encode())
        assert got == 200, obj
        assert hops.count("prompt_ids") == 1
    finally:
        s.stop()


def test_front_ends_share_one_port(model, monkeypatch):
    """front_ends=2: two front-end processes listen on one port, the kernel spreads the
    connections over both (each front end's bridge submits some of them), and every
    answer equals the prompt generated alone; stop() joins both."""
    from pygpukit import errors
    from pygpukit.serve import Engine
    from pygpukit.serve.bridge import EngineBridge
    from pygpukit.serve.server import Server

    engine = Engine(model, max_model_len=64, kv_blocks=200, max_queue=64)
    with pytest.raises(errors.GPUKitValueError, match="front_ends"):
        Server(model, engine, "tiny", port=0, front_ends=0)
    with pytest.raises(errors.GPUKitValueError, match="processes=2"):
        Server(model, engine, "tiny", port=0, processes=1, front_ends=2)
    submits: dict[int, int] = {}
    real = EngineBridge._command

    def counted(self, cmd, acks):
        if cmd[0] == "submit":
            submits[id(self)] = submits.get(id(self), 0) + 1
        real(self, cmd, acks)

    monkeypatch.setattr(EngineBridge, "_command", counted)
    s = Server(model, engine, "tiny", port=0, front_ends=2).start()
    procs = list(s._procs)
    try:
        assert len(procs) == 2 and all(p.is_alive() for p in procs)
        rng = np.random.default_rng(11)
        prompts = [[int(t) for t in rng.integers(3, 300, size=int(rng.integers(4, 20)))]
                   for _ in range(16)]  # fmt: skip

        def one(ids):  # a connection of its own each: its own source port
            got, obj = _post(s, json.dumps({"prompt": ids, "max_tokens": 5, "temperature": 0,
                                            "ignore_eos": True}).encode())  # fmt: skip
            assert got == 200, obj
            return obj["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(one, prompts))
        alone = [model.tokenizer.decode(engine.generate([p], 5, ignore_eos=True)[0])
                 for p in prompts]  # fmt: skip
        assert texts == alone
        assert sorted(submits) == sorted(id(b) for b in s._bridges)  # both took some
        assert sum(submits.values()) == 16
    finally:
        s.stop()
    assert [p.exitcode for p in procs] == [0, 0] and not s._procs


@pytest.mark.parametrize("processes", [2, 1])
def test_queue_full_is_429_and_a_rejected_request_503(model, monkeypatch, processes):
    import threading

    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    engine = Engine(model, max_model_len=256, kv_blocks=16, max_queue=1)
    # Running sequences get no decode step until the end, so the first request cannot
    # finish (and free its blocks) before the second is queued, however fast the machine;
    # the engine still takes commands meanwhile (it waits for one when it has nothing to
    # launch), so the scheduler's rejection of the guaranteed request is answered.
    gate, real = threading.Event(), engine._decode_rows
    monkeypatch.setattr(engine, "_decode_rows", lambda: real() if gate.is_set() else [])
    s = Server(model, engine, "tiny", port=0, processes=processes).start()
    try:
        bodies = [json.dumps({"prompt": "Alice", "max_tokens": 240, "ignore_eos": True,
                              "stream": True}).encode() for _ in range(3)]  # fmt: skip
        socks = []

        def until(done):
            end = time.monotonic() + 60
            while not done(engine.stats()):
                assert time.monotonic() < end, engine.stats()
                time.sleep(0.01)

        # The first runs (all 16 blocks) before the second is sent: sent together, the
        # second could find the first still queued and be the one refused. The second
        # then waits for the first's blocks, filling the queue of one.
        for i, (b, state) in enumerate(zip(bodies[:2], (lambda st: st["used_blocks"] == 16
                                                        and st["waiting"] == 0,
                                                        lambda st: st["waiting"] >= 1),
                                           strict=True)):  # fmt: skip
            sk = socket.create_connection(("127.0.0.1", s.port))
            sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\nContent-Length: " + str(len(b)).encode() +
                       b"\r\n\r\n" + b)  # fmt: skip
            socks.append(sk)
            until(state)
            if i == 0:
                # A guaranteed request that does not fit now is rejected by the scheduler.
                got, obj = _post(s, json.dumps({"prompt": "Alice", "max_tokens": 8,
                                                "qos": "guaranteed"}).encode())  # fmt: skip
                assert got == 503 and obj["error"]["type"] == "service_unavailable", obj
                assert "rejected by the scheduler" in obj["error"]["message"]
        got, obj = _post(s, bodies[2])
        assert got == 429 and obj["error"]["type"] == "rate_limit_exceeded"
        gate.set()
        for sk in socks:
            sk.close()
        _idle(s)
    finally:
        gate.set()
        s.stop()


@pytest.mark.parametrize("chat", [False, True])
def test_stream_chunk_lines_are_the_chunk_objects(chat):
    """StreamChunks' pre-serialised lines parse to exactly chunk()'s objects (quotes,
    newlines, non-ASCII text, a finish reason, chat's first delta with its role)."""
    from pygpukit.serve import openai_schema as schema

    rng = np.random.default_rng(3)
    alphabet = list('ab "\\\n\t{}\u00e9\u4e2d\U0001f600')
    lines = schema.StreamChunks(chat, "cmpl-x", "m\u00e9")
    for finish, first in ((None, True), (None, False), ("stop", False), ("length", False)):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 12))))
        line = lines.sse(text, finish, first)
        assert line.startswith("data: ") and line.endswith("\n\n")
        got = json.loads(line[len("data: ") :])
        want = schema.chunk(chat, "cmpl-x", "m\u00e9", text, finish, first)
        assert abs(got.pop("created") - want.pop("created")) <= 5
        assert got == want


@pytest.mark.parametrize("processes", [2, 1])
def test_a_failing_step_is_a_500_naming_the_engines_error(model, monkeypatch, processes):
    """The engine's exception reaches the client by type name and text, from either
    process; the engine keeps serving."""
    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    engine = Engine(model, max_model_len=64, kv_blocks=40)
    real, calls = engine._launch, []

    def launch(rows, pieces):
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("the step broke")
        return real(rows, pieces)

    monkeypatch.setattr(engine, "_launch", launch)
    s = Server(model, engine, "tiny", port=0, processes=processes).start()
    try:
        got, obj = _post(s, json.dumps({"prompt": "Alice", "max_tokens": 4}).encode())
        assert got == 500 and obj["error"]["type"] == "server_error", obj
        assert "ZeroDivisionError: the step broke" in obj["error"]["message"]
        got, obj = _post(s, json.dumps({"prompt": "Alice", "max_tokens": 4,
                                        "ignore_eos": True}).encode())  # fmt: skip
        assert got == 200 and obj["usage"]["completion_tokens"] == 4
        _idle(s)
    finally:
        s.stop()


def test_stop_joins_the_front_end_and_a_taken_port_is_an_error(model):
    from pygpukit import errors
    from pygpukit.serve import Engine
    from pygpukit.serve.server import Server

    a = Server(model, Engine(model, max_model_len=64, kv_blocks=40), "tiny", port=0).start()
    proc = a._proc
    try:
        b = Server(model, Engine(model, max_model_len=64, kv_blocks=40), "tiny", port=a.port)
        with pytest.raises(errors.GPUKitError, match="cannot listen"):
            b.start()
        assert b._proc is None and b.engine._thread is None
    finally:
        a.stop()
    assert proc.exitcode == 0 and a.engine._thread is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", a.port), timeout=5)


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def _serving(port: int, proc, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.1)


def _gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether process pid exited (a zombie not yet reaped counts) within timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _front_end(pid: int) -> int:
    """The pid of process pid's spawned child (not multiprocessing's resource tracker)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(c) for c in f.read().split()]
    spawned = []
    for k in kids:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                spawned.append(k)
    (front,) = spawned
    return front


def test_pygpukit_serve_stops_cleanly_on_ctrl_c():
    """`pygpukit serve tiny` (the front end in a process of its own) serves, and Ctrl-C
    (SIGINT to the terminal's process group) ends both processes."""
    import os
    import signal
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pygpukit", "serve", "tiny", "--port",
                             str(port), "--max-model-len", "64", "--kv-memory", "1MB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        _serving(port, proc)
        front = _front_end(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out.decode()
        assert _gone(front)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_front_end_exits_when_the_engines_process_dies():
    """No orphan: killed at once (no clean-up), the engine's process closes its end of
    the connection, and the front end's process stops serving and exits."""
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pygpukit", "serve", "tiny", "--port",
                             str(port), "--max-model-len", "64", "--kv-memory", "1MB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _serving(port, proc)
        front = _front_end(proc.pid)
        proc.kill()
        proc.wait()
        assert _gone(front)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
