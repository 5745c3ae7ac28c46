"""Generator behaviour: buckets, EOS stopping, limits, cache reuse, lazy schedule reuse."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import llm
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
    gen.generate([ref["prompt_a"].tolist()], 4)  # warm: the prefill and decode traces
    before = gen._decode.stats()
    res = gen.generate([ref["prompt_a"].tolist()], 12, eos_ids=())
    assert res.tokens[0] == ref["greedy_a"][:12].tolist()
    # One traced decode step, replayed: no new trace, a hit per step.
    after = gen._decode.stats()
    assert after["misses"] == before["misses"]
    assert after["hits"] - before["hits"] >= 11


def test_greedy_prefill_uploads_only_token_ids(model, ref, monkeypatch):
    """A greedy prefill repeated with the same shapes uploads its prompt's token ids and
    nothing else: the chunk position, sampling values, padding offsets and the (unread)
    noise are device constants the Generator kept from the first call; a new prompt
    length adds its padding offsets once. Tokens match the reference, nothing retraced."""
    from pygpukit import creation

    gen = model.generator(1, 64)
    prompt = ref["prompt_a"].tolist()
    gen.generate([prompt], 4)  # traces, and uploads the constants once
    uploads: list[tuple[int, ...]] = []
    upload = creation._upload

    def counted(array, *args, **kwargs):
        uploads.append(tuple(array.shape))
        return upload(array, *args, **kwargs)

    monkeypatch.setattr(creation, "_upload", counted)
    misses = gen._prefill.stats()["misses"], gen._decode.stats()["misses"]
    res = gen.generate([prompt], 1)
    assert res.tokens[0] == ref["greedy_a"][:1].tolist()
    assert uploads == [(1, res.stats["bucket"])]
    del uploads[:]
    res = gen.generate([prompt], 4)
    assert res.tokens[0] == ref["greedy_a"][:4].tolist()
    assert uploads == [(1, res.stats["bucket"])] + [()] * 3  # then each decode position
    del uploads[:]
    res = gen.generate([[7] + prompt], 1)  # one more token: new padding offsets
    assert uploads == [(1,), (1, res.stats["bucket"])]
    assert (gen._prefill.stats()["misses"], gen._decode.stats()["misses"]) == misses


def test_text_generate_needs_tokenizer(model):
    with pytest.raises(gpk.GPUKitError, match="no tokenizer.json"):
        model.generate("hello")


def test_generate_counts_checked(model, ref):
    prompt = ref["prompt_a"].tolist()
    res = model.generate_ids([prompt, prompt], 0)  # as Hugging Face: no new tokens
    assert res.tokens == [[], []] and res.decode_steps == 0 and res.stats["bucket"] is None
    with pytest.raises(gpk.GPUKitError, match="no prompts") as e:
        model.generate_ids([], 4)
    assert isinstance(e.value, ValueError)
    for bad in (-1, 2.5, True):
        with pytest.raises(gpk.GPUKitError, match="max_new_tokens must be an integer >= 0"):
            model.generate_ids([prompt], bad)
    with pytest.raises(gpk.GPUKitError, match="max_seq_len must be an integer >= 1"):
        model.generate_ids([prompt], 2, max_seq_len=0)
    with pytest.raises(gpk.GPUKitError, match="max_new_tokens must be an integer >= 0"):
        model.generator(1, 64).generate([prompt], -2)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_bad_seed(seed):
    with pytest.raises(gpk.GPUKitError, match="seed must be None or an integer >= 0") as e:
        llm.SamplingParams(0.7, seed=seed)
    assert isinstance(e.value, ValueError)


def test_model_loaded_again_reuses_the_steps_traces(ref, monkeypatch):
    """A second load of the same checkpoint gives the same tokens and logits; its prefill
    and decode steps reuse the first model's traces and passes, bound to its own weights
    (the first model's weights freed, the second still generates the reference)."""
    from pygpukit.compile import function

    monkeypatch.setattr(function, "_SHARED", {})
    prompt = ref["prompt_a"].tolist()
    first = llm.load(FIXTURE, progress=False)
    second = llm.load(FIXTURE, progress=False)
    got = [m.generate_ids([prompt], 6, stop_at_eos=False).tokens[0] for m in (first, second)]
    assert got[0] == got[1] == ref["greedy_a"][:6].tolist()
    gens = [next(iter(m._generators.values())) for m in (first, second)]
    for step in ("_prefill", "_decode"):
        s1, s2 = (getattr(g, step).stats() for g in gens)
        assert s1["shared_hits"] == 0 and s2["shared_hits"] == 1, step
        assert [e["shared"] for e in s2["entries"]] == [True], step
    ids = gpk.asarray(np.array([prompt]))
    logits = []
    for m, g in zip((first, second), gens, strict=True):  # the caches the steps set up
        start = gpk.asarray(np.zeros(1, np.int64))
        mask = llm.model.chunk_mask(start, gpk.scalar(0), len(prompt), g.max_seq_len)
        logits.append(m.transformer(ids, mask, gpk.scalar(0)).to_numpy())
    np.testing.assert_array_equal(logits[0], logits[1])
    for w in {id(w): w for w in first.transformer.weights.values()}.values():
        w.free()
    again = second.generate_ids([prompt], 6, stop_at_eos=False).tokens[0]
    assert again == ref["greedy_a"][:6].tolist()
