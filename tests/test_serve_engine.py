"""The paged KV-cache ops against a float64 reference, and the continuous-batching engine:
batched greedy output equals each prompt generated alone, blocks go back to the pool,
admission through the scheduler core (memory = KV blocks, QoS order), a bounded queue."""

from __future__ import annotations

import itertools
import sys
import threading
import time

import numpy as np
import pytest
from attention_ref import paged_sdpa_ref

import pygpukit as gpk
from pygpukit import errors, llm
from pygpukit.serve import Engine, Event, Overloaded, Request
from pygpukit.serve.engine import LOOKAHEAD, SWITCH_INTERVAL_S


@pytest.mark.parametrize("t", [1, 5])
def test_paged_attention_against_float64(t):
    rng = np.random.default_rng(1)
    n_blocks, kv, bs, d, h, b = 9, 2, 4, 16, 4, 3
    kp = rng.standard_normal((n_blocks, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((n_blocks, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    table = np.array([[4, 1, 7, 0], [2, 8, 0, 0], [5, 3, 6, 0]], np.int32)
    lens = np.array([11, 3, 0], np.int32)  # a row shorter than T, a padded row
    got = gpk.nn.paged_attention(q, kp, vp, table, lens).to_numpy()
    np.testing.assert_allclose(got, paged_sdpa_ref(q, kp, vp, table, lens), atol=2e-5)


def test_paged_write_stores_at_slots_in_place():
    rng = np.random.default_rng(2)
    pool_np = rng.standard_normal((5, 2, 4, 8)).astype(np.float32)
    pool = gpk.from_numpy(pool_np)
    new = rng.standard_normal((3, 2, 8)).astype(np.float32)
    gpk.nn.paged_write(pool, new, np.array([6, -1, 19], np.int64))
    want = pool_np.copy()
    want[1, :, 2], want[4, :, 3] = new[0], new[2]
    np.testing.assert_array_equal(pool.to_numpy(), want)
    with pytest.raises(IndexError, match="slot 20 is outside|index 20 is out of bounds"):
        gpk.nn.paged_write(pool, new, np.array([0, 1, 20]))
        pool.to_numpy()


def test_paged_ops_shape_errors():
    pool = gpk.zeros((4, 2, 4, 8))
    with pytest.raises(errors.ShapeError, match="paged_write"):
        gpk.nn.paged_write(pool, gpk.zeros((3, 2, 4)), gpk.zeros(3, dtype="int32"))
    with pytest.raises(errors.ShapeError, match="block_table"):
        gpk.nn.paged_attention(gpk.zeros((2, 4, 1, 8)), pool, pool, gpk.zeros((3, 2), "int32"),
                               gpk.zeros(2, dtype="int32"))  # fmt: skip
    with pytest.raises(errors.ShapeError, match="query heads"):
        gpk.nn.paged_attention(gpk.zeros((2, 3, 1, 8)), pool, pool, gpk.zeros((2, 2), "int32"),
                               gpk.zeros(2, dtype="int32"))  # fmt: skip


@pytest.fixture(scope="module")
def model():
    from pygpukit.llm.tiny import write_tiny_model

    return llm.load(write_tiny_model())


@pytest.fixture(scope="module")
def engine(model):
    e = Engine(model, max_model_len=256, prefill_chunk=32, kv_blocks=160).start()
    yield e
    e.close()


def _prompts(n, seed=0, low=5, high=70):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(3, 300, size=int(rng.integers(low, high)))]
            for _ in range(n)]  # fmt: skip


def test_batched_greedy_equals_alone_and_the_static_path(model, engine):
    prompts = _prompts(12)
    batched = engine.generate(prompts, 9, ignore_eos=True, timeout=300)
    alone = [engine.generate([p], 9, ignore_eos=True, timeout=300)[0] for p in prompts[:4]]
    assert batched[:4] == alone
    static = [model.generate_ids([p], 9, stop_at_eos=False).tokens[0] for p in prompts[:4]]
    assert alone == static
    assert engine.stats()["used_blocks"] == 0  # every block back in the pool


def test_prefill_batches_several_prompts(model):
    """Prompts queued together prefill in shared steps (fewer prefill steps than prompt
    pieces, no step above step_tokens), chunked prompts included, and each prompt's tokens
    are what it makes alone on the static path."""
    e = Engine(model, max_model_len=256, prefill_chunk=32, step_tokens=128, max_batch=16,
               kv_blocks=200).start()  # fmt: skip
    try:
        prompts = _prompts(10, seed=7, low=5, high=90)
        before = e.stats()["prefill_steps"]
        batched = e.generate(prompts, 6, ignore_eos=True, timeout=300)
        chunks = e.stats()["prefill_steps"] - before
        assert chunks < sum(-(-len(p) // 32) for p in prompts)
        assert e.stats()["max_step_tokens"] <= 128
        static = [model.generate_ids([p], 6, stop_at_eos=False).tokens[0] for p in prompts]
        assert batched == static
        assert e.stats()["used_blocks"] == 0
    finally:
        e.close()


def test_decode_steps_of_an_unchanged_batch_upload_nothing(model, monkeypatch):
    """The rows' positions and block tables live on the device: a decode-only step
    uploads only when its batch changed (the rows' token slots), and a step that prefills
    is two uploads (its tokens, its prompts' block tables), so two streams decoding 20
    tokens upload a handful of arrays, not several per step; their tokens are the static
    path's."""
    uploads: list[str] = []
    real = gpk.from_numpy

    def counted(a, *args, **kwargs):
        uploads.append(threading.current_thread().name)
        return real(a, *args, **kwargs)

    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=2)
    e.warmup(30)
    monkeypatch.setattr(gpk, "from_numpy", counted)
    e.start()
    try:
        prompts = _prompts(2, seed=51, low=10, high=30)
        out = e.generate(prompts, 20, ignore_eos=True, timeout=300)
        st = e.stats()
        assert st["decode_steps"] >= 19
        # two per prefilling step, one per batch change (1 row, 2 rows, 1 row at the end)
        assert uploads.count("pygpukit-engine") <= 2 * st["prefill_steps"] + 3
        assert out == [model.generate_ids([p], 20, stop_at_eos=False).tokens[0] for p in prompts]
    finally:
        e.close()


def test_a_read_back_in_flight_sleeps_on_its_steps_event_first(model, monkeypatch):
    """The engine thread waits for a step's tokens by sleeping on an event recorded after
    the step (blocking sync on CUDA: a spinning wait holds a CPU core through each step)
    and only then takes the copy, which is waited on by spinning; with SLEEP_WAIT off it
    takes the copy at once. The events are reused (one per step in flight), and the
    tokens are the static path's. Stand-ins: an event log, and read-backs that are still
    in flight until taken."""
    from pygpukit.array import GPUArray
    from pygpukit.serve import engine as engine_mod

    log: list[tuple[str, int]] = []
    made: list[object] = []
    real = GPUArray.to_numpy_async
    copies = itertools.count()

    class InFlight:  # a read-back whose copy has not landed until result() is called
        def __init__(self, transfer):
            self.transfer, self.k = transfer, next(copies)

        def done(self):
            return False

        def result(self):
            log.append(("copy", self.k))
            return self.transfer.result()

    class Ev:
        def __init__(self):
            self.k = -1
            made.append(self)

        def synchronize(self):
            log.append(("event", self.k))

    steps = itertools.count()

    def record(pool):
        ev = pool.pop() if pool else Ev()
        ev.k = next(steps)  # the launch's read-back was made just before: the same index
        return ev

    prompts = _prompts(3, seed=61, low=10, high=40)
    want = [model.generate_ids([p], 12, stop_at_eos=False).tokens[0] for p in prompts]
    monkeypatch.setattr(GPUArray, "to_numpy_async", lambda self: InFlight(real(self)))
    for sleep in (True, False):
        monkeypatch.setattr(engine_mod, "SLEEP_WAIT", sleep)
        log.clear()
        made.clear()
        copies, steps = itertools.count(), itertools.count()
        e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=4)
        e._record_wait = record
        e.start()
        try:
            assert e.generate(prompts, 12, ignore_eos=True, timeout=300) == want
            n = e.stats()["steps"]
        finally:
            e.close()
        copied = [k for what, k in log if what == "copy"]
        assert copied == list(range(n))  # every step, in order
        if sleep:  # each copy right after its own step's event
            assert log == [(what, k) for k in copied for what in ("event", "copy")]
        else:
            assert not [k for what, k in log if what == "event"]
        assert 1 <= len(made) <= engine_mod.LOOKAHEAD + 1 and len(e._wait_events) == len(made)


def test_a_long_prompt_is_split_over_steps_and_several_share_one(model):
    """A prompt longer than prefill_chunk is prefilled prefill_chunk tokens a step (its
    later pieces attend the keys the earlier ones stored); prompts waiting together share
    a step up to its budget, and the tokens are the static path's. 200 tokens in 32-token
    pieces take 7 steps alone; with two 40-token prompts behind it in a 128-token budget
    they join its steps instead of adding their own (prefix caching off: the prompt comes
    back)."""
    e = Engine(model, max_model_len=256, prefill_chunk=32, step_tokens=128, max_batch=4,
               kv_blocks=64, prefix_caching=False).start()  # fmt: skip
    try:
        (prompt,) = _prompts(1, seed=41, low=200, high=201)
        out = e.generate([prompt], 5, ignore_eos=True, timeout=300)
        st = e.stats()
        assert st["prefill_steps"] == 7 and st["prefill_tokens"] == 200
        assert st["max_step_tokens"] == 32
        assert out == [model.generate_ids([prompt], 5, stop_at_eos=False).tokens[0]]
        short = _prompts(2, seed=42, low=40, high=41)
        outs = e.generate([prompt, *short], 5, ignore_eos=True, timeout=300)
        st2 = e.stats()
        assert st2["prefill_steps"] - st["prefill_steps"] == 7
        assert st2["max_step_tokens"] == 128
        assert outs == [out[0], *(model.generate_ids([p], 5, stop_at_eos=False).tokens[0]
                                  for p in short)]  # fmt: skip
        assert st2["used_blocks"] == 0
    finally:
        e.close()


def test_warmup_traces_every_greedy_shape(model):
    """After warmup a greedy run compiles nothing new, stores nothing, and its tokens are
    the static path's."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, step_tokens=64, max_batch=4,
               kv_blocks=64)  # fmt: skip
    n = e.warmup(60)
    # steps of 1, 2, 4, ..., 64 tokens, and decode-only steps (no piece kernel) of 1, 2, 4
    assert n == len(e._compiled) == 10
    assert sorted(k[:2] for k in e._compiled if not k[1]) == [(1, False), (2, False),
                                                              (4, False)]  # fmt: skip
    assert e.stats()["used_blocks"] == 0
    e.start()
    try:
        prompts = _prompts(5, seed=9, low=5, high=60)
        out = e.generate(prompts, 4, ignore_eos=True, timeout=300)
        assert len(e._compiled) == 10
        # Each step was traced once, at warmup, with the shapes serving gives it (a decode
        # bucket traced with one row re-traced at its first real step: a stall of a whole
        # trace and capture in the middle of serving).
        assert [fn.stats()["misses"] for fn in e._compiled.values()] == [1] * 10
        # The decode-only steps ran on their own graphs: 4 rows decoding, no prompt left.
        assert e._compiled[(4, False, False, 0, False)].stats()["calls"] > 1
        static = [model.generate_ids([p], 4, stop_at_eos=False).tokens[0] for p in prompts]
        assert out == static
        with pytest.raises(gpk.errors.GPUKitError):
            e.warmup()
    finally:
        e.close()


def test_seeded_sampling_is_per_request(engine):
    p = _prompts(2, seed=3)
    sp = llm.SamplingParams(0.9, 20, 0.9, seed=11)
    a = engine.generate([p[0]], 8, sp, ignore_eos=True, timeout=300)[0]
    b = engine.generate([p[0], p[1]], 8, sp, ignore_eos=True, timeout=300)[0]
    assert a == b  # the same seed draws the same tokens whatever else is in the batch
    c = engine.generate([p[0]], 8, llm.SamplingParams(0.9, 20, 0.9, seed=12), ignore_eos=True)
    assert c[0] != a


def test_decode_rows_follow_the_batch_as_streams_finish_and_join(model):
    """The decode rows are rebuilt only when the running batch changes or a row runs out
    of tokens to schedule (_decode_rows): streams of 2, 5, 9 and 14 tokens started
    together, two more joining while they run (one seeded-sampled, so greedy and sampled
    batches alternate), each get exactly their tokens -- the static path's for the
    greedy ones, the same draws as alone for the sampled one -- and no step schedules a
    row past its last token."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=96, max_batch=8).start()
    try:
        prompts = _prompts(6, seed=61, low=8, high=40)
        lengths = [2, 5, 9, 14, 7, 6]
        sp = llm.SamplingParams(0.8, 30, 0.9, seed=5)
        params = [llm.SamplingParams()] * 5 + [sp]
        outs: list[list[int]] = [[] for _ in prompts]
        done = threading.Semaphore(0)

        def sink_for(i):
            def sink(ev):
                if ev.kind == "token":
                    outs[i].append(ev.token)
                else:
                    done.release()

            return sink

        reqs = [
            Request(p, n, sink_for(i), params=sp_i)
            for i, (p, n, sp_i) in enumerate(zip(prompts, lengths, params, strict=True))
        ]
        for r in reqs[:4]:
            e.submit(r)
        while len(outs[0]) < 1:  # the first streams run when the others join
            time.sleep(0.001)
        for r in reqs[4:]:
            e.submit(r)
        for _ in reqs:
            assert done.acquire(timeout=300)
        for i in range(5):
            assert outs[i] == model.generate_ids([prompts[i]], lengths[i],
                                                 stop_at_eos=False).tokens[0]  # fmt: skip
        assert outs[5] == e.generate([prompts[5]], 6, sp, ignore_eos=True, timeout=300)[0]
        assert [r.scheduled for r in reqs] == lengths
        assert e.stats()["used_blocks"] == 0
    finally:
        e.close()


def test_eos_stops_and_frees(engine, model):
    p = _prompts(1, seed=4)[0]
    free = engine.generate([p], 6, ignore_eos=True)[0]
    got: list[Event] = []
    done = threading.Event()

    def sink(ev):
        got.append(ev)
        if ev.kind != "token":
            done.set()

    engine.submit(Request(p, 6, sink, stop_ids=frozenset({free[1]})))
    assert done.wait(120)
    assert [e.token for e in got if e.kind == "token"] == free[:2]
    assert got[-1].finish_reason == "stop"
    assert engine.stats()["used_blocks"] == 0


def test_cancel_frees_blocks(engine):
    started = threading.Event()
    ended = threading.Event()
    events: list[Event] = []

    def sink(ev):
        events.append(ev)
        started.set()
        if ev.kind != "token":
            ended.set()

    req = engine.submit(Request(_prompts(1, seed=5)[0], 200, sink))
    assert started.wait(120)
    assert engine.stats()["used_blocks"] > 0
    engine.cancel(req)
    assert ended.wait(120)
    assert events[-1].finish_reason == "cancelled"
    assert engine.stats()["used_blocks"] == 0


def test_too_long_and_bad_ids_are_refused(engine):
    with pytest.raises(ValueError, match="maximum context length is 256"):
        engine.submit(Request([5] * 200, 100, lambda e: None))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit(Request([5, 99999], 4, lambda e: None))
    with pytest.raises(ValueError, match="no tokens"):
        engine.submit(Request([], 4, lambda e: None))


def _recorder(order, done):
    def sink_for(name):
        def sink(ev):
            if ev.kind == "token" and name not in order:
                order.append(name)
            if ev.kind != "token":
                order.append(f"{name}:{ev.finish_reason or type(ev.error).__name__}")
                done.release()

        return sink

    return sink_for


def test_start_order_follows_qos_and_priority(model):
    """With room for one running sequence, the scheduler core picks who starts next:
    guaranteed before burstable, higher priority first, then arrival order."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=1)
    order: list[str] = []
    done = threading.Semaphore(0)
    sink_for = _recorder(order, done)
    p = _prompts(1, seed=6, low=20, high=21)[0]
    e.submit(Request(p, 3, sink_for("b1")))
    e.submit(Request(p, 3, sink_for("b2")))
    e.submit(Request(p, 3, sink_for("b-prio"), priority=5))
    e.submit(Request(p, 3, sink_for("g"), qos="guaranteed"))
    e.start()
    try:
        for _ in range(4):
            assert done.acquire(timeout=300)
        starts = [x for x in order if ":" not in x]
        assert starts == ["g", "b-prio", "b1", "b2"]
    finally:
        e.close()


def test_admission_by_kv_memory(model):
    """A cache of 8 blocks holds one 120-token reservation: a second burstable request
    queues in the scheduler until the first frees its blocks; a guaranteed one that does
    not fit now is rejected (the core's rule); the wait queue is bounded."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=8, max_queue=2)
    order: list[str] = []
    done = threading.Semaphore(0)
    sink_for = _recorder(order, done)
    p = _prompts(1, seed=6, low=20, high=21)[0]
    e.submit(Request(p, 100, sink_for("first")))
    e.submit(Request(p, 100, sink_for("second")))
    with pytest.raises(Overloaded, match="waiting"):
        e.submit(Request(p, 100, sink_for("x")))
    e.start()
    try:
        while "first" not in order:
            threading.Event().wait(0.01)
        e.submit(Request(p, 100, sink_for("g"), qos="guaranteed"))
        for _ in range(3):
            assert done.acquire(timeout=300)
        assert order.index("first:length") < order.index("second")
        assert "g:AdmissionRejected" in order
        assert e.stats()["used_blocks"] == 0 and e.stats()["waiting"] == 0
    finally:
        e.close()


def test_freed_token_slot_and_blocks_reused_while_a_step_is_in_flight(model):
    """With room for two sequences, one stops at EOS while the step after it is already
    in flight (it runs one step ahead); the request waiting takes its token slot and KV
    blocks, and every stream still gets the static path's tokens."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=2)
    prompts = _prompts(3, seed=12, low=10, high=40)
    static = [model.generate_ids([p], 8, stop_at_eos=False).tokens[0] for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    ends: list[str] = ["" for _ in prompts]
    done = threading.Semaphore(0)

    def sink_for(i):
        def sink(ev):
            if ev.kind == "token":
                outs[i].append(ev.token)
            else:
                ends[i] = ev.finish_reason or repr(ev.error)
                done.release()

        return sink

    e.submit(Request(prompts[0], 8, sink_for(0), stop_ids=frozenset({static[0][2]})))
    e.submit(Request(prompts[1], 8, sink_for(1)))
    e.submit(Request(prompts[2], 8, sink_for(2)))
    e.start()
    try:
        for _ in prompts:
            assert done.acquire(timeout=300)
        cut = static[0].index(static[0][2]) + 1
        assert outs[0] == static[0][:cut] and ends[0] == "stop"
        assert outs[1:] == static[1:] and ends[1:] == ["length", "length"]
        st = e.stats()
        assert st["used_blocks"] == 0 and sorted(e._tok_free) == [0, 1]
        assert st["decode_steps"] >= 7 and st["tokens"] == sum(map(len, outs))
        # The engine thread's time by phase: each phase ran, and together they fit in the
        # run (a wall-clock bound, not a speed claim).
        assert all(st["time_ms"][k] > 0 for k in ("launch", "wait", "emit"))
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
    finally:
        e.close()


def test_running_streams_decode_between_a_long_prompts_chunks(model):
    """A long prompt arriving while two streams decode is prefilled one chunk per engine
    step (the budget leaves room for one 32-token chunk beside the decode rows), and the
    running streams get a token in every one of those steps instead of waiting for the
    whole prefill (counted between the long prompt's submit and its first token: a GPU
    reads tokens back up to LOOKAHEAD steps late); every stream's tokens are still the
    static path's."""
    e = Engine(model, max_model_len=256, prefill_chunk=32, step_tokens=64, max_batch=4,
               kv_blocks=64)  # fmt: skip
    short = _prompts(2, seed=21, low=10, high=20)
    long = _prompts(1, seed=22, low=200, high=201)[0]
    want_short = [model.generate_ids([p], 40, stop_at_eos=False).tokens[0] for p in short]
    want_long = model.generate_ids([long], 4, stop_at_eos=False).tokens[0]
    chunks_at: list[list[int]] = [[], [], []]  # the engine's prefill launches at each token
    outs: list[list[int]] = [[], [], []]
    submitted_at: list[int] = []
    order: list[int] = []  # the stream of each token, as emitted
    done = threading.Semaphore(0)

    def sink_for(i):
        def sink(ev):  # the engine thread: its counters are consistent here
            if ev.kind != "token":
                done.release()
                return
            outs[i].append(ev.token)
            order.append(i)
            chunks_at[i].append(e._counts["prefill_steps"])
            if i == 0 and len(outs[0]) == 3:  # the long prompt arrives mid-stream
                submitted_at.append(e._counts["prefill_steps"])
                submitted_at.append(len(order))
                e.submit(Request(long, 4, sink_for(2)))

        return sink

    e.submit(Request(short[0], 40, sink_for(0)))
    e.submit(Request(short[1], 40, sink_for(1)))
    e.start()
    try:
        for _ in range(3):
            assert done.acquire(timeout=300)
        assert outs == [*want_short, want_long]
        (c0, at), c1 = submitted_at, chunks_at[2][0]
        assert c1 - c0 == -(-len(long) // 32)  # only the long prompt prefilled after c0
        while_prefilled = order[at : order.index(2)]
        for i in (0, 1):
            assert while_prefilled.count(i) >= c1 - c0 - LOOKAHEAD
        st = e.stats()
        assert st["max_step_tokens"] <= 64 and st["mixed_steps"] >= c1 - c0
    finally:
        e.close()


def test_step_token_budget_is_respected(model):
    """A burst of prompts longer than the budget lets through: no engine step computes
    more than step_tokens (decode rows bucket + padded prefill tokens), the prompts are
    cut to fit (prefill_chunk is larger than the budget), every prompt token is prefilled
    once, and the tokens are the static path's."""
    e = Engine(model, max_model_len=256, prefill_chunk=64, step_tokens=40, max_batch=8,
               kv_blocks=200).start()  # fmt: skip
    try:
        prompts = _prompts(12, seed=23, low=5, high=90)
        out = e.generate(prompts, 7, ignore_eos=True, timeout=300)
        st = e.stats()
        assert 0 < st["max_step_tokens"] <= 40
        assert st["prefill_tokens"] == sum(map(len, prompts))
        assert st["mixed_steps"] > 0 and st["steps"] >= st["decode_steps"]
        static = [model.generate_ids([p], 7, stop_at_eos=False).tokens[0] for p in prompts]
        assert out == static
        assert st["used_blocks"] == 0
    finally:
        e.close()


def test_a_step_of_prompts_alone_takes_the_prefill_budget(model):
    """prefill_step_tokens bounds the steps with no decode row (a burst of prompts
    arriving together); a step with d decode rows takes prefill_step_tokens / d (a power
    of two) or step_tokens, the more: the first step of the burst takes 128 prompt
    tokens, steps beside one or two decode rows 128 and 64, the others stay within 40;
    every prompt token is prefilled once and the tokens are the static path's."""
    e = Engine(model, max_model_len=256, prefill_chunk=64, step_tokens=40,
               prefill_step_tokens=128, max_batch=8, kv_blocks=200)  # fmt: skip
    launches: list[tuple[int, int]] = []  # (decode rows, launch size)
    launch = e._launch

    def record(rows, pieces):
        used = len(rows) + sum(c for _, c in pieces)
        launches.append((len(rows), e._step_size(used, e._budget(rows))))
        return launch(rows, pieces)

    e._launch = record
    prompts = _prompts(8, seed=29, low=30, high=60)
    out: list[list[int]] = []
    t = threading.Thread(target=lambda: out.extend(e.generate(prompts, 5, ignore_eos=True,
                                                              timeout=300)))  # fmt: skip
    t.start()
    try:
        while e._inbox.qsize() < len(prompts):  # every prompt waits before the first step
            time.sleep(0.01)
        e.start()
        t.join(300)
        assert launches[0] == (0, 128)
        bound = {0: 128, 1: 128, 2: 64}
        assert all(n <= bound.get(rows, 40) for rows, n in launches)
        assert any(rows and n > 40 for rows, n in launches)
        st = e.stats()
        assert st["prefill_tokens"] == sum(map(len, prompts))
        assert st["prefill_step_tokens"] == 128 and st["max_step_tokens"] == 128
        assert out == [model.generate_ids([p], 5, stop_at_eos=False).tokens[0] for p in prompts]
    finally:
        e.close()
    with pytest.raises(ValueError, match=r"prefill_step_tokens must be an integer >= "
                                         r"step_tokens \(40\), got 32"):  # fmt: skip
        Engine(model, max_model_len=64, max_batch=8, step_tokens=40, prefill_step_tokens=32,
               kv_blocks=8)  # fmt: skip


def test_step_tokens_must_leave_room_for_prefill(model):
    with pytest.raises(ValueError, match=r"step_tokens must be an integer >= 24 .*got 20"):
        Engine(model, max_model_len=64, max_batch=8, step_tokens=20, kv_blocks=8)
    e = Engine(model, max_model_len=64, max_batch=8, prefill_chunk=32, kv_blocks=8)
    assert e.step_tokens == 64  # 2 * prefill_chunk
    assert e.prefill_step_tokens == 64


def test_step_hooks_run_once_per_step_after_its_events(model):
    """A step hook runs on the engine thread after each step's events: four streams
    decoding together see their tokens in groups (one token per stream per group), so a
    sink that only queues (the HTTP relay) hands a whole step on at once."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=4)
    groups: list[list[int]] = [[]]
    e.add_step_hook(lambda: groups.append([]) if groups[-1] else None)
    prompts = _prompts(4, seed=31, low=8, high=30)
    done = threading.Semaphore(0)

    def sink_for(i):
        def sink(ev):
            if ev.kind == "token":
                groups[-1].append(i)
            else:
                done.release()

        return sink

    for i, p in enumerate(prompts):
        e.submit(Request(p, 10, sink_for(i)))
    e.start()
    try:
        for _ in prompts:
            assert done.acquire(timeout=300)
    finally:
        e.close()
    full = [g for g in groups if g]
    assert sum(map(len, full)) == 40
    assert all(len(set(g)) == len(g) for g in full)  # one token per stream per step
    assert len(full) <= e.stats()["steps"] + 1 < 40


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_quantized_model_serves_what_it_generates(fmt):
    """`serve --quantize`: the engine over a model quantized on load gives, greedily, the
    static path's tokens of that same quantized model."""
    from pygpukit.llm.tiny import write_tiny_model

    qmodel = llm.load(write_tiny_model(), quantize=fmt, quantize_group=4)  # divides K=172
    prompts = _prompts(3, seed=7)
    e = Engine(qmodel, max_model_len=256, prefill_chunk=32, kv_blocks=64).start()
    try:
        served = e.generate(prompts, 6, ignore_eos=True, timeout=300)
    finally:
        e.close()
    static = [qmodel.generate_ids([p], 6, stop_at_eos=False).tokens[0] for p in prompts]
    assert served == static


def test_serve_takes_the_quantize_flags():
    from pygpukit.cli import build_parser
    from pygpukit.cli.quantize_args import quantize_options

    args = build_parser().parse_args(["serve", "tiny", "--quantize", "int4", "--quant-group", "4"])
    assert quantize_options(args) == {"quantize": "int4", "quantize_group": 4}
    assert quantize_options(build_parser().parse_args(["serve", "tiny"])) == {}


def test_the_switch_interval_comes_back_when_the_last_engine_closes(model):
    """So do the objects a started engine froze against the garbage collector (its traced
    graphs and weights: a full collection walking them would stall serving)."""
    import gc

    from pygpukit.serve import engine as engine_module

    before = sys.getswitchinterval()
    others = engine_module._switch["engines"]  # engines other tests left running
    # Objects the process froze before (an in-process front end freezes its start-up for
    # good) keep the engines from unfreezing: only a process with none gets back to none.
    frozen_before = gc.get_freeze_count()
    a = Engine(model, max_model_len=64, prefill_chunk=16, kv_blocks=8).start()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    b = Engine(model, max_model_len=64, prefill_chunk=16, kv_blocks=8).start()
    assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
    assert gc.get_freeze_count() > frozen  # b's own objects too
    a.close()
    assert sys.getswitchinterval() <= SWITCH_INTERVAL_S  # b still runs
    assert gc.get_freeze_count() > 0
    b.close()
    assert sys.getswitchinterval() == before
    if others == 0 and frozen_before == 0:
        assert gc.get_freeze_count() == 0


def test_the_loop_waits_for_a_command_when_nothing_can_be_launched(model):
    """A running row with no token left to make and nothing in flight (its read-back is
    done) leaves the engine nothing to launch: the loop then blocks on its inbox instead of
    spinning (it spun, holding the interpreter lock, after the load generator's mixed-step
    timing left such rows behind), and a new request still runs."""
    e = Engine(model, max_model_len=128, prefill_chunk=32, kv_blocks=64, max_batch=4)
    stuck = Request(_prompts(1, seed=5)[0], 1, lambda ev: None)
    stuck.scheduled = stuck.max_tokens  # nothing left to schedule, nothing in flight
    e._running.append(stuck)
    passes = [0]
    e.add_step_hook(lambda: passes.__setitem__(0, passes[0] + 1))
    e.start()
    try:
        threading.Event().wait(0.5)
        assert passes[0] <= 2  # one pass, then the blocked wait (spinning made thousands)
        (out,) = e.generate(_prompts(1, seed=6), 3)
        assert len(out) == 3
    finally:
        e._running.remove(stuck)
        e.close()


def test_timeline_follows_each_request_and_step(model):
    """Engine.timeline: each finished request's stamps in order (reached the server, the
    submit, its first piece's step, the step finishing its prompt, its first token, its
    end), the steps launched (their decode rows and prompt tokens add up to the stats'
    counts) and the idle periods, all from `since` on; a later `since` leaves the earlier
    round out."""
    e = Engine(model, max_model_len=128, prefill_chunk=16, step_tokens=48, kv_blocks=64,
               max_batch=4).start()  # fmt: skip
    try:
        since = time.perf_counter()
        prompts = _prompts(3, seed=51, low=20, high=40)
        e.generate(prompts, 6, ignore_eos=True, timeout=300)
        st = e.stats()
        tl = e.timeline(since)
        reqs = tl["requests"]
        assert sorted(r["prompt"] for r in reqs) == sorted(map(len, prompts))
        for r in reqs:
            assert r["tokens"] == 6 and r["reason"] == "length"
            stamps = [r[k] for k in ("arrived", "submitted", "started", "prefilled",
                                     "first_token", "ended")]  # fmt: skip
            assert since <= stamps[0] and stamps == sorted(stamps)
            assert r["arrived"] == r["submitted"]  # submitted here, not through a server
        steps = tl["steps"]
        assert len(steps) == st["steps"] > 0
        assert sum(s["prompt_tokens"] for s in steps) == st["prefill_tokens"] == sum(
            map(len, prompts))  # fmt: skip
        assert sum(s["rows"] > 0 for s in steps) == st["decode_steps"]
        assert all(s["start"] <= s["end"] and s["rows"] + s["prompt_tokens"] <= s["tokens"]
                   for s in steps)  # fmt: skip
        assert st["time_ms"]["idle"] > 0 and all(i["start"] <= i["end"] for i in tl["idle"])
        later = time.perf_counter()
        e.generate(prompts[:1], 2, ignore_eos=True, timeout=300)
        (again,) = e.timeline(later)["requests"]
        assert again["tokens"] == 2 and again["arrived"] >= later
    finally:
        e.close()
