"""Pre-quantized checkpoints written per spec (tests/quant_fixtures.py) loaded by gpk.llm
and by transformers' own integrations, where this machine has them: logits must agree.

transformers needs a package of its own for most formats (compressed-tensors, gptqmodel
or autoawq for AWQ/GPTQ; accelerate and triton for fine-grained fp8); a format whose
loader is missing here is skipped with the reason. transformers' fp8 layers also quantize
the activations (per token, groups of 128) where gpk.llm keeps them in bf16, so fp8 gets
a wider tolerance than the weight-only formats.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from quant_fixtures import make_quantized  # noqa: E402

from pygpukit import llm  # noqa: E402

pytestmark = pytest.mark.gpu

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "llm")
CASES = [  # (id, fixture, method, options, modules transformers needs, tolerance)
    ("fp8-block128", "llama", "fp8", {"block": 128}, ("accelerate", "triton"), 0.1),
    ("fp8-block32", "qwen3", "fp8", {"block": 32}, ("accelerate", "triton"), 0.1),
    ("ct-fp8-channel", "llama", "ct-fp8", {"strategy": "channel"}, ("compressed_tensors",), 0.05),
    ("ct-fp8-tensor", "qwen2", "ct-fp8", {"strategy": "tensor"}, ("compressed_tensors",), 0.05),
    ("awq-g32", "llama", "awq", {"group": 32}, ("gptqmodel",), 0.03),
    ("gptq-sym-g32", "llama", "gptq", {"group": 32, "sym": True, "v1": True}, ("gptqmodel",),
     0.03),
]  # fmt: skip


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_logits_match_transformers(tmp_path, cuda, case):
    import pygpukit as gpk
    from pygpukit.llm.model import prefill_mask

    _, fixture, method, opt, needs, tol = case
    for module in needs:
        pytest.importorskip(module)
    d = str(tmp_path / "model")
    make_quantized(os.path.join(FIXTURES, fixture), d, method, **opt)
    seq = np.random.default_rng(0).integers(3, 256, 24).astype(np.int64)
    try:  # (fp8 loads its kernel at the first forward: a missing one fails there)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        hf = hf.to("cuda").eval()
        ref = hf(torch.from_numpy(seq[None]).to("cuda")).logits[0].float().cpu().numpy()
    except (ImportError, RuntimeError, ValueError) as e:
        pytest.skip(f"transformers cannot run {method} here: {str(e).splitlines()[0][:200]}")
    model = llm.load(d, dtype="bfloat16", progress=False)
    t = model.transformer
    t.setup_cache(1, 32)
    start = gpk.from_numpy(np.zeros(1, np.int64))
    ours = t(gpk.from_numpy(seq[None]), prefill_mask(start, len(seq)), last_only=False)
    assert rel_err(ours.to_numpy()[0], ref) < tol
