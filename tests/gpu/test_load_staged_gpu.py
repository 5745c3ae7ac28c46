"""The model loader's staged bulk upload on a real GPU (transfers.upload_staged, the
transfer engine's htod_bulk through pinned buffers on several threads): every weight of a
sharded checkpoint, fused parts and device casts included, equals the safetensors
library's host assembly; sources closed as soon as the upload returns leave the device
data intact; concurrent loads take turns; a progress callback's error comes out after the
copies landed."""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import llm

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "llm")


@pytest.fixture
def stager(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A transfer engine whose bulk uploads cut small pieces (not a multiple of any
    element size: pieces split elements) on four threads, and every bulk load staged
    however small."""
    from pygpukit import _native, _rust
    from pygpukit.backends.cuda import backend, transfers

    eng = _rust.TransferEngine(bulk_threads=4, bulk_piece_bytes=4096 + 7)
    monkeypatch.setattr(transfers, "_engines", {int(_native.get_device()): eng})
    monkeypatch.setattr(backend, "STAGED_UPLOAD_BYTES", 0)
    return eng


def _addr(a: gpk.GPUArray) -> int:
    return int(a.__cuda_array_interface__["data"][0])


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_staged_load_equals_host_assembly(stager: Any, dtype: str | None) -> None:
    from safetensors.numpy import load_file

    d = os.path.join(FIXTURES, "mistral")
    host: dict[str, np.ndarray] = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            host.update(load_file(os.path.join(d, f)))
    model = llm.load(d, dtype=dtype, progress=False)
    stats = stager.stats()
    assert stats["bulk_bytes"] > 0 and stats["pinned_bytes"] > 0  # the staged path ran
    want_dtype = gpk.ir.dtypes.as_dtype(dtype or host["model.norm.weight"].dtype).np
    w = model.transformer.weights

    def same(key: str, *names: str) -> None:
        want = np.concatenate([host[n] for n in names]).astype(want_dtype)
        assert w[key].dtype.np == want_dtype and w[key].readonly
        np.testing.assert_array_equal(w[key].to_numpy(), want)

    same("embed", "model.embed_tokens.weight")
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}."
        same(f"{i}.wqkv", *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        same(f"{i}.wo", p + "self_attn.o_proj.weight")
        same(f"{i}.w_gate_up", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        same(f"{i}.w_down", p + "mlp.down_proj.weight")
        same(f"{i}.attn_norm", p + "input_layernorm.weight")
        same(f"{i}.mlp_norm", p + "post_attention_layernorm.weight")
    same("norm", "model.norm.weight")
    same("lm_head", "lm_head.weight")


def test_sources_closed_on_return_leave_the_data(stager: Any, tmp_path: Any) -> None:
    """Views of a memory map uploaded, then the map closed at once (BufferError if any
    view were still held) and its file overwritten: the device holds the old bytes."""
    from pygpukit.backends.cuda import transfers

    rng = np.random.default_rng()
    data = rng.integers(0, 256, 300_001, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    dst = gpk.empty((data.size,), "uint8")
    dst.realize()
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        whole = np.frombuffer(mm, np.uint8)
        cuts = [0, 1, 4103, 100_000, 100_003, 250_000, data.size]
        jobs = [(_addr(dst) + a, whole[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
        transfers.upload_staged(jobs, None)
        del jobs, whole
        mm.close()
    path.write_bytes(bytes(data.size))
    np.testing.assert_array_equal(dst.to_numpy(), data)


def test_concurrent_bulk_uploads_take_turns(stager: Any) -> None:
    """Two threads' bulk uploads share the pinned buffers one at a time, each reporting
    its own bytes."""
    from pygpukit.backends.cuda import transfers

    rng = np.random.default_rng()
    srcs = [rng.standard_normal(n).astype(np.float32) for n in (70_001, 5, 33_333, 9)]
    dsts = [gpk.empty((a.size,), "float32") for a in srcs]
    for d in dsts:
        d.realize()

    reported = [0, 0]

    def upload(k: int) -> None:
        def progress(n: int) -> None:
            reported[k] += n

        transfers.upload_staged([(_addr(dsts[i]), srcs[i]) for i in (k, k + 2)], None,
                                progress)  # fmt: skip

    ts = [threading.Thread(target=upload, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, d in zip(srcs, dsts, strict=True):
        np.testing.assert_array_equal(d.to_numpy(), a)
    assert reported == [srcs[0].nbytes + srcs[2].nbytes, srcs[1].nbytes + srcs[3].nbytes]


def test_a_progress_error_is_raised_once_the_upload_has_run(stager: Any) -> None:
    """An exception of the progress callback (a cancelled progress bar) comes out of the
    upload after its copies have landed, and the engine goes on."""
    from pygpukit.backends.cuda import transfers

    rng = np.random.default_rng()
    src = rng.standard_normal(50_000).astype(np.float32)
    dst = gpk.empty((src.size,), "float32")
    dst.realize()

    def progress(n: int) -> None:
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt, match="stop"):
        transfers.upload_staged([(_addr(dst), src)], None, progress)
    np.testing.assert_array_equal(dst.to_numpy(), src)
    again = rng.standard_normal(50_000).astype(np.float32)
    transfers.upload_staged([(_addr(dst), again)], None)
    np.testing.assert_array_equal(dst.to_numpy(), again)
