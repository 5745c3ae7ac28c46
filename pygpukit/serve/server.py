"""Running the HTTP app under uvicorn: in the foreground (`pygpukit serve`) or in a
background thread (tests, benchmarks), with the engine started and stopped around it."""

from __future__ import annotations

import threading
import time
from typing import Any

from pygpukit import errors
from pygpukit.llm.api import Model

from .app import build_app
from .engine import Engine


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError:
        raise errors.GPUKitError(
            'the server needs uvicorn and starlette: pip install "pygpukit[serve]"'
        ) from None
    return uvicorn


class Server:
    """uvicorn serving build_app(model, engine, name) on host:port (port 0: any free one)."""

    def __init__(self, model: Model, engine: Engine, name: str, host: str = "127.0.0.1",
                 port: int = 8000, log_level: str = "warning") -> None:  # fmt: skip
        uvicorn = _uvicorn()
        self.engine, self.name = engine, name
        app = build_app(model, engine, name)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=2)  # fmt: skip
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = self.server.config.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C)."""
        self.engine.start()
        try:
            self.server.run()
        finally:
            self.engine.close()

    def start(self, timeout: float = 60.0) -> Server:
        """Serve from a background thread; returns once the socket listens."""
        self.engine.start()
        self._thread = threading.Thread(target=self.server.run, name="pygpukit-http",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        end = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise errors.GPUKitError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.engine.close()
