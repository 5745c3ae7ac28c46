"""`--quantize` and `--quant-group`: the quantize-on-load flags of the model commands
(generate; serve calls the same two functions)."""

from __future__ import annotations

import argparse
from typing import Any

from pygpukit.ir.quant import FORMATS

DEFAULT_GROUP = 128  # pygpukit.llm.quantize.DEFAULT_GROUP, without importing the llm package


def add_quantize_arguments(p: argparse.ArgumentParser) -> None:
    """Add --quantize {int8,fp8,int4} and --quant-group N to a model command's parser."""
    p.add_argument("--quantize", choices=FORMATS, default=None,
                   help="quantize the linear weights on load (a float checkpoint; a "
                   "pre-quantized one loads as it is)")  # fmt: skip
    p.add_argument("--quant-group", type=int, default=DEFAULT_GROUP,
                   help=f"int4: K elements per scale (default {DEFAULT_GROUP})")  # fmt: skip


def quantize_options(args: argparse.Namespace) -> dict[str, Any]:
    """The gpk.llm.load keyword arguments the flags ask for."""
    if args.quantize is None:
        return {}
    return {"quantize": args.quantize, "quantize_group": args.quant_group}
