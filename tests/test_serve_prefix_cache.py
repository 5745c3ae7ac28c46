"""Prefix caching: block names, the cache's holders and eviction, and the engine reusing
cached blocks, every output against the model's static path (each prompt alone)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pygpukit import errors, llm
from pygpukit.serve import Engine, Request
from pygpukit.serve.blocks import BlockAllocator
from pygpukit.serve.prefix_cache import PrefixCache, block_names

BS = 16  # the engine's default block size


@pytest.fixture(scope="module")
def model():
    from pygpukit.llm.tiny import write_tiny_model

    return llm.load(write_tiny_model())


def _tokens(n, seed):
    return [int(x) for x in np.random.default_rng(seed).integers(3, 300, size=n)]


def _alone(model, prompt, n):
    return model.generate_ids([prompt], n, stop_at_eos=False).tokens[0]


def test_block_names_name_whole_prefixes():
    a = _tokens(50, 1)
    b = [*a[:32], *_tokens(18, 2)]  # the same two first blocks, then other tokens
    c = [a[0] + 1, *a[1:]]  # one token of the first block differs
    na, nb, nc = (block_names(x, BS) for x in (a, b, c))
    assert len(na) == 3 and len(nb) == 3  # full blocks only (50 // 16)
    assert na[:2] == nb[:2] and na[2] != nb[2]
    assert all(x != y for x, y in zip(na, nc, strict=True))  # a name covers every token before
    assert block_names(a[:16], BS) == na[:1] and block_names(a[:15], BS) == []
    # Continuing a chain from a block's name gives the names of the longer sequence.
    assert block_names(a[32:48], BS, na[1]) == na[2:3]


def test_cache_holders_idle_blocks_and_eviction():
    cache = PrefixCache(BlockAllocator(6))
    a = cache.allocate(3)
    names = block_names(_tokens(48, 3), BS)
    for blk, name in zip(a, names, strict=True):
        cache.name(blk, name)
    cache.name(a[0], names[1])  # a name already cached keeps its block
    assert cache.match([names[1]]) == [a[1]]
    cache.release([a[1]])
    assert cache.used == 3 and cache.cached == 3
    cache.release(a)  # tail first into the idle order
    assert cache.used == 0 and cache.free == 6 and cache.idle == 3
    assert cache.match(names[:2] + [b"unknown"]) == a[:2]  # held again: not evictable
    assert cache.idle == 1 and cache.free == 4
    got = cache.allocate(4)  # three free blocks, then the idle one (a[2]) evicted
    assert sorted(got) == sorted({0, 1, 2, 3, 4, 5} - set(a[:2]))
    assert cache.cached == 2 and cache.match([names[2]]) == []
    with pytest.raises(errors.OutOfMemoryError, match="KV cache"):
        cache.allocate(1)
    assert cache.free == 0  # the failed call took nothing
    cache.release([*a[:2], *got])
    assert cache.free == 6 and cache.idle == 2
    with pytest.raises(errors.GPUKitError, match="released more than it was held"):
        cache.release([got[0]])


def test_a_repeated_prompt_reuses_its_blocks(model):
    """The second run of a 100-token prompt finds blocks 0-5 cached: block 0 is computed
    again into its own block, blocks 1-5 (80 tokens) are shared, and the prefill is the
    first block and the last 4 tokens; the tokens equal the prompt generated alone."""
    e = Engine(model, max_model_len=256, kv_blocks=64).start()
    try:
        prompt = _tokens(100, 4)
        want = _alone(model, prompt, 6)
        assert e.generate([prompt], 6, ignore_eos=True, timeout=300) == [want]
        st = e.stats()
        assert st["prefill_tokens"] == 100 and st["prefix_hit_tokens"] == 0
        assert st["used_blocks"] == 0 and st["cached_blocks"] == 6  # the prompt's + 0 of 5 new
        assert e.generate([prompt], 6, ignore_eos=True, timeout=300) == [want]
        st2 = e.stats()
        assert st2["prefix_hit_tokens"] == 80
        assert st2["prefill_tokens"] - st["prefill_tokens"] == 20
        assert st2["used_blocks"] == 0 and st2["free_blocks"] == e.num_blocks
    finally:
        e.close()


def test_a_chat_turn_reuses_the_reply_blocks(model):
    """A next turn sends the conversation back (prompt, reply, new tokens): the blocks of
    the reply's fed tokens are cached too."""
    e = Engine(model, max_model_len=256, kv_blocks=64).start()
    try:
        first = _tokens(40, 5)
        (reply,) = e.generate([first], 30, ignore_eos=True, timeout=300)
        turn = [*first, *reply, *_tokens(12, 6)]
        assert e.generate([turn], 5, ignore_eos=True, timeout=300) == [_alone(model, turn, 5)]
        # 40 + 29 fed tokens fill 4 blocks; blocks 1-3 are shared.
        assert e.stats()["prefix_hit_tokens"] == 48
    finally:
        e.close()


