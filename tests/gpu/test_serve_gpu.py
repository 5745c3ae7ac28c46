"""The serving engine on the CUDA backend. Marked gpu (the directory); skipped without a
GPU."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pygpukit.bench.llm import random_model, tinyllama_config
from pygpukit.serve import Engine
from pygpukit.serve import engine as engine_mod

pytestmark = pytest.mark.usefixtures("cuda")


def test_the_engine_thread_sleeps_through_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SLEEP_WAIT the engine thread waits for each step's tokens asleep (a
    blocking-sync event): of its CPU time through 64 streams' steps (TinyLlama's shape,
    about 1.4 ms of GPU each), next to nothing is spent while it waits (its CPU time beyond
    its launching and emitting stays under half its waiting time, where the driver's
    spinning wait costs all of it); and the tokens are those of the spinning engine (the
    same captured steps)."""
    model = random_model(tinyllama_config(), "bfloat16")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, 32000, size=48)] for _ in range(64)]
    got: dict[bool, list[list[int]]] = {}
    use: dict[bool, tuple[float, float]] = {}  # (CPU ms beyond launch and emit, wait ms)
    for sleep in (False, True):
        monkeypatch.setattr(engine_mod, "SLEEP_WAIT", sleep)
        e = Engine(model, max_model_len=256, max_batch=64, prefill_chunk=64, kv_blocks=1200)
        e.warmup(48)  # every step shape traced: the timed run captures nothing
        # Every request is queued before the engine thread starts, so both engines run the
        # same steps (the same shapes: the same kernels and roundings).
        out: list[list[list[int]]] = []
        caller = threading.Thread(target=lambda e=e, out=out: out.append(
            e.generate(prompts, 96, ignore_eos=True, timeout=300)))  # fmt: skip
        caller.start()
        while e._inbox.qsize() < len(prompts):
            time.sleep(0.001)
        e.start()
        try:
            assert e._thread is not None
            clock = time.pthread_getcpuclockid(e._thread.ident or 0)
            c0, s0 = time.clock_gettime(clock), e.stats()["time_ms"]
            caller.join(300)
            c1, s1 = time.clock_gettime(clock), e.stats()["time_ms"]
            busy = sum(s1[k] - s0[k] for k in ("launch", "emit"))
            use[sleep] = (1e3 * (c1 - c0) - busy, s1["wait"] - s0["wait"])
        finally:
            e.close()
        got[sleep] = out[0]
    print("engine thread (CPU ms beyond launch and emit, wait ms): spinning", use[False],
          "sleeping", use[True])  # fmt: skip
    assert got[True] == got[False] and all(len(t) == 96 for t in got[True])
    cpu, waited = use[True]
    assert cpu < 0.5 * waited, use
