"""`pygpukit generate`: stream text from a SafeTensors Llama/Qwen model (or `--model tiny`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pygpukit import settings


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with a Llama/Mistral/Qwen model directory, or --model tiny",
        description="Stream generated text, then report prefill time, decode speed and the "
        "weight bandwidth against the measured copy bandwidth.",
    )
    p.add_argument("--model", required=True, help="a Hugging Face model directory, or 'tiny'")
    p.add_argument("--prompt", default="Alice was", help="the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="1: off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch", type=int, default=1, help="static batch (the prompt repeated)")
    p.add_argument("--dtype", default=None, help="cast weights on load (e.g. bfloat16)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model == "tiny":
        # The tiny model is a CPU demo; a GPU is used only when asked for explicitly.
        settings.prefer_backend("cpu")
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.llm.perf import copy_bandwidth

    try:
        path = args.model
        if path == "tiny":
            from pygpukit.llm.tiny import write_tiny_model

            path = write_tiny_model()
        model = llm.load(path, dtype=args.dtype)
        if model.tokenizer is None:
            raise gpk.GPUKitError(f"{path}: no tokenizer.json, so no text prompt")
        params = llm.SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        ids = model.encode(args.prompt)
        tokenizer = model.tokenizer
        shown_ids: list[int] = []
        shown_text = [""]

        def stream(step: int, toks: Any) -> None:
            # Decode the whole row each time: byte-level pieces only form text together.
            shown_ids.append(int(toks[0]))
            text = tokenizer.decode(shown_ids)
            if text.startswith(shown_text[0]):
                sys.stdout.write(text[len(shown_text[0]) :])
                sys.stdout.flush()
                shown_text[0] = text

        sys.stdout.write(args.prompt)
        res = model.generate_ids([ids] * args.batch, args.max_new_tokens, params,
                                 stop_at_eos=not args.ignore_eos, on_tokens=stream)  # fmt: skip
        sys.stdout.write("\n")
        for b in range(1, args.batch):
            print(f"[{b}] {args.prompt}{tokenizer.decode(res.tokens[b])}")
    except gpk.GPUKitError as e:
        print(f"pygpukit generate: {e}", file=sys.stderr)
        return 1
    bw, how = copy_bandwidth()
    wbytes = model.weight_bytes
    tps = res.decode_tokens_per_s
    gbs = wbytes * tps / 1e9
    print(
        f"model        {model.config.arch} {model.config.param_count() / 1e6:.2f}M params, "
        f"{model.dtype.name}, {wbytes / 1e6:.1f} MB of weights, backend {gpk.backend_name()}"
    )
    print(
        f"prefill      {res.prefill_s * 1e3:.1f} ms ({len(ids)} tokens, bucket "
        f"{res.stats['bucket']}, batch {args.batch})"
    )
    print(
        f"decode       {tps:.1f} tok/s per sequence, {tps * args.batch:.1f} tok/s in all "
        f"({res.decode_steps} steps{', compiled' if res.stats['compiled'] else ', lazy'})"
    )
    print(f"weights read {gbs:.2f} GB/s = {100 * gbs / (bw / 1e9):.1f}% of the {bw / 1e9:.1f} GB/s "
          f"{how}")  # fmt: skip
    return 0
