"""The CUDA paged KV-cache kernels against the float64 reference, and the serving engine on
the GPU: batched greedy output equals each prompt alone (marker gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from attention_ref import paged_sdpa_ref

import pygpukit as gpk
from pygpukit import llm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("t", [1, 6])
def test_paged_attention_gpu(dtype, tol, t):
    rng = np.random.default_rng(3)
    nb, kv, bs, d, h, b = 40, 4, 16, 64, 32, 5
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    table = rng.permutation(nb)[: b * 8].reshape(b, 8).astype(np.int32)
    lens = np.array([128, 1, 37, 0, 3], np.int32)
    kg = gpk.asarray(kp).astype(dtype)
    vg = gpk.asarray(vp).astype(dtype)
    got = gpk.nn.paged_attention(gpk.asarray(q).astype(dtype), kg, vg, table, lens)
    got = got.astype("float32").to_numpy()
    qr = gpk.asarray(q).astype(dtype).astype("float32").to_numpy()
    ref = paged_sdpa_ref(
        qr, kg.astype("float32").to_numpy(), vg.astype("float32").to_numpy(), table, lens
    )
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("d, h, kv, t", [(64, 32, 4, 1), (128, 16, 2, 1), (64, 8, 8, 3)])
def test_paged_attention_split_kernel_gpu(dtype, tol, d, h, kv, t):
    """Long contexts through scattered blocks: one query per row splits the keys over many
    blocks and merges them (paged_decode.cuh); int64 lengths take the simple kernel and
    agree."""
    rng = np.random.default_rng(6)
    nb, bs, m, b = 300, 16, 48, 4
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    table = rng.permutation(nb)[: b * m].reshape(b, m).astype(np.int32)
    lens = np.array([m * bs, 700, 65, t], np.int32)
    kg = gpk.asarray(kp).astype(dtype)
    vg = gpk.asarray(vp).astype(dtype)
    qg = gpk.asarray(q).astype(dtype)
    got = gpk.nn.paged_attention(qg, kg, vg, table, lens).astype("float32").to_numpy()
    ref = paged_sdpa_ref(qg.astype("float32").to_numpy(), kg.astype("float32").to_numpy(),
                         vg.astype("float32").to_numpy(), table, lens)  # fmt: skip
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)
    simple = gpk.nn.paged_attention(qg, kg, vg, table, lens.astype(np.int64))
    np.testing.assert_allclose(simple.astype("float32").to_numpy(), ref, atol=tol, rtol=tol)


def test_paged_attention_bad_block_id_gpu():
    """A block id outside the pool is an IndexError, not a read outside it."""
    kp = gpk.asarray(np.ones((4, 2, 16, 64), np.float32))
    q = gpk.asarray(np.ones((1, 4, 1, 64), np.float32))
    table = np.array([[0, 9]], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, np.array([20], np.int32)).to_numpy()


@pytest.mark.parametrize(("d", "t"), [(8, 3), (6, 3), (64, 4000)],
                         ids=["rows-of-8", "rows-of-6", "8-a-thread"])  # fmt: skip
def test_paged_write_gpu(d, t):
    """Rows stored at their slots (one element a thread, or paged_plan.WRITE_VEC where D is
    a multiple and the store is large); a negative slot stores nothing, one past the pool
    is an IndexError."""
    from pygpukit.backends.cuda import toolchain
    from pygpukit.backends.cuda.kernels import paged_plan

    rng = np.random.default_rng(4)
    nb = t // 2 + 2
    pool_np = rng.standard_normal((nb, 2, 4, d)).astype(np.float32)
    pool = gpk.asarray(pool_np)
    new = rng.standard_normal((t, 2, d)).astype(np.float32)
    slots = rng.permutation(nb * 4)[:t].astype(np.int64)
    slots[t // 2] = -1
    wide = paged_plan.write_vec(t * 2 * d, d, toolchain.sm_count()) > 1
    assert wide == (t > 3)
    gpk.nn.paged_write(pool, new, slots)
    want = pool_np.copy()
    for i, slot in enumerate(slots):
        if slot >= 0:
            want[slot // 4, :, slot % 4] = new[i]
    np.testing.assert_array_equal(pool.to_numpy(), want)
    slots[-1] = nb * 4
    with pytest.raises(IndexError):
        gpk.nn.paged_write(pool, new, slots)
        pool.to_numpy()


def test_engine_batched_equals_alone_gpu():
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine

    model = llm.load(write_tiny_model(), dtype="float32")
    e = Engine(model, max_model_len=256, prefill_chunk=64, kv_blocks=400).start()
    try:
        rng = np.random.default_rng(5)
        prompts = [[int(x) for x in rng.integers(3, 300, size=int(rng.integers(4, 100)))]
                   for _ in range(24)]  # fmt: skip
        batched = e.generate(prompts, 12, ignore_eos=True, timeout=600)
        alone = [e.generate([p], 12, ignore_eos=True, timeout=600)[0] for p in prompts[:6]]
        assert batched[:6] == alone
        assert e.stats()["used_blocks"] == 0
    finally:
        e.close()


def test_engine_prefix_cache_gpu():
    """Prefix caching on the GPU: a repeated prompt and a chat-like continuation reuse
    cached blocks (shared between sequences, first blocks their own) and stream what an
    engine without the cache streams."""
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine

    model = llm.load(write_tiny_model(), dtype="float32")
    rng = np.random.default_rng(6)
    head = [int(x) for x in rng.integers(3, 300, size=90)]
    prompts = [head, [*head, *(int(x) for x in rng.integers(3, 300, size=30))], head]
    outs = []
    for caching in (True, False):
        e = Engine(model, max_model_len=256, kv_blocks=100, prefix_caching=caching).start()
        try:
            outs.append([e.generate([p], 10, ignore_eos=True, timeout=600)[0] for p in prompts])
            st = e.stats()
            assert (st["prefix_hit_tokens"] > 0) == caching and st["used_blocks"] == 0
        finally:
            e.close()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 3e-2), ("float16", 5e-3)])
@pytest.mark.parametrize("one_pool", [False, True])
def test_paged_attention_shared_prefix_blocks_gpu(dtype, tol, one_pool):
    """Prefix caching's block tables: sequences whose blocks 1-5 are the same pool blocks
    (each first block its own) as adjacent decode rows, as a prompt piece after the shared
    prefix, and as a first-block piece -- every row against the float64 reference."""
    rng = np.random.default_rng(12)
    nb, bs, m = 600, 16, 24
    ids = iter(rng.permutation(nb).tolist())
    shared = [next(ids) for _ in range(5)]

    def table():
        return [next(ids), *shared, *(next(ids) for _ in range(m - 6))]

    tables, lens = [], []
    for _ in range(6):
        tables.append(table())
        lens.append(int(rng.integers(97, 200)))
    for rows, start in ((64, 96), (16, 0)):
        t = table()
        for i in range(rows):
            tables.append(t)
            lens.append(start + i + 1)
    _check_step(dtype, 64, 32, 4, np.array(tables, np.int32), np.array(lens, np.int32), nb,
                bs, tol, rng, one_pool=one_pool)  # fmt: skip


def test_gpu_marks_time_each_engine_step_gpu():
    """serve_load's GpuMarks: a CUDA event pair around each engine launch, placed on the
    host's clock; one pair per step of the engine's timeline, in order, none before the
    round, and the engine's own launch back in place afterwards."""
    import time

    from pygpukit.bench.serve_load import GpuMarks
    from pygpukit.llm.tiny import write_tiny_model
    from pygpukit.serve import Engine

    model = llm.load(write_tiny_model(), dtype="float32")
    e = Engine(model, max_model_len=256, prefill_chunk=64, kv_blocks=400).start()
    try:
        marks = GpuMarks(e)
        since = time.perf_counter()
        rng = np.random.default_rng(6)
        prompts = [[int(x) for x in rng.integers(3, 300, size=40)] for _ in range(4)]
        e.generate(prompts, 8, ignore_eos=True, timeout=600)
        gpu = marks.close()
        steps = e.timeline(since)["steps"]
        assert len(gpu) == len(steps) > 0
        assert all(since <= a <= b for a, b in gpu)
        assert all(b[0] >= a[0] for a, b in zip(gpu, gpu[1:], strict=False))
        assert "_launch" not in vars(e)
    finally:
        e.close()


