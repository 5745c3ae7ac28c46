"""The engine and the HTTP front end in two processes: the engine's side (EngineBridge, in
the process that owns the model) and the front end's stand-in for the engine
(EngineClient, in the HTTP process), joined by one duplex multiprocessing connection.

Why two processes: in one, the engine thread shares the interpreter lock with the event
loop that serialises every SSE chunk, and each time it lets go of the lock (a GPU wait, a
copy) it queues behind the loop's Python. Here the engine's process runs no event loop:
its engine thread shares the lock only with the bridge thread, which sleeps in recv()
between commands.

The messages (tuples, pickled by the connection):
  front end -> engine: ("cmds", [command, ...]), one event-loop pass's commands at once
    (or those of its first SEND_WITHIN, when the pass takes longer):
      ("submit", rid, prompt, max_tokens, params, stop_ids, qos, priority, tenant,
      arrived: when the request reached the front end, Request.arrived),
      ("cancel", rid), ("stats", qid);
    once at start ("ready", port), or ("failed", message) when it cannot serve.
  engine -> front end: ("events", [event, ...]), one engine step's events of every
    request (Engine.add_step_hook): (rid, token), (rid, token, cached_tokens) for a
    first token with prompt tokens from the prefix cache, (rid, "done", finish_reason),
    (rid, "error", type name, message, admission reason or None);
    ("acks", [(rid, None | (status, kind, message)), ...]) whether engine.submit took
    each request of a "cmds" (Overloaded: 429; a request that can never run: 400);
    ("stats", qid, Engine.stats()); ("stop",) to shut the front end down.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pygpukit import errors

from .engine import Engine, Event, Overloaded, Request, check_request, run_hooks

log = logging.getLogger("pygpukit.serve")

Message = tuple[Any, ...]
# The longest a queued command waits for the event loop's pass to end (seconds): a burst
# of requests read in one pass is parsed and submitted one by one, about 0.3 ms each, so
# sending the pass's commands only at its end held the first submission of 64 back by
# ~25 ms (the H200 run's first engine step came 28 ms after the first request).
SEND_WITHIN = 0.001


class EngineError(errors.GPUKitError):
    """A generation failed in the engine's process; `engine_type` names the exception the
    engine raised there (exceptions are not pickled: only their type name and text)."""

    def __init__(self, message: str, engine_type: str) -> None:
        super().__init__(message)
        self.engine_type = engine_type


class EngineGone(errors.GPUKitError):
    """The engine's process closed the connection (it stopped or died)."""


