"""Generator behaviour: buckets, EOS stopping, limits, cache reuse, lazy schedule reuse."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import llm, runtime
from pygpukit.llm.generate import bucket

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "llm", "llama")


@pytest.fixture(scope="module")
def model() -> llm.Model:
    return llm.load(FIXTURE, progress=False)


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(os.path.join(FIXTURE, "reference.npz")))


def test_bucket():
    assert [bucket(n, 1024) for n in (1, 16, 17, 100, 600)] == [16, 16, 32, 128, 1024]
    assert bucket(100, 64) == 64


def test_stops_at_eos(model, ref):
    """With the 5th greedy token declared EOS, rows stop there, EOS included."""
    greedy = ref["greedy_a"].tolist()
    eos = greedy[4]
    cut = greedy.index(eos) + 1
    gen = model.generator(1, 64)
    res = gen.generate([ref["prompt_a"].tolist()], 32, eos_ids=[eos])
    assert res.tokens[0] == greedy[:cut]
    assert res.decode_steps == cut - 1


def test_prompt_too_long(model):
    gen = model.generator(1, 32)
    with pytest.raises(gpk.GPUKitError, match="does not fit max_seq_len 32"):
        gen.generate([[5] * 20], 20)
    with pytest.raises(gpk.ShapeError, match="2 prompts for a generator of batch 1"):
        gen.generate([[5], [6]], 4)


def test_cache_beyond_model_positions(model):
    with pytest.raises(gpk.GPUKitError, match="max_position_embeddings 256"):
        model.generator(1, 512)


def test_decode_steps_reuse_one_schedule(model, ref):
    """Positions are device scalars: every decode step after the first hits the cache."""
    gen = model.generator(1, 64)
    gen.generate([ref["prompt_a"].tolist()], 4)  # warm: the prefill and decode schedules
    before = dict(runtime.stats)
    compiled_before = gen._decode.stats() if gen.compiled else None
    res = gen.generate([ref["prompt_a"].tolist()], 12, eos_ids=())
    assert res.tokens[0] == ref["greedy_a"][:12].tolist()
    if compiled_before is not None:
        # One traced decode step, replayed: no new trace, a hit per step.
        after = gen._decode.stats()
        assert after["misses"] == compiled_before["misses"]
        assert after["hits"] - compiled_before["hits"] >= 11
    else:
        assert runtime.stats["schedule_misses"] == before["schedule_misses"]
        assert runtime.stats["schedule_hits"] - before["schedule_hits"] >= 12


def test_text_generate_needs_tokenizer(model):
    with pytest.raises(gpk.GPUKitError, match="no tokenizer.json"):
        model.generate("hello")