def _step_rows(rng, n_decode, pieces, n_pad, bs, m, nb):
    """A serving step's rows (decode rows, then prompt pieces, then padding) as block
    tables and lengths: each sequence owns m random blocks; a piece of c tokens after a
    prefix of p0 is c consecutive rows of its table with lengths p0 + 1 .. p0 + c."""
    blocks = iter(rng.permutation(nb))
    tables, lens = [], []
    for _ in range(n_decode):
        tables.append([next(blocks) for _ in range(m)])
        lens.append(int(rng.integers(1, m * bs + 1)))
    for p0, c in pieces:
        own = [next(blocks) for _ in range(m)]
        for i in range(c):
            tables.append(own)
            lens.append(p0 + i + 1)
    for _ in range(n_pad):
        tables.append(tables[0])  # the engine's padding reads row 0's table
        lens.append(0)
    return np.array(tables, np.int32), np.array(lens, np.int32)


def _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng, nan_at=None, one_pool=False,
                pieces=True, decode_rows=None):  # fmt: skip
    """The step's attention against the float64 reference; one_pool: keys and values as
    the two halves of one pool [nb, 2 kv, bs, d] (the serving model's cache); pieces and
    decode_rows: paged_attention's (pieces False: the decode kernel alone takes every
    row)."""
    b = len(lens)
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    if nan_at is not None:
        vp[nan_at] = np.nan
    q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
    if one_pool:
        both = gpk.asarray(np.concatenate([kp, vp], axis=1)).astype(dtype)
        kg, vg = both[:, :kv], both[:, kv:]
        qg = gpk.asarray(q).astype(dtype)
    else:
        kg, vg, qg = (gpk.asarray(x).astype(dtype) for x in (kp, vp, q))
    got = gpk.nn.paged_attention(qg, kg, vg, table, lens, pieces=pieces, decode_rows=decode_rows)
    got = got.astype("float32").to_numpy()
    with np.errstate(invalid="ignore"):
        ref = paged_sdpa_ref(qg.astype("float32").to_numpy(), kg.astype("float32").to_numpy(),
                             vg.astype("float32").to_numpy(), table, lens)  # fmt: skip
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)
    return got, ref


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d, h, kv", [(64, 32, 4), (128, 16, 2), (64, 8, 8)])
def test_paged_attention_prompt_pieces_gpu(dtype, d, h, kv):
    """A mixed serving step: decode rows, prompt pieces (tensor-core kernel, paged_prefill
    .cuh) of lengths off the 64-row tile, starting mid-block and crossing blocks, one piece
    ending in the same tile the next starts, a one-token piece, padding rows -- every row
    against the float64 reference."""
    rng = np.random.default_rng(11)
    nb, bs, m = 1100, 16, 24
    pieces = [(0, 77), (13, 50), (200, 1), (5, 130), (300, 2), (100, 64)]
    table, lens = _step_rows(rng, 37, pieces, 19, bs, m, nb)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_paged_attention_pieces_only_and_shared_prefixes_gpu(dtype):
    """Rows of pieces only (no decode row, no padding), and rows whose tables agree only on
    the blocks both see (a forked sequence: the shorter row joins the longer one's tiles)
    or not even there, in any order of lengths."""
    rng = np.random.default_rng(12)
    nb, bs, m, d, h, kv = 300, 16, 20, 64, 8, 2
    table, lens = _step_rows(rng, 0, [(3, 100), (64, 64), (0, 29)], 0, bs, m, nb)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng)
    base = rng.permutation(nb)[:m]
    fork = base.copy()
    fork[2:] = rng.permutation(np.setdiff1d(np.arange(nb), base))[: m - 2]
    table = np.array([base, fork, base, base, fork, base], np.int32)
    lens = np.array([300, 30, 7, 250, 32, 251], np.int32)
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng)