class EngineBridge:
    """The engine's end of the connection: a bridge thread takes the front end's commands
    (engine.submit / cancel / stats) and answers submissions at once; the engine thread
    sends one "events" message per engine step (a step hook) with what the step's sinks
    collected. `ready` is set when the front end reported its port (or its failure, or
    closed the connection)."""

    def __init__(self, engine: Engine, conn: Any) -> None:
        self.engine, self.conn = engine, conn
        self.ready = threading.Event()
        self.port = 0
        self.failure: str | None = None
        self._reqs: dict[int, Request] = {}  # the front end's request id -> the engine's
        self._events: list[Message] = []  # this step's events so far (the engine thread)
        self._send_lock = threading.Lock()
        self._closed = False
        engine.add_step_hook(self._flush)
        self._thread = threading.Thread(target=self._serve, name="pygpukit-bridge",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def send(self, msg: Message) -> None:
        """Send msg to the front end (any thread); dropped once the connection closed."""
        with self._send_lock:
            if self._closed:
                return
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the front end went away
                self._closed = True

    def join(self, timeout: float | None = None) -> None:
        """Wait for the bridge thread (it ends when the front end's end closes), then close
        this end: no more events are sent."""
        self._thread.join(timeout)
        with self._send_lock:
            self._closed = True
        if not self._thread.is_alive():
            self.conn.close()

    # -- the engine thread ----------------------------------------------------------------
    def _sink(self, rid: int) -> Callable[[Event], None]:
        def sink(ev: Event) -> None:
            if ev.kind == "token":
                self._events.append((rid, ev.token, ev.cached_tokens) if ev.cached_tokens
                                    else (rid, ev.token))  # fmt: skip
                return
            self._reqs.pop(rid, None)
            if ev.kind == "done":
                self._events.append((rid, "done", ev.finish_reason))
            else:
                e = ev.error or errors.GPUKitError("the generation failed")
                reason = e.reason if isinstance(e, errors.AdmissionRejected) else None
                self._events.append((rid, "error", type(e).__name__, str(e), reason))

        return sink

    def _flush(self) -> None:
        """The step hook: one message with everything the step's sinks collected."""
        if self._events:
            evs, self._events = self._events, []
            self.send(("events", evs))

    # -- the bridge thread ----------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            tag = msg[0]
            if tag == "cmds":
                acks: list[Message] = []
                for cmd in msg[1]:
                    self._command(cmd, acks)
                if acks:
                    self.send(("acks", acks))
            elif tag == "ready":
                self.port = int(msg[1])
                self.ready.set()
            elif tag == "failed":
                self.failure = str(msg[1])
                self.ready.set()
        # The front end is gone: nobody reads what still runs, so its blocks go back now.
        with self._send_lock:
            self._closed = True
        for req in list(self._reqs.values()):
            self.engine.cancel(req)
        self.ready.set()

    def _command(self, cmd: Message, acks: list[Message]) -> None:
        kind = cmd[0]
        if kind == "submit":
            _, rid, prompt, max_tokens, params, stop_ids, qos, priority, tenant, arrived = cmd
            req = Request(prompt, max_tokens, self._sink(rid), params, stop_ids, qos, priority,
                          tenant, arrived=arrived)  # fmt: skip
            self._reqs[rid] = req
            try:
                self.engine.submit(req)
            except Overloaded as e:
                self._reqs.pop(rid, None)
                acks.append((rid, (429, "rate_limit_exceeded", str(e))))
            except ValueError as e:
                self._reqs.pop(rid, None)
                acks.append((rid, (400, "invalid_request_error", str(e).splitlines()[0])))
            except Exception as e:  # the front end answers 500; the engine keeps serving
                self._reqs.pop(rid, None)
                log.exception("submit failed")
                acks.append((rid, (500, "server_error", f"{type(e).__name__}: {e}")))
            else:
                acks.append((rid, None))
        elif kind == "cancel":
            running = self._reqs.get(cmd[1])
            if running is not None:
                self.engine.cancel(running)
        elif kind == "stats":
            self.send(("stats", cmd[1], self.engine.stats()))


class EngineClient:
    """What the HTTP app uses of an Engine, in the front end's process: check() with the
    engine's limits, submit() (async: it waits for the engine's answer, so a full queue is
    still a 429), cancel(), stats() (async), eos, max_model_len and add_step_hook(), whose
    hooks run after each engine step's events went to their sinks. Everything runs on the
    event loop attach() names: the connection is read there (loop.add_reader), and a
    loop pass's commands go out in one message."""

    def __init__(self, conn: Any, max_model_len: int, vocab: int, eos: frozenset[int]) -> None:
        self.conn = conn
        self.max_model_len, self.vocab, self.eos = max_model_len, vocab, eos
        self._reqs: dict[int, Request] = {}
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self._stats: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._qids = itertools.count(1)
        self._out: list[Message] = []
        self._out_since = 0.0  # when the first of _out was queued (perf_counter)
        self._hooks: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_stop: Callable[[], None] = lambda: None
        self._gone = False

    def attach(self, loop: asyncio.AbstractEventLoop, on_stop: Callable[[], None]) -> None:
        """Read the connection on `loop`; on_stop() runs when the engine's side asks the
        front end to stop or closes the connection."""
        self._loop, self._on_stop = loop, on_stop
        loop.add_reader(self.conn.fileno(), self._read)

    def send_now(self, msg: Message) -> None:
        """Send one message at once (start-up: "ready", "failed")."""
        self.conn.send(msg)

    # -- what the app calls (the event loop) ----------------------------------------------
    def check(self, prompt: Sequence[int], max_tokens: int) -> None:
        """Engine.check with the engine's limits (raises GPUKitValueError)."""
        check_request(prompt, max_tokens, self.max_model_len, self.vocab)

    async def submit(self, req: Request) -> Request:
        """Hand req to the engine and wait for its answer: raises Overloaded (the queue is
        full), GPUKitValueError (it can never run) or EngineGone."""
        if self._gone:
            raise EngineGone("the engine has stopped")
        assert self._loop is not None, "EngineClient.attach first"
        fut = self._loop.create_future()
        self._reqs[req.id] = req
        self._acks[req.id] = fut
        self._queue(("submit", req.id, req.prompt, req.max_tokens, req.params, req.stop_ids,
                     req.qos, req.priority, req.tenant, req.arrived))  # fmt: skip
        refused = await fut
        if refused is not None:
            self._reqs.pop(req.id, None)
            status, _, message = refused
            if status == 429:
                raise Overloaded(message)
            if status == 400:
                raise errors.GPUKitValueError(message)
            raise EngineError(message, "submit")
        return req

    def cancel(self, req: Request) -> None:
        """End req early (its blocks go back at the engine's next step); a no-op once it
        ended."""
        if self._reqs.pop(req.id, None) is not None and not self._gone:
            self._queue(("cancel", req.id))

    async def stats(self) -> dict[str, Any]:
        """The engine's Engine.stats()."""
        if self._gone:
            raise EngineGone("the engine has stopped")
        assert self._loop is not None, "EngineClient.attach first"
        qid = next(self._qids)
        fut = self._stats[qid] = self._loop.create_future()
        self._queue(("stats", qid))
        return await fut

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call hook() after each engine step's events went to their sinks."""
        self._hooks.append(hook)

    # -- the connection -------------------------------------------------------------------
    def _queue(self, cmd: Message) -> None:
        """Send cmd with the others of this loop pass (at its end), or now with those
        queued before it when the first of them has waited SEND_WITHIN."""
        if not self._out:
            assert self._loop is not None
            self._loop.call_soon(self._send_queued)
            self._out_since = time.perf_counter()
        self._out.append(cmd)
        if time.perf_counter() - self._out_since >= SEND_WITHIN:
            self._send_queued()

    def _send_queued(self) -> None:
        cmds, self._out = self._out, []
        if self._gone or not cmds:
            return
        try:
            self.conn.send(("cmds", cmds))
        except (OSError, ValueError):
            self._close()

    def _read(self) -> None:
        try:
            while self.conn.poll():
                self._dispatch(self.conn.recv())
        except (EOFError, OSError):
            self._close()

    def _dispatch(self, msg: Message) -> None:
        tag = msg[0]
        if tag == "events":
            reqs = self._reqs
            for ev in msg[1]:
                req = reqs.get(ev[0])
                if req is None:  # cancelled here: the engine ends it at its next step
                    continue
                if not isinstance(ev[1], str):  # a token (a first one: and cached tokens)
                    req.sink(Event("token", token=ev[1],
                                   cached_tokens=ev[2] if len(ev) == 3 else 0))  # fmt: skip
                    continue
                del reqs[ev[0]]
                if ev[1] == "done":
                    req.sink(Event("done", finish_reason=ev[2]))
                else:
                    req.sink(Event("error", error=_error(ev[2], ev[3], ev[4])))
            self._run_hooks()
        elif tag == "acks":
            for rid, refused in msg[1]:
                fut = self._acks.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(refused)
        elif tag == "stats":
            sfut = self._stats.pop(msg[1], None)
            if sfut is not None and not sfut.done():
                sfut.set_result(msg[2])
        elif tag == "stop":
            self._on_stop()

    def _run_hooks(self) -> None:
        run_hooks(self._hooks)

    def _close(self) -> None:
        """The engine's side is gone: what waits on it fails, and the front end stops."""
        if self._gone:
            return
        self._gone = True
        if self._loop is not None:
            self._loop.remove_reader(self.conn.fileno())
        gone = EngineGone("the engine has stopped")
        for fut in [*self._acks.values(), *self._stats.values()]:
            if not fut.done():
                fut.set_exception(gone)
        self._acks.clear()
        self._stats.clear()
        for req in list(self._reqs.values()):
            req.sink(Event("error", error=gone))
        self._reqs.clear()
        self._run_hooks()
        self._on_stop()


def _error(type_name: str, message: str, reason: str | None) -> BaseException:
    """The front end's copy of an error the engine sent: AdmissionRejected (a 503) when it
    has an admission reason, else an EngineError naming the engine's exception type."""
    if reason is not None:
        return errors.AdmissionRejected(message, reason)
    return EngineError(message, type_name)


__all__ = ["EngineBridge", "EngineClient", "EngineError", "EngineGone"]
