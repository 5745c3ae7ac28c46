"""Running the HTTP app under uvicorn: in the foreground (`pygpukit serve`) or in the
background (tests, benchmarks), with the engine started and stopped around it.

By default (processes=2) the HTTP app runs in a child process of its own (spawned: a
process that uses CUDA is never forked) with the tokenizer and chat template, and the
engine and the model stay in this process, joined by one connection (bridge.py): the
engine thread then never waits for the interpreter lock while the event loop serialises
stream chunks. front_ends=N runs N such processes listening on one port (SO_REUSEPORT:
the kernel spreads the connections over them), each with its connection to the engine, so
N event loops share the requests' intake and the streams' chunks (one loop spends about
0.5 ms of its time on a request and 20 us on each chunk of each stream, most of it the
HTTP stack and the socket send; on the H200's host, where the load generator's clients
share the 16 cores, two or four measured no gain over one: docs/llm.md). processes=1
serves from a thread of this process, beside the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import multiprocessing
import multiprocessing.connection
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from pygpukit import errors
from pygpukit.llm.api import Model
from pygpukit.llm.chat_template import ChatTemplate
from pygpukit.llm.config import ModelConfig
from pygpukit.llm.generation_config import GenerationConfig
from pygpukit.llm.tokenizer import Tokenizer

from .app import build_app
from .bridge import EngineBridge, EngineClient
from .engine import Engine

# uvicorn's HTTP protocol, fixed rather than "auto" (httptools when installed): on an H200
# at 64 streaming clients httptools measured no throughput gain and a worse inter-token p99
# in half its rounds (6.8 / 9.1 / 5.1 / 9.2 ms against h11's 4.9 / 4.9 / 4.8 / 5.0, the
# 9 ms rounds with 13-15 ms tails after the last step), so serving does not change with
# what else is installed.
HTTP_PROTOCOL = "h11"


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError:
        raise errors.GPUKitError(
            'the server needs uvicorn and starlette: pip install "pygpukit[serve]"'
        ) from None
    return uvicorn


@dataclass
class FrontEnd:
    """What the front end's process needs (picklable): the model's text side (tokenizer,
    chat template, generation config, no weights), the engine's limits and where to
    listen."""

    name: str
    host: str
    port: int
    log_level: str
    config: ModelConfig
    tokenizer: Tokenizer | None
    path: str
    generation_config: GenerationConfig
    chat_template: tuple[str, dict[str, str]] | None  # source and special tokens
    max_model_len: int
    vocab: int
    eos: frozenset[int]
    reuse_port: bool = False  # bind with SO_REUSEPORT: one of several front ends on the port

    def model(self) -> Model:
        """A Model without weights: the app only tokenizes and applies the chat template."""
        t = self.chat_template
        template = None if t is None else ChatTemplate(t[0], t[1])
        return Model(self.config, cast(Any, None), self.tokenizer, self.path,
                     self.generation_config, template)  # fmt: skip


class Server:
    """uvicorn serving build_app(model, engine, name) on host:port (port 0: any free one).

    processes=2 (the default): the app in a spawned child process, through an
    EngineClient; front_ends=N: N such processes sharing the port (SO_REUSEPORT), each
    with its EngineClient; processes=1: in a thread of this process."""

    def __init__(self, model: Model, engine: Engine, name: str, host: str = "127.0.0.1",
                 port: int = 8000, log_level: str = "warning", processes: int = 2,
                 front_ends: int = 1) -> None:  # fmt: skip
        if processes not in (1, 2):
            raise errors.GPUKitValueError(f"Server: processes must be 1 or 2, got {processes!r}")
        if isinstance(front_ends, bool) or not isinstance(front_ends, int) or front_ends < 1:
            raise errors.GPUKitValueError(
                f"Server: front_ends must be an integer >= 1, got {front_ends!r}"
            )
        if front_ends > 1 and processes == 1:
            raise errors.GPUKitValueError(
                f"Server: front_ends={front_ends} needs processes=2 (front ends of their own)"
            )
        uvicorn = _uvicorn()
        self.engine, self.name, self.processes = engine, name, processes
        self.front_ends = front_ends
        self.host = host
        self._port = port
        self._thread: threading.Thread | None = None
        self._procs: list[Any] = []
        self._bridges: list[EngineBridge] = []
        self.server: Any = None
        if processes == 1:
            app = build_app(model, engine, name)
            config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                    http=HTTP_PROTOCOL, timeout_graceful_shutdown=2)  # fmt: skip
            self.server = uvicorn.Server(config)
            return
        import starlette  # noqa: F401  (missing: the same error here as in-process)

        t = model.chat_template
        self._front = FrontEnd(name, host, port, log_level, model.config, model.tokenizer,
                               model.path, model.generation_config,
                               None if t is None else (t.source, dict(t.special)),
                               engine.max_model_len, engine.vocab, engine.eos,
                               front_ends > 1)  # fmt: skip

    @property
    def _proc(self) -> Any:
        """The first front end's process (None when not started)."""
        return self._procs[0] if self._procs else None

    @property
    def port(self) -> int:
        if self.server is not None:
            return int(self.server.servers[0].sockets[0].getsockname()[1])
        assert self._bridges, "Server.start first"
        return self._bridges[0].port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C) or, with processes=2, until a front end's
        process ends."""
        if self.server is not None:
            self.engine.start()
            try:
                self.server.run()
            finally:
                self.engine.close()
            return
        # Ctrl-C reaches both processes: the front end ends by itself, and here it only asks
        # for the stop. A KeyboardInterrupt instead could land after the front end had gone
        # (the loop already left) and cut the stop short. The handler is in place before the
        # front end starts: it answers /health as soon as it listens, so a Ctrl-C may come
        # before start() returns.
        asked = threading.Event()
        main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGINT, lambda *_: asked.set()) if main else None
        try:
            try:
                self.start()
            except errors.GPUKitError:
                if not asked.is_set():
                    raise
                return  # interrupted while the front end started: it ended with the Ctrl-C
            # Until a front end ends (in slices: the handler's flag is seen within one).
            while (self._procs and all(p.is_alive() for p in self._procs)
                   and not asked.is_set()):  # fmt: skip
                multiprocessing.connection.wait([p.sentinel for p in self._procs], 0.5)
        except KeyboardInterrupt:  # not the main thread: the default handler raised
            pass
        finally:
            try:
                self.stop()
            finally:
                if main:
                    signal.signal(signal.SIGINT, signal.default_int_handler if before is None
                                  else before)  # fmt: skip

    def start(self, timeout: float = 60.0) -> Server:
        """Serve in the background; returns once the socket listens."""
        self.engine.start()
        end = time.monotonic() + timeout
        if self.server is not None:
            self._thread = threading.Thread(target=self.server.run, name="pygpukit-http",
                                            daemon=True)  # fmt: skip
            self._thread.start()
            while not self.server.started:
                if not self._thread.is_alive() or time.monotonic() > end:
                    raise errors.GPUKitError("the HTTP server did not start")
                time.sleep(0.01)
            return self
        # The first front end binds the port (port 0: any free one); the others then
        # join it there, started together.
        self._spawn([self._front], end)
        if self.front_ends > 1:
            rest = dataclasses.replace(self._front, port=self._bridges[0].port)
            self._spawn([rest] * (self.front_ends - 1), end)
        return self

    def _spawn(self, fronts: list[FrontEnd], end: float) -> None:
        """Start a front end's process for each of `fronts` and wait until each listens
        (stopping everything and raising GPUKitError when one cannot)."""
        ctx = multiprocessing.get_context("spawn")  # never fork a process that uses CUDA
        started = []
        for front in fronts:
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=serve_front_end, args=(theirs, front),
                               name="pygpukit-http", daemon=True)  # fmt: skip
            proc.start()
            theirs.close()
            bridge = EngineBridge(self.engine, mine)
            self._procs.append(proc)
            self._bridges.append(bridge)
            started.append((proc, bridge))
        for proc, bridge in started:
            while not bridge.ready.wait(0.05):
                if not proc.is_alive() or time.monotonic() > end:
                    break
            if not bridge.port:
                why = bridge.failure or "it did not start"
                self.stop()
                raise errors.GPUKitError(f"the HTTP server did not start: {why}")

    def stop(self) -> None:
        """Stop serving (the front end's process is joined) and close the engine."""
        if self.server is not None:
            self.server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
        elif self._procs:
            for bridge in self._bridges:
                bridge.send(("stop",))
            for proc in self._procs:
                proc.join(10)  # open streams get uvicorn's graceful 2 s
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
            for bridge in self._bridges:
                bridge.join(10)  # its thread ends at the closed connection
            self._procs = []  # the bridges stay: `port` still names where it served
        self.engine.close()


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # several front ends on one port: the kernel spreads the connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve_front_end(conn: Any, front: FrontEnd) -> None:
    """The front end's process: the HTTP app over an EngineClient of `conn`, until the
    engine's side says stop or closes the connection."""
    from pygpukit import settings

    settings.set_backend("cpu")  # this process never touches the GPU
    uvicorn = _uvicorn()
    client = EngineClient(conn, front.max_model_len, front.vocab, front.eos)
    app = build_app(front.model(), client, front.name)
    config = uvicorn.Config(app, host=front.host, port=front.port, log_level=front.log_level,
                            http=HTTP_PROTOCOL, timeout_graceful_shutdown=2)  # fmt: skip
    server = uvicorn.Server(config)
    try:
        sock = _bind(front.host, front.port, front.reuse_port)
    except OSError as e:
        conn.send(("failed", f"cannot listen on {front.host}:{front.port}: {e}"))
        return

    def stop() -> None:
        server.should_exit = True

    async def main() -> None:
        client.attach(asyncio.get_running_loop(), stop)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.005)
        if server.started:
            # What start-up made (modules, the app, the tokenizer) lives as long as the
            # process: frozen, a full collection no longer walks it while streams wait.
            gc.collect()
            gc.freeze()
            client.send_now(("ready", sock.getsockname()[1]))
        await serving

    # uvicorn's choice of event loop (uvloop when installed), where it says what it is.
    factory = getattr(config, "get_loop_factory", lambda: None)()
    try:
        if factory is not None and sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(main())
        else:
            asyncio.run(main())
    finally:
        conn.close()


__all__ = ["FrontEnd", "Server", "serve_front_end"]