def test_a_running_sequence_shares_its_prompt_blocks(model):
    """A prompt arriving while another with the same first 64 tokens still decodes shares
    its named blocks (held by both), and both streams equal their prompts alone."""
    e = Engine(model, max_model_len=256, kv_blocks=64).start()
    try:
        head = _tokens(64, 7)
        a, b = [*head, *_tokens(20, 8)], [*head, *_tokens(9, 9)]
        outs: dict[str, list[int]] = {"a": [], "b": []}
        done = {k: threading.Event() for k in outs}
        first = threading.Event()

        def sink(k):
            def f(ev):
                if ev.kind == "token":
                    outs[k].append(ev.token)
                    first.set()
                else:
                    done[k].set()

            return f

        e.submit(Request(a, 40, sink("a")))
        assert first.wait(300)
        e.submit(Request(b, 6, sink("b")))
        assert done["b"].wait(300) and done["a"].wait(300)
        assert outs["a"] == _alone(model, a, 40) and outs["b"] == _alone(model, b, 6)
        assert e.stats()["prefix_hit_tokens"] == 48  # blocks 1-3 of the shared 64 tokens
        assert e.stats()["used_blocks"] == 0
    finally:
        e.close()


def test_a_burst_with_one_system_prompt_computes_it_once(model):
    """Prompts that arrive together and start with the same 64 tokens: the first computes
    them; the others prefill their first block in the same step, then take its blocks
    1-3 (stored earlier in that launch) and jump past them."""
    e = Engine(model, max_model_len=256, kv_blocks=64).start()
    try:
        head = _tokens(64, 13)
        prompts = [[*head, *_tokens(10 + 7 * i, 14 + i)] for i in range(3)]
        outs = e.generate(prompts, 5, ignore_eos=True, timeout=300)
        assert outs == [_alone(model, p, 5) for p in prompts]
        st = e.stats()
        assert st["prefix_hit_tokens"] == 2 * 48
        assert st["prefill_tokens"] == sum(map(len, prompts)) - 2 * 48
        assert st["used_blocks"] == 0 and not e._coming
    finally:
        e.close()


def test_cached_blocks_are_evicted_for_new_requests(model):
    """A pool that holds one long sequence: a second prompt evicts the first's idle cached
    blocks, and the first prompt then runs again from scratch, right."""
    e = Engine(model, max_model_len=128, kv_blocks=8).start()
    try:
        p, q = _tokens(100, 10), _tokens(100, 11)
        for prompt in (p, q, p):
            assert e.generate([prompt], 8, ignore_eos=True, timeout=300) == [
                _alone(model, prompt, 8)]  # fmt: skip
        st = e.stats()
        assert st["prefix_hit_tokens"] == 0 and st["prefill_tokens"] == 300
        assert st["used_blocks"] == 0 and st["free_blocks"] == 8 and st["cached_blocks"] <= 8
    finally:
        e.close()


def test_prefix_caching_off(model):
    e = Engine(model, max_model_len=256, kv_blocks=64, prefix_caching=False).start()
    try:
        prompt = _tokens(100, 12)
        for _ in range(2):
            assert e.generate([prompt], 4, ignore_eos=True, timeout=300) == [
                _alone(model, prompt, 4)]  # fmt: skip
        st = e.stats()
        assert st["prefix_hit_tokens"] == 0 and st["cached_blocks"] == 0
        assert st["prefill_tokens"] == 200 and not st["prefix_caching"]
    finally:
        e.close()


def test_serve_takes_no_prefix_caching():
    from pygpukit.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["serve", "tiny"]).prefix_caching is True
    assert parse(["serve", "tiny", "--no-prefix-caching"]).prefix_caching is False
