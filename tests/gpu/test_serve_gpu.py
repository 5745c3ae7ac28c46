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
    blocking-sync event): its CPU time through 64 streams' decode steps (TinyLlama's shape,
    about 1.4 ms of GPU each) stays well under the wall time, where the driver's spinning
    wait takes a core throughout; and the tokens are those of the spinning engine (the
    same captured steps)."""
    model = random_model(tinyllama_config(), "bfloat16")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, 32000, size=48)] for _ in range(64)]
    got: dict[bool, list[list[int]]] = {}
    use: dict[bool, tuple[float, float]] = {}
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
            c0, t0 = time.clock_gettime(clock), time.perf_counter()
            caller.join(300)
            use[sleep] = (time.clock_gettime(clock) - c0, time.perf_counter() - t0)
        finally:
            e.close()
        got[sleep] = out[0]
    print("engine thread (cpu s, wall s): spinning", use[False], "sleeping", use[True])
    assert got[True] == got[False] and all(len(t) == 96 for t in got[True])
    cpu, wall = use[True]
    assert cpu < 0.5 * wall, use
