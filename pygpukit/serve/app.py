"""The OpenAI-compatible HTTP API over an Engine (starlette; served by uvicorn), in the
engine's process or in a front-end process of its own, through an EngineClient
(bridge.py; Server chooses).

GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions (streamed as
server-sent events or not). Each text or chat request is tokenized off the event loop (a
token-id prompt goes straight on), submitted to the engine, and its tokens come back
through a thread-safe hand-off to the request's inbox (one loop wake-up for all the events
an engine step makes, scheduled once at the step's end, not one per token; a stream that
falls behind sends the tokens it has in one chunk); when the client goes away (a stream's
send fails or the connection closes) the request is cancelled and its KV blocks go back at
the engine's next step. Every failure is an OpenAI error object with its status: 400 bad
request, 404 unknown model, 413 body too large, 429 queue full, 503 refused by the
scheduler, 500 the engine failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from pygpukit import errors
from pygpukit.llm.api import Model
from pygpukit.llm.chat_template import ChatTemplateError

from . import openai_schema as schema
from .bridge import EngineClient, EngineGone
from .engine import Engine, Event, Overloaded, Request
from .text import TextStream

log = logging.getLogger("pygpukit.serve")
MAX_BODY = 8 << 20  # bytes; a larger request is refused before it is parsed


def _starlette() -> Any:
    try:
        import starlette.applications  # noqa: F401
        import starlette.requests  # noqa: F401
        import starlette.responses  # noqa: F401
        import starlette.routing  # noqa: F401
    except ImportError:
        raise errors.GPUKitError(
            'the server needs starlette and uvicorn: pip install "pygpukit[serve]"'
        ) from None
    import starlette

    return starlette


class _Inbox:
    """One request's engine events on the event loop (_Relay delivers them) and the one
    future its handler sleeps on while there are none: what the handler needs of an
    asyncio.Queue, with a wake-up per delivery and no getter list or size checks (the
    loop runs this for every stream's token of every engine step)."""

    __slots__ = ("events", "_waiter")

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, ev: Event) -> None:
        """Append ev and wake the handler (the loop)."""
        self.events.append(ev)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Return once an event is in."""
        while not self.events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class _Relay:
    """Moves engine events onto one event loop's inboxes in batches: the engine thread (or,
    in the front end's own process, the EngineClient reading the connection) appends
    events as they come, and once per engine step (add_step_hook) schedules one delivery
    of all of them, so a step's tokens for every stream cost one loop wake-up and no lock
    per token.

    Lock-free under the GIL: deque appends and pops are atomic, `_scheduled` is only set
    by the engine thread and cleared by the loop before it drains, so an event appended
    after a drain began is either drained too or finds the flag clear and schedules the
    next delivery."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque[tuple[_Inbox, Event]] = deque()
        self._scheduled = False

    def put(self, inbox: _Inbox, ev: Event) -> None:
        """Queue ev for `inbox` (the engine thread); delivered at the step's flush()."""
        self._pending.append((inbox, ev))

    def flush(self) -> None:
        """Schedule one delivery of what was put since the last (the engine thread, at the
        end of each engine step); a no-op when nothing waits or a delivery is due."""
        if self._pending and not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop closed (the server stopped): nobody listens
                self._pending.clear()

    def _deliver(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            inbox, ev = pending.popleft()
            inbox.put(ev)


class Api:
    """The request handlers, bound to one model and its engine (or the front end's client
    of it: the same calls, submit() and stats() awaited)."""

    def __init__(self, model: Model, engine: Engine | EngineClient, name: str) -> None:
        self.model, self.engine, self.name = model, engine, name
        self.created = int(time.time())
        self._relays: dict[asyncio.AbstractEventLoop, _Relay] = {}

    def relay(self, loop: asyncio.AbstractEventLoop) -> _Relay:
        """The event relay of this loop (the server's loop; tests may run several)."""
        r = self._relays.get(loop)
        if r is None:
            r = self._relays[loop] = _Relay(loop)
            self.engine.add_step_hook(r.flush)
        return r

    # -- helpers ------------------------------------------------------------------------
    def error(self, status: int, message: str, kind: str = "invalid_request_error",
              param: str | None = None) -> Any:  # fmt: skip
        from starlette.responses import JSONResponse

        return JSONResponse(schema.error_body(message, kind, param), status_code=status)

    async def body(self, request: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise schema.RequestError(f"the request body is larger than {MAX_BODY} bytes", 413)
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > MAX_BODY:
                raise schema.RequestError(f"the request body is larger than {MAX_BODY} bytes",
                                          413)  # fmt: skip
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise schema.RequestError(f"the request body is not UTF-8 (byte {e.start})") from None
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise schema.RequestError(f"the request body is not valid JSON: {e}") from None

    def prompt_ids(self, req: schema.GenerationRequest) -> list[int]:
        """The prompt's token ids: text and chat messages are tokenized in a worker thread
        (a long prompt must not stall the loop); token ids are taken on the loop."""
        tok = self.model.tokenizer
        if req.messages is not None:
            try:
                return self.model.chat_ids(req.messages)
            except ChatTemplateError as e:
                raise schema.RequestError(str(e), param="messages") from None
            except errors.GPUKitError as e:
                raise schema.RequestError(str(e).splitlines()[0], param="messages") from None
        if isinstance(req.prompt, list):
            return req.prompt
        if tok is None:
            raise schema.RequestError("this model has no tokenizer: send 'prompt' as token ids",
                                      param="prompt")  # fmt: skip
        assert req.prompt is not None
        return tok.encode(req.prompt)

    # -- routes -------------------------------------------------------------------------
    async def health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if isinstance(self.engine, EngineClient):
            stats = await self.engine.stats()
        else:
            stats = self.engine.stats()
        return JSONResponse({"status": "ok", **stats})

    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        card = {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "pygpukit", "max_model_len": self.engine.max_model_len}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Any) -> Any:
        return await self._generate(request, chat=False)

    async def chat(self, request: Any) -> Any:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Any, chat: bool) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse

        arrived = time.perf_counter()  # Request.arrived: its timeline starts here
        try:
            req = schema.parse_request(await self.body(request), chat)
            if req.model is not None and req.model not in (self.name, self.model.path):
                raise schema.RequestError(f"the model '{req.model}' does not exist (this server "
                                          f"serves '{self.name}')", 404, "model",
                                          "not_found_error")  # fmt: skip
            if isinstance(req.prompt, list):
                # Token ids: nothing to tokenize, so no hop to a worker thread and back;
                # the request goes to the engine in this loop pass.
                ids = self.prompt_ids(req)
            else:
                ids = await asyncio.to_thread(self.prompt_ids, req)
            max_tokens = req.max_tokens
            if max_tokens is None:
                max_tokens = max(1, self.engine.max_model_len - len(ids))
            try:
                params = req.sampling(self.model.default_sampling())
                self.engine.check(ids, max_tokens)
            except ValueError as e:
                raise schema.RequestError(str(e).splitlines()[0]) from None
            stop_ids = frozenset() if req.ignore_eos else self.engine.eos
            relay = self.relay(asyncio.get_running_loop())
            events = _Inbox()

            def sink(ev: Event) -> None:  # the engine thread
                relay.put(events, ev)

            er = Request(ids, max_tokens, sink, params, stop_ids, req.qos, req.priority,
                         req.user or "default", arrived=arrived)  # fmt: skip
            try:
                if isinstance(self.engine, EngineClient):
                    await self.engine.submit(er)
                else:
                    self.engine.submit(er)
            except Overloaded as e:
                raise schema.RequestError(str(e), 429, kind="rate_limit_exceeded") from None
            except EngineGone as e:
                raise schema.RequestError(str(e), 503, kind="service_unavailable") from None
            except ValueError as e:
                raise schema.RequestError(str(e).splitlines()[0]) from None
        except schema.RequestError as e:
            return self.error(e.status, e.message, e.kind, e.param)
        rid = schema.new_id(chat)
        text = TextStream(self.model.tokenizer, req.stop) if self.model.tokenizer else None
        if req.stream:
            gen = self._stream(chat, rid, er, events, text, len(ids), req.include_usage)
            return StreamingResponse(gen, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        try:
            out, finish, n, cached = await self._collect(request, er, events, text)
        except _Failed as e:
            return self.error(e.status, e.message, e.kind)
        if out is None:
            return JSONResponse({}, status_code=499)  # the client is gone
        use = schema.usage(len(ids), n, cached)
        body = schema.response(chat, rid, self.name, out, finish, use)
        return JSONResponse(body)

    async def _collect(self, request: Any, er: Request, events: _Inbox, text: TextStream | None
                       ) -> tuple[str | None, str | None, int, int]:  # fmt: skip
        """Wait for the whole generation (cancelling it if the client disconnects): the
        text, the finish reason, the new tokens and the prompt tokens the cache served."""
        parts: list[str] = []
        n = cached = 0
        try:
            while True:
                if not events.events:
                    try:
                        await asyncio.wait_for(events.wait(), 0.5)
                    except TimeoutError:
                        if await request.is_disconnected():
                            self.engine.cancel(er)
                            return None, None, n, cached
                        continue
                ev = events.events.popleft()
                if ev.kind == "token":
                    n += 1
                    cached += ev.cached_tokens
                    parts.append(text.feed(ev.token) if text else f" {ev.token}")
                    if text is not None and text.stopped:
                        self.engine.cancel(er)
                        return "".join(parts), "stop", n, cached
                elif ev.kind == "done":
                    if text is not None:
                        parts.append(text.flush())
                    return "".join(parts), _finish(ev), n, cached
                else:
                    raise _failure(ev.error)
        except asyncio.CancelledError:
            self.engine.cancel(er)
            raise

    async def _stream(self, chat: bool, rid: str, er: Request, events: _Inbox,
                      text: TextStream | None, prompt_len: int,
                      include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
        n = cached = 0
        finish: str | None = None
        first = True
        chunks = schema.StreamChunks(chat, rid, self.name)
        try:
            if chat:  # the role first, as OpenAI does
                yield chunks.sse("", None, first=True)
                first = False
            while finish is None:
                # Everything queued goes out as one chunk: a stream that fell behind
                # catches up in one send instead of one per token.
                await events.wait()
                evs = list(events.events)
                events.events.clear()
                parts: list[str] = []
                error: BaseException | None = None
                for ev in evs:
                    if ev.kind == "token":
                        n += 1
                        cached += ev.cached_tokens
                        parts.append(text.feed(ev.token) if text else f" {ev.token}")
                        if text is not None and text.stopped:
                            self.engine.cancel(er)
                            finish = "stop"
                            break
                    elif ev.kind == "done":
                        finish = _finish(ev)
                        parts.append(text.flush() if text else "")
                        break
                    else:
                        error = ev.error or errors.GPUKitError("the generation failed")
                        break
                delta = "".join(parts)
                if delta or finish:
                    yield chunks.sse(delta, finish, first)
                    first = False
                if error is not None:
                    f = _failure(error)
                    yield _sse(schema.error_body(f.message, f.kind))
                    finish = "error"
            if include_usage:
                use = schema.usage(prompt_len, n, cached)
                yield _sse(schema.chunk(chat, rid, self.name, None, None, use=use))
            yield "data: [DONE]\n\n"
        finally:
            # Reached on a normal end, and when the client disconnects mid-stream (the
            # response task is cancelled, or the generator closed): blocks go back now.
            self.engine.cancel(er)  # a no-op once the request has ended


class _Failed(Exception):
    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _failure(error: BaseException | None) -> _Failed:
    if isinstance(error, errors.AdmissionRejected):
        return _Failed(503, str(error), "service_unavailable")
    log.error("generation failed: %s", error)
    name = getattr(error, "engine_type", type(error).__name__)  # bridge.EngineError's
    return _Failed(500, f"generation failed: {name}: {error}", "server_error")


def _finish(ev: Event) -> str:
    return "length" if ev.finish_reason == "length" else "stop"


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def build_app(model: Model, engine: Engine | EngineClient, name: str) -> Any:
    """The starlette application serving `model` (as `name`) through `engine` (an Engine
    in this process, or the EngineClient of one in another)."""
    _starlette()
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    api = Api(model, engine, name)

    async def not_found(request: HttpRequest, exc: Exception) -> Any:
        status = getattr(exc, "status_code", 404)
        detail = getattr(exc, "detail", "not found")
        return JSONResponse(schema.error_body(f"{request.method} {request.url.path}: {detail}",
                                              "not_found_error" if status == 404 else
                                              "invalid_request_error"),
                            status_code=status)  # fmt: skip

    async def server_error(request: HttpRequest, exc: Exception) -> Any:
        log.exception("unhandled error")
        return JSONResponse(schema.error_body(f"internal error: {type(exc).__name__}",
                                              "server_error"), status_code=500)  # fmt: skip

    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found,
                                                       Exception: server_error})  # fmt: skip
    app.state.api = api
    return app
