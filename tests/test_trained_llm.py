"""The trained byte-level Llama of the quant_accuracy report, against transformers.

Needs torch and transformers (skipped without them, as in CI): a few training steps of a
two-layer model on the CPU, its checkpoint read by gpk.llm.load, and the int8 row of the
report against transformers' own forward pass with the int8-rounded weights put in.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pygpukit import llm  # noqa: E402
from pygpukit.bench import quant_accuracy as qa  # noqa: E402
from pygpukit.bench import trained_llm  # noqa: E402

SMALL = {**trained_llm.CONFIG, "hidden_size": 128, "intermediate_size": 384,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
PROMPTS, LEN = 12, 24


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("trained"))
    stats = trained_llm.train(out, steps=12, batch=4, config=SMALL, device="cpu")
    return out, stats


def hf_last_logits(path, ids, int8=False):
    """float32 [P, V] from transformers; with int8 every linear weight but the embedding is
    replaced by its per-row symmetric int8 rounding (scale = max |w| / 127), in float64."""
    m = transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    if int8:
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight.detach().double().numpy()
                scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
                q = np.clip(np.rint(w / scale), -127, 127) * scale
                mod.weight.data = torch.from_numpy(q.astype(np.float32))
    with torch.no_grad():
        return m(torch.from_numpy(ids)).logits[:, -1].double().numpy()


def test_corpus_holds_out_whole_files():
    text, held = trained_llm.corpus(1 << 20)
    assert len(text) > 10 * len(held) > 0
    ids = trained_llm.spans(held, 5, 16, 3)
    assert ids.shape == (5, 16) and ids.dtype == np.int64
    assert bytes(ids[0].astype(np.uint8)) in held.tobytes()


def test_checkpoint_reads_as_transformers_computes(trained):
    path, stats = trained
    assert 0.0 < stats["heldout_bits_per_byte"] < 8.5 and 0.0 <= stats["heldout_top1"] <= 1.0
    ids = trained_llm.spans(trained_llm.corpus()[1], PROMPTS, LEN, 1)
    ours = qa.last_logits(llm.load(path, dtype="float32", progress=False), ids)
    ref = hf_last_logits(path, ids)
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4


def test_int8_row_against_transformers(trained):
    path, _ = trained
    rows = qa.run("trained", prompts=PROMPTS, prompt_len=LEN, formats=["int8"],
                  train_steps=12, trained_dir=path)  # fmt: skip
    assert [r["format"] for r in rows] == ["int8"] and rows[0]["model"] == "trained-byte-llama"
    ids = trained_llm.spans(trained_llm.corpus()[1], PROMPTS, LEN, 1)
    want = qa.compare(hf_last_logits(path, ids), hf_last_logits(path, ids, int8=True))
    assert np.isclose(rows[0]["logits_rel_err"], want["logits_rel_err"], rtol=1e-3)
    assert abs(rows[0]["top1_agreement"] - want["top1_agreement"]) <= 1 / PROMPTS
