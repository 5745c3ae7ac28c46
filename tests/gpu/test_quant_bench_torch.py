"""The quant benches' device quantizer (pygpukit/bench/quant_torch.py) against ir/quant.py:
its arrays fit the layouts' shape rules, the float64 weight ir.quant.dequantize makes of
them on the host is exactly the one its own device dequantize gives, and that weight is
the random float weight within the format's rounding."""

from __future__ import annotations

import numpy as np
import pytest

from pygpukit.bench import quant_torch
from pygpukit.ir.quant import dequantize

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]
torch = pytest.importorskip("torch")

# (format, options, relative error bound of a standard normal weight)
CASES = [
    ("int8", {}, 0.02),
    ("fp8", {"block": 0}, 0.05),
    ("fp8", {"block": 128}, 0.05),
    ("int4", {"group": 128}, 0.15),
    ("int4", {"group": 64, "symmetric": False}, 0.15),
]


@pytest.mark.parametrize(("fmt", "kw", "bound"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_device_quantizer_makes_the_layouts(fmt, kw, bound):
    n, k = 300, 512  # N not a multiple of the fp8 block: a partial edge block
    w = torch.randn(n, k, device="cuda")
    spec, arrays = quant_torch.quantize(torch, w, fmt, **kw)
    host = [a.cpu().numpy() for a in arrays]
    zero = host[2] if len(host) > 2 else None
    spec.check(n, k, (host[0].shape, host[0].dtype.name), host[1].shape,
               None if zero is None else zero.shape)  # fmt: skip
    ref = dequantize(spec, host[0], host[1], zero, k)
    np.testing.assert_array_equal(quant_torch.dequantize(torch, spec, arrays, k).cpu().numpy(), ref)
    wd = w.double().cpu().numpy()
    assert np.linalg.norm(ref - wd) / np.linalg.norm(wd) <= bound