def test_paged_attention_piece_hides_nan_it_does_not_see_gpu():
    """A NaN value at a key some rows of a piece see and others do not: the rows before it
    stay exact (the masked tile's scalar P V selects their keys), the rows after it are
    NaN as the reference."""
    rng = np.random.default_rng(13)
    nb, bs, m, d, h, kv = 100, 16, 8, 64, 8, 2
    table, lens = _step_rows(rng, 3, [(20, 90)], 2, bs, m, nb)
    key = 20 + 40  # seen by the piece's rows of length > 60
    row = 3 + 40
    blk = int(table[row, key // bs])
    got, ref = _check_step("bfloat16", d, h, kv, table, lens, nb, bs, 3e-2, rng,
                           nan_at=(blk, slice(None), key % bs))  # fmt: skip
    assert np.isfinite(got[:row]).all() and np.isnan(got[row : 3 + 90]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("decode_rows", [1, 20, 64, 1000])
def test_paged_attention_decode_rows_hint_gpu(dtype, decode_rows):
    """The decode kernel launched over decode_rows block rows, each taking every
    decode_rows-th row (fewer than the step's 37 decode rows, one-token pieces and 19
    padding rows too: those rows wait their turn in a block), every row against the
    float64 reference."""
    rng = np.random.default_rng(14)
    nb, bs, m = 1100, 16, 24
    pieces = [(0, 77), (13, 50), (200, 1), (5, 130), (300, 2), (100, 64), (40, 1)]
    table, lens = _step_rows(rng, 37, pieces, 19, bs, m, nb)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, 64, 32, 4, table, lens, nb, bs, tol, rng, one_pool=True,
                decode_rows=decode_rows)  # fmt: skip


def test_paged_attention_decode_rows_hint_bad_length_gpu():
    """With the hint, a bad length in a row no block attends (a piece's, past its table)
    is still an IndexError."""
    kp = gpk.asarray(np.ones((4, 2, 16, 64), np.float32)).astype("bfloat16")
    q = gpk.asarray(np.ones((4, 8, 1, 64), np.float32)).astype("bfloat16")
    table = np.array([[3, 2], [0, 1], [0, 1], [0, 1]], np.int32)
    lens = np.array([5, 20, 21, 33], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, lens, decode_rows=1).to_numpy()


def test_paged_attention_piece_bad_block_id_gpu():
    """A piece's block id outside the pool is an IndexError from the piece kernel too."""
    kp = gpk.asarray(np.ones((4, 2, 16, 64), np.float32)).astype("bfloat16")
    q = gpk.asarray(np.ones((3, 4, 1, 64), np.float32)).astype("bfloat16")
    table = np.array([[0, 9], [0, 9], [1, 2]], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, np.array([20, 21, 3], np.int32)).to_numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "d, h, kv, n_decode, pieces, n_pad",
    [
        (64, 32, 4, 70, [(5, 40)], 3),  # the TinyLlama shape: one split a row
        (64, 32, 4, 3, [], 0),  # few rows: the keys split over blocks, merged
        (128, 16, 4, 66, [], 2),  # groups of 4, one stage per warp (256+ blocks)
        (64, 8, 8, 5, [], 0),  # groups of 1 (no GQA)
        (128, 32, 2, 40, [(0, 3)], 1),  # groups of 16: two 8-head column blocks
        (64, 8, 2, 2, [(3, 2)], 1),  # split rows beside a piece and padding
    ],
)
def test_paged_decode_rows_tensor_core_gpu(dtype, d, h, kv, n_decode, pieces, n_pad):
    """The decode rows of a serving step on the tensor-core body (pgk_paged_decode_mma:
    the group's query heads as MMA columns, keys through the block table), against the
    float64 reference: GQA groups of 8, 4, 1 and 16, head dims 64 and 128, lengths off the
    32-key tile and the 16-key block, one split a row and several merged, beside prompt
    pieces and padding rows."""
    rng = np.random.default_rng(21)
    nb, bs, m = 2000, 16, 24
    table, lens = _step_rows(rng, n_decode, pieces, n_pad, bs, m, nb)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("one_pool, pieces", [(False, True), (True, True), (True, False)])
def test_paged_decode_rows_batch64_three_stages_gpu(dtype, one_pool, pieces):
    """The batch-64 TinyLlama decode step's attention (64 rows x 4 kv heads: one split,
    three cp.async stages a warp, five 32-key tiles for the busiest warp), rows of
    lengths 1 .. 640 off the tile and block, against the float64 reference; pieces False
    (the engine's decode-only step: no piece kernel) the same, with padding rows."""
    rng = np.random.default_rng(24)
    nb, bs, m, d, h, kv = 2600, 16, 40, 64, 32, 4
    table, lens = _step_rows(rng, 64 if pieces else 61, [], 0 if pieces else 3, bs, m, nb)
    lens[:5] = [m * bs, 1, 513, 32, 129]
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng, one_pool=one_pool,
                pieces=pieces)  # fmt: skip


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_paged_attention_without_pieces_takes_piece_rows_too_gpu(dtype):
    """pieces=False only skips the piece kernel: the decode kernel then attends a prompt
    piece's rows as rows of their own, with the same result (float64 reference)."""
    rng = np.random.default_rng(25)
    nb, bs, m = 1100, 16, 24
    table, lens = _step_rows(rng, 9, [(0, 70), (13, 5)], 2, bs, m, nb)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    _check_step(dtype, 64, 32, 4, table, lens, nb, bs, tol, rng, one_pool=True, pieces=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n_rows", [6, 60])
def test_paged_decode_rows_hide_nan_they_do_not_see_gpu(dtype, n_rows):
    """NaN in every key and value a decode row does not see -- its own blocks past its
    length (the rest of its last block too) and every block no row holds -- leaves each
    row exact, with several splits a row (6 rows) and one (60 rows)."""
    rng = np.random.default_rng(22)
    nb, bs, m, d, h, kv = 1500, 16, 24, 64, 32, 4
    table, _ = _step_rows(rng, n_rows, [], 0, bs, m, nb)
    lens = rng.integers(1, m * bs, size=n_rows).astype(np.int32)
    lens[:6] = [37, 1, 100, 383, 250, 77]
    kp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    vp = rng.standard_normal((nb, kv, bs, d)).astype(np.float32)
    seen = np.zeros((nb, bs), bool)
    for r in range(n_rows):
        for p in range(int(lens[r])):
            seen[table[r, p // bs], p % bs] = True
    blk, slot = np.nonzero(~seen)
    kp[blk, :, slot], vp[blk, :, slot] = np.nan, np.nan
    q = rng.standard_normal((n_rows, h, 1, d)).astype(np.float32)
    kg, vg, qg = (gpk.asarray(x).astype(dtype) for x in (kp, vp, q))
    got = gpk.nn.paged_attention(qg, kg, vg, table, lens).astype("float32").to_numpy()
    ref = paged_sdpa_ref(qg.astype("float32").to_numpy(), kg.astype("float32").to_numpy(),
                         vg.astype("float32").to_numpy(), table, lens)  # fmt: skip
    assert np.isfinite(got).all()
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_paged_decode_rows_bad_block_id_and_length_gpu(dtype):
    """A decode row's block id outside the pool, or a length past its table, is an
    IndexError from the tensor-core body, not a read outside the pool."""
    kp = gpk.asarray(np.ones((4, 2, 16, 64), np.float32)).astype(dtype)
    q = gpk.asarray(np.ones((2, 8, 1, 64), np.float32)).astype(dtype)
    table = np.array([[0, 9], [1, 2]], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, np.array([20, 5], np.int32)).to_numpy()
    table = np.array([[0, 3], [1, 2]], np.int32)
    with pytest.raises(IndexError):
        gpk.nn.paged_attention(q, kp, kp, table, np.array([20, 33], np.int32)).to_numpy()


@pytest.mark.parametrize(
    "dtype, n_decode, pieces, n_pad",
    [
        ("bfloat16", 70, [(5, 40)], 3),  # TinyLlama's step: one split, a piece, padding
        ("float16", 3, [(0, 9)], 0),  # few rows: splits merged
        ("float32", 6, [], 1),  # the CUDA-core body
    ],
)
def test_paged_attention_one_pool_gpu(dtype, n_decode, pieces, n_pad):
    """Keys and values as the halves of one pool (the serving model's cache: blocks 2 KV
    block D elements apart) through the decode bodies, the piece kernel and (int64
    lengths) the simple kernel, against the float64 reference."""
    rng = np.random.default_rng(23)
    nb, bs, m, d, h, kv = 2000, 16, 24, 64, 32, 4
    table, lens = _step_rows(rng, n_decode, pieces, n_pad, bs, m, nb)
    tol = {"bfloat16": 3e-2, "float16": 5e-3, "float32": 1e-4}[dtype]
    _check_step(dtype, d, h, kv, table, lens, nb, bs, tol, rng, one_pool=True)
    _check_step(dtype, d, h, kv, table, lens.astype(np.int64), nb, bs, tol, rng,
                one_pool=True)  # fmt: skip


def _rotated(x, cos, sin, dtype, interleaved):
    """float64 RoPE of x [rows, heads, D] by each row's tables, the tables rounded to dtype
    first (as the kernels read them); interleaved pairs or the halves of D."""
    c = gpk.asarray(cos).astype(dtype).astype("float32").to_numpy()[:, None, :]
    sn = gpk.asarray(sin).astype(dtype).astype("float32").to_numpy()[:, None, :]
    if interleaved:
        rot = np.empty_like(x)
        rot[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * sn
        rot[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * sn
        return rot
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], axis=-1)


@pytest.mark.parametrize("t", [70, 1100], ids=["decode", "mixed"])
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 1e-2)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_paged_write_rope_gpu(dtype, tol, interleaved, t):
    """One store of a step's keys (rotated by each row's tables) and values into one pool:
    the first KV heads rotated, the rest as they are, against float64; negative slots
    store nothing. 1100 rows: several elements a thread (paged_plan.write_vec)."""
    rng = np.random.default_rng(24)
    nb, kv, bs, d = 80, 4, 16, 64
    pool_np = rng.standard_normal((nb, 2 * kv, bs, d)).astype(np.float32)
    new = rng.standard_normal((t, 2 * kv, d)).astype(np.float32)
    ang = rng.uniform(0, 6.3, size=(t, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    slots[[3, 40]] = -1
    pool = gpk.asarray(pool_np).astype(dtype)
    start = pool.astype("float32").to_numpy().astype(np.float64)
    new_g = gpk.asarray(new).astype(dtype)
    gpk.nn.paged_write(pool, new_g, slots, cos=cos, sin=sin, rope_heads=kv,
                       interleaved=interleaved)  # fmt: skip
    got = pool.astype("float32").to_numpy()
    x = new_g.astype("float32").to_numpy().astype(np.float64)
    x[:, :kv] = _rotated(x[:, :kv], cos, sin, dtype, interleaved)
    want = start.copy()
    for i, slot in enumerate(slots):
        if slot >= 0:
            want[slot // bs, :, slot % bs] = x[i]
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "dtype, d, h, kv, pieces, interleaved",
    [
        ("bfloat16", 64, 32, 4, True, False),  # TinyLlama's step: both kernels rotate q
        ("bfloat16", 64, 32, 4, False, False),  # a decode-only step: the decode kernel alone
        ("float16", 128, 16, 2, True, False),
        ("bfloat16", 64, 32, 4, True, True),  # interleaved: the rope kernel first
        ("float32", 64, 8, 8, True, False),  # the CUDA-core body: the rope kernel first
    ],
)
def test_paged_attention_rotates_q_gpu(dtype, d, h, kv, pieces, interleaved):
    """paged_attention with each row's rope tables, q read from the serving step's QKV rows
    [B, H + 2 KV, D] (a strided view): decode rows, prompt pieces and padding against the
    float64 attention of q rotated in float64, and against the rope op followed by the
    attention (the path the serving step took before)."""
    rng = np.random.default_rng(25)
    nb, bs, m = 1200, 16, 24
    table, lens = _step_rows(rng, 40, [(5, 40), (0, 9), (30, 1)], 7, bs, m, nb)
    b = len(lens)
    both = rng.standard_normal((nb, 2 * kv, bs, d)).astype(np.float32)
    pool = gpk.asarray(both).astype(dtype)
    kg, vg = pool[:, :kv], pool[:, kv:]
    rows = gpk.asarray(rng.standard_normal((b, h + 2 * kv, d)).astype(np.float32)).astype(dtype)
    q = rows[:, :h].reshape(b, h, 1, d)
    ang = rng.uniform(0, 6.3, size=(b, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    got = gpk.nn.paged_attention(q, kg, vg, table, lens, pieces=pieces, cos=cos, sin=sin,
                                 interleaved=interleaved).astype("float32").to_numpy()  # fmt: skip
    cg, sg = (gpk.asarray(t).astype(dtype) for t in (cos, sin))
    q_rot = gpk.nn.rope(q.swapaxes(0, 2), cg, sg, interleaved=interleaved).swapaxes(0, 2)
    before = gpk.nn.paged_attention(q_rot, kg, vg, table, lens, pieces=pieces)
    before = before.astype("float32").to_numpy()
    x = q.astype("float32").to_numpy().astype(np.float64)[:, :, 0]  # [B, H, D]
    rot = _rotated(x, cos, sin, dtype, interleaved)
    pool64 = pool.astype("float32").to_numpy().astype(np.float64)
    ref = paged_sdpa_ref(rot[:, :, None], pool64[:, :kv], pool64[:, kv:], table, lens)
    tol = {"bfloat16": 3e-2, "float16": 5e-3, "float32": 1e-4}[dtype]
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)
    np.testing.assert_allclose(got, before, atol=tol, rtol=tol)
    print(f"rotated in the attention vs rope op first: max diff {np.abs(got - before).max()}")


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 3e-2), ("float16", 5e-3)])
@pytest.mark.parametrize("case", ["batch16", "batch64", "split", "slot-off", "int64-slots"])
def test_paged_append_decode_step_gpu(monkeypatch, dtype, tol, case):
    """fuse_paged_append on the GPU: the tensor-core decode kernel stores each row's new
    key (rotated) and value and attends (paged_decode.attend's append), against float64:
    a 16-row step with padding rows, one long row (split keys), a row whose slot is an
    earlier key of its own (the tile holding it patched from the block's copy), and int64
    slots (the serving engine's); 64 rows (past paged_plan.APPEND_MAX_ROWS) store first,
    then attend."""
    from paged_append_case import AppendStep

    from pygpukit.backends.cuda.kernels import paged_decode

    seen = []
    attend = paged_decode.attend

    def spy(*a, **kw):  # the fused launch, not paged_write then paged_sdpa
        seen.append(kw.get("append") is not None)
        return attend(*a, **kw)

    monkeypatch.setattr(paged_decode, "attend", spy)
    rng = np.random.default_rng(21)
    if case.startswith("batch"):
        b = int(case[5:])
        lens = [int(x) for x in rng.integers(1, 512, b - 3)] + [0] * 3
        step = AppendStep(rng, dtype, h=32, kv=4, d=64, bs=16, m=32, nb=b * 32 + 8, lens=lens)
    elif case == "split":
        step = AppendStep(rng, dtype, h=16, kv=2, d=128, bs=16, m=48, nb=60, lens=[700])
    else:
        step = AppendStep(rng, dtype, h=8, kv=2, d=64, bs=16, m=8, nb=40, lens=[90, 33])
        if case == "int64-slots":
            step.slots = step.slots.astype(np.int64)
        else:
            step.slots[0] = int(step.table[0, 2]) * 16 + 5  # row 0's key 37, not 89
    out = step.run()
    ref, pool = step.reference()
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)
    got = step.pool.astype("float32").to_numpy()
    np.testing.assert_allclose(got, pool, atol=tol, rtol=tol)
    assert "paged_sdpa_append" in step.program_ops() and seen
    assert all(seen) == (case != "batch64")


def test_paged_append_early_stages_replayed_gpu(monkeypatch):
    """The fused decode kernel of a captured step fills its first stages before its
    programmatic-launch wait, over the lengths and table entries as read then (a guess,
    checked after the wait: paged_decode.attend's kv_early). Here the lengths (a cast) and
    the table rows (gathered) are made inside the graph and change from call to call, so
    the guess may be the last call's; each call against float64, the pool carried over."""
    from types import SimpleNamespace

    from paged_append_case import NP, AppendStep

    from pygpukit.backends.cuda.kernels import paged_decode

    early = []
    attend = paged_decode.attend

    def spy(*a, **kw):  # the fused launch, and whether it filled its stages early
        early.append(bool(kw.get("kv_early")))
        return attend(*a, **kw)

    monkeypatch.setattr(paged_decode, "attend", spy)
    rng = np.random.default_rng(33)
    dtype, tol = "bfloat16", 3e-2
    h, kv, d, bs, m, b = 32, 4, 64, 16, 24, 12
    nb = 2 * b * m + 8
    ref = SimpleNamespace(dtype=dtype, kv=kv)
    ref.pool_np = rng.standard_normal((nb, 2 * kv, bs, d)).astype(NP[dtype])
    pool = gpk.from_numpy(ref.pool_np.copy())
    tables = rng.permutation(nb)[: 2 * b * m].reshape(2 * b, m).astype(np.int32)

    def step(q, new, slots, tables, pick, lens64, cos, sin):
        table = gpk.take(tables, pick, axis=0)
        lens = lens64.astype(gpk.int32)
        gpk.nn.paged_write(pool, new, slots, cos=cos, sin=sin, rope_heads=kv)
        return gpk.nn.paged_attention(q, pool[:, :kv], pool[:, kv:], table, lens,
                                      pieces=False, cos=cos, sin=sin)  # fmt: skip

    fn = gpk.compile(step)
    for call in range(5):
        pick = rng.permutation(2 * b)[:b].astype(np.int64)
        ref.table = tables[pick]
        lens = rng.integers(1, m * bs, b)
        lens[rng.integers(0, b)] = 0  # a padding row: no keys, no store
        ref.lens = lens.astype(np.int32)
        ref.slots = np.array([int(ref.table[r, (n - 1) // bs]) * bs + (n - 1) % bs if n else -1
                              for r, n in enumerate(lens)], np.int64)  # fmt: skip
        ref.q = rng.standard_normal((b, h, 1, d)).astype(NP[dtype])
        ref.new = rng.standard_normal((b, 2 * kv, d)).astype(NP[dtype])
        ang = rng.uniform(0, 6.3, (b, d // 2))
        ref.cos, ref.sin = np.cos(ang).astype(NP[dtype]), np.sin(ang).astype(NP[dtype])
        args = [gpk.from_numpy(a) for a in (ref.q, ref.new, ref.slots, tables, pick,
                                            lens.astype(np.int64), ref.cos, ref.sin)]  # fmt: skip
        out = fn(*args).astype("float32").to_numpy().astype(np.float64)
        want, pool_want = AppendStep.reference(ref)
        np.testing.assert_allclose(out, want, atol=tol, rtol=tol, err_msg=f"call {call}")
        got = pool.astype("float32").to_numpy()
        np.testing.assert_allclose(got, pool_want, atol=tol, rtol=tol, err_msg=f"call {call}")
        ref.pool_np = pool_want.astype(NP[dtype])
    entry = list(fn._cache.values())[-1]
    assert "paged_sdpa_append" in [n.op for n in entry.program.schedule.graph.nodes]
    assert any(early)  # captured calls took the early build
