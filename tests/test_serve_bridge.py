"""The engine's bridge and the front end's EngineClient over one multiprocessing
connection, in one process (CPU backend, the tiny model): tokens equal the engine's own
generate(), a full queue and a request the engine refuses come back as the errors the
HTTP layer maps to 429 and 400, a cancel returns the blocks, and a closed connection ends
what was waiting on it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import time
import types

import numpy as np
import pytest

from pygpukit import errors, llm
from pygpukit.serve import Engine, Event, Overloaded, Request
from pygpukit.serve.bridge import EngineBridge, EngineClient, EngineGone


@pytest.fixture(scope="module")
def model():
    from pygpukit.llm.tiny import write_tiny_model

    return llm.load(write_tiny_model())


def _pair(engine: Engine) -> tuple[EngineBridge, EngineClient]:
    mine, theirs = multiprocessing.Pipe(duplex=True)
    bridge = EngineBridge(engine, mine)
    client = EngineClient(theirs, engine.max_model_len, engine.vocab, engine.eos)
    return bridge, client


class _Collect:
    """A request's events in the front end, and a future set when it ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.tokens: list[int] = []
        self.end: asyncio.Future[Event] = loop.create_future()

    def __call__(self, ev: Event) -> None:
        if ev.kind == "token":
            self.tokens.append(ev.token)
        elif not self.end.done():
            self.end.set_result(ev)


def _hang_up(conn) -> None:
    """Shut the connection's socket down as a process exit would (both ends see EOF, a
    thread blocked reading it wakes), leaving the descriptor to its owner to close."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sk:
        sk.shutdown(socket.SHUT_RDWR)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 300, size=int(rng.integers(5, 40)))]
            for _ in range(n)]  # fmt: skip


def test_tokens_equal_generate_and_errors_keep_their_kind(model):
    engine = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=80, max_queue=4)
    bridge, client = _pair(engine)
    prompts = _prompts(3, seed=11)
    stopped: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        client.attach(loop, lambda: stopped.append(True))
        outs = [_Collect(loop) for _ in prompts]
        reqs = [Request(p, 9, out) for p, out in zip(prompts, outs, strict=True)]
        for r in reqs:
            assert await client.submit(r) is r
        ends = [await out.end for out in outs]
        assert [e.kind for e in ends] == ["done"] * 3
        assert [e.finish_reason for e in ends] == ["length"] * 3
        alone = engine.generate(prompts, 9, ignore_eos=True)
        assert [o.tokens for o in outs] == alone
        with pytest.raises(errors.GPUKitValueError, match="qos"):
            await client.submit(Request(prompts[0], 4, _Collect(loop), qos="vip"))
        stats = await client.stats()
        assert stats["finished"] == 6 and stats["used_blocks"] == 0
        # A request cancelled after its first token ends at the engine's next step. The
        # engine holds after the step that gave its first token until the cancel is in
        # its inbox: on a fast GPU its 100 tokens could otherwise all come first.
        out = _Collect(loop)
        long = Request(prompts[1], 100, out)
        hold[0] = True
        await client.submit(long)
        while not out.tokens:
            await asyncio.sleep(0.005)
        client.cancel(long)
        end = time.monotonic() + 60
        while (await client.stats())["used_blocks"] or engine.stats()["cancelled"] == 0:
            assert time.monotonic() < end, engine.stats()
            await asyncio.sleep(0.01)
        assert not out.end.done()  # nothing more reaches a cancelled request's sink
        assert not hold[0]  # the engine held for the cancel
        _hang_up(client.conn)  # the front end's process ends
        while not stopped:
            await asyncio.sleep(0.01)

    hold = [False]

    def hold_for_cancel() -> None:  # a step hook: runs after the bridge's (events sent)
        if hold[0] and any(r.generated for r in engine._running):
            hold[0] = False
            end = time.monotonic() + 60
            while engine._inbox.qsize() == 0 and time.monotonic() < end:
                time.sleep(0.001)

    engine.add_step_hook(hold_for_cancel)
    engine.start()
    try:
        asyncio.run(main())
    finally:
        bridge.join(10)
        engine.close()
        client.conn.close()
    assert stopped == [True] and not bridge._thread.is_alive()


def test_a_full_queue_is_overloaded_and_a_closed_connection_ends_the_rest(model):
    engine = Engine(model, max_model_len=64, kv_blocks=40, max_queue=1)  # never started
    bridge, client = _pair(engine)
    stopped: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        client.attach(loop, lambda: stopped.append(True))
        waiting = _Collect(loop)
        await client.submit(Request([5, 6, 7], 4, waiting))
        with pytest.raises(Overloaded, match="waiting"):
            await client.submit(Request([5, 6, 7], 4, _Collect(loop)))
        # The engine's side goes away: the request still waiting ends with EngineGone,
        # and the client asks its owner to stop.
        _hang_up(bridge.conn)
        ev = await asyncio.wait_for(waiting.end, 60)
        assert ev.kind == "error" and isinstance(ev.error, EngineGone)
        assert stopped == [True]
        with pytest.raises(EngineGone):
            await client.submit(Request([5, 6, 7], 4, _Collect(loop)))

    try:
        asyncio.run(main())
    finally:
        bridge.join(10)
        client.conn.close()
    assert not bridge._thread.is_alive()


def test_ctrl_c_while_the_front_end_starts_stops_cleanly():
    """A Ctrl-C that lands while start() still waits for the front end (which already
    answers /health) asks for the stop like any other: run() returns and stops once, no
    KeyboardInterrupt escapes it."""
    import os
    import signal
    import threading

    from pygpukit.serve.server import Server

    class Front:
        def is_alive(self) -> bool:
            return True

        def join(self, timeout: float) -> None:
            pass

    srv = object.__new__(Server)
    srv.server = None
    calls: list[str] = []

    def start() -> Server:
        srv._procs = [Front()]
        os.kill(os.getpid(), signal.SIGINT)  # delivered before start() returns
        return srv

    def stop() -> None:
        calls.append("stop")
        srv._procs = []

    srv.start, srv.stop = start, stop  # type: ignore[method-assign]
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT)
    srv.run()
    assert calls == ["stop"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_long_loop_pass_sends_its_commands_without_waiting_for_its_end(monkeypatch):
    """The commands of one event-loop pass go out together at its end; in a pass that runs
    longer than SEND_WITHIN (a burst of requests parsed one by one) those queued so far go
    out as soon as the first has waited that long, not at the end."""
    from pygpukit.serve import bridge as bridge_mod

    now = [100.0]
    monkeypatch.setattr(bridge_mod, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    mine, theirs = multiprocessing.Pipe(duplex=True)
    client = EngineClient(theirs, 128, 300, frozenset())

    async def main() -> None:
        client.attach(asyncio.get_running_loop(), lambda: None)
        client._queue(("cancel", 1))
        now[0] += bridge_mod.SEND_WITHIN / 2
        client._queue(("cancel", 2))
        assert not mine.poll()  # held for the pass's end
        now[0] += bridge_mod.SEND_WITHIN
        client._queue(("cancel", 3))  # the first has waited SEND_WITHIN: all go now
        assert mine.poll(5) and mine.recv() == ("cmds", [("cancel", 1), ("cancel", 2),
                                                         ("cancel", 3)])  # fmt: skip
        client._queue(("cancel", 4))
        assert not mine.poll()
        await asyncio.sleep(0)  # the pass ends
        assert mine.poll(5) and mine.recv() == ("cmds", [("cancel", 4)])
        assert not mine.poll(0.05)

    try:
        asyncio.run(main())
    finally:
        mine.close()
        theirs.close()
