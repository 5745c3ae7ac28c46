"""`pygpukit generate`: stream text from a SafeTensors Llama/Qwen model (or `--model tiny`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pygpukit import settings

from .quantize_args import add_quantize_arguments, quantize_options


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with a Llama/Mistral/Qwen model directory, or --model tiny",
        description="Stream generated text, then report prefill time, decode speed and the "
        "weight bandwidth against the measured copy bandwidth.",
    )
    p.add_argument("--model", required=True,
                   help="a Hugging Face model directory, a repo id (from the local cache, else "
                   "downloaded), or 'tiny'")  # fmt: skip
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="the prompt text (default 'Alice was')")
    prompt.add_argument("--prompt-ids", default=None, metavar="IDS",
                        help="the prompt as token ids, '1,2,3' or '1 2 3' (no tokenizer needed; "
                        "without one the new ids are printed)")  # fmt: skip
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as one user message in the model's chat template",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 is greedy (default: generation_config.json's, else greedy)",
    )
    p.add_argument("--top-k", type=int, default=None, help="0: off (default: the model's)")
    p.add_argument("--top-p", type=float, default=None, help="1: off (default: the model's)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch", type=int, default=1, help="static batch (the prompt repeated)")
    p.add_argument("--dtype", default=None, help="cast weights on load (e.g. bfloat16)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    add_quantize_arguments(p)
    p.add_argument("--tp", type=int, default=1,
                   help="tensor parallel ranks: run under `pygpukit launch -n TP`")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load, stream the prompt and its continuation on stdout, statistics on stderr.

    Every error is one line on stderr and exit status 1 (argparse's own usage errors: 2).
    """
    if args.model == "tiny":
        # The tiny model is a CPU demo; a GPU is used only when asked for explicitly.
        settings.prefer_backend("cpu")
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.llm.perf import copy_bandwidth

    try:
        # Checked before the model loads: a bad flag should not cost a load.
        llm.SamplingParams(args.temperature or 0.0, args.top_k or 0,
                           1.0 if args.top_p is None else args.top_p, args.seed)  # fmt: skip
        given_ids = None if args.prompt_ids is None else parse_ids(args.prompt_ids)
        if args.chat and given_ids is not None:
            raise gpk.errors.GPUKitValueError("--chat takes a text --prompt, not --prompt-ids")
        if args.batch < 1:
            raise gpk.errors.GPUKitValueError(f"--batch must be >= 1, got {args.batch}")
        if args.max_new_tokens < 0:
            raise gpk.errors.GPUKitValueError(
                f"--max-new-tokens must be >= 0, got {args.max_new_tokens}"
            )
        rank = _tensor_parallel(args.tp)
        model = llm.load(resolve_model(args.model), dtype=args.dtype, tensor_parallel=args.tp,
                         **quantize_options(args))  # fmt: skip
        params = _sampling(model, args)
        tokenizer = model.tokenizer
        text_prompt = "Alice was" if args.prompt is None else args.prompt
        if given_ids is not None:
            ids = given_ids
            _check_ids(ids, model.config.vocab_size)
            shown = tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))
        elif tokenizer is None:
            raise gpk.GPUKitError(f"{args.model}: no tokenizer.json, so no text prompt "
                                  "(give --prompt-ids)")  # fmt: skip
        elif args.chat:
            ids = model.chat_ids([{"role": "user", "content": text_prompt}])
            shown = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            ids = model.encode(text_prompt)
            shown = text_prompt
        shown_ids: list[int] = []
        shown_text = [""]

        def stream(step: int, toks: Any) -> None:
            shown_ids.append(int(toks[0]))
            if tokenizer is None:
                sys.stdout.write(f" {int(toks[0])}")
                sys.stdout.flush()
                return
            # Decode the whole row each time: byte-level pieces only form text together.
            text = tokenizer.decode(shown_ids)
            if text.startswith(shown_text[0]):
                sys.stdout.write(text[len(shown_text[0]) :])
                sys.stdout.flush()
                shown_text[0] = text

        if rank:  # every rank generates the same tokens; rank 0 shows them
            stream = _silent
        else:
            sys.stdout.write(shown)
        res = model.generate_ids([ids] * args.batch, args.max_new_tokens, params,
                                 stop_at_eos=not args.ignore_eos, on_tokens=stream)  # fmt: skip
        if rank:
            return 0
        sys.stdout.write("\n")
        for b in range(1, args.batch):
            rest = (tokenizer.decode(res.tokens[b]) if tokenizer is not None
                    else "".join(f" {t}" for t in res.tokens[b]))  # fmt: skip
            print(f"[{b}] {shown}{rest}")
        sys.stdout.flush()
    except gpk.GPUKitError as e:
        print(f"pygpukit generate: {_one_line(e)}", file=sys.stderr)
        return 1
    _report(model, res, len(ids), args.batch, copy_bandwidth())
    return 0


def parse_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' -> [1, 2, 3]; anything else is a GPUKitValueError naming it."""
    from pygpukit import errors

    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise errors.GPUKitValueError("--prompt-ids: no token ids given")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise errors.GPUKitValueError(f"--prompt-ids: expected integers separated by commas or "
                                      f"spaces, got {text!r:.80}") from None  # fmt: skip
    return ids


def _check_ids(ids: list[int], vocab: int) -> None:
    from pygpukit import errors

    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise errors.IndexError_(f"--prompt-ids: token id {bad[0]} is outside the model's "
                                 f"vocabulary [0, {vocab})")  # fmt: skip


def _sampling(model: Any, args: argparse.Namespace) -> Any:
    """The flags given, the model's generation_config.json defaults for the rest."""
    from pygpukit import llm

    base = model.default_sampling()
    temperature = base.temperature if args.temperature is None else args.temperature
    top_k = base.top_k if args.top_k is None else args.top_k
    top_p = base.top_p if args.top_p is None else args.top_p
    return llm.SamplingParams(temperature, top_k, top_p, args.seed)


def resolve_model(name: str) -> str:
    """--model: a directory, `tiny` (the CPU backend unless a GPU is asked for), a repo id."""
    from pygpukit.llm.hub import resolve_model as resolve

    return resolve(name)


def _tensor_parallel(tp: int) -> int:
    """This process's rank: --tp N joins the communicator `pygpukit launch -n N` set up."""
    import pygpukit as gpk

    if tp < 1:
        raise gpk.errors.GPUKitValueError(f"--tp must be >= 1, got {tp}")
    if tp == 1:
        return 0
    from pygpukit import distributed

    distributed.init()
    if distributed.world_size() != tp:
        distributed.destroy()
        raise gpk.errors.DistributedError(f"--tp {tp} runs as {tp} processes: start it with "
                                          f"`pygpukit launch -n {tp} -m pygpukit generate "
                                          f"... --tp {tp}` (this process is one of "
                                          f"{distributed.world_size()})")  # fmt: skip
    return distributed.rank()


def _silent(step: int, toks: Any) -> None:
    """A rank other than 0 streams nothing."""


def _one_line(e: Exception) -> str:
    # gpk errors may append the user's line on a second line; the CLI's user has none.
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _report(model: Any, res: Any, prompt_len: int, batch: int, copy: tuple[float, str]) -> None:
    """Statistics on stderr, so stdout holds the generated text alone."""
    import pygpukit as gpk

    bw, how = copy
    wbytes = model.weight_bytes
    tps = res.decode_tokens_per_s
    gbs = wbytes * tps / 1e9

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    cfg = model.config
    quant = f" (linears {model.quantization})" if model.quantization else ""
    say(f"model        {cfg.arch} {cfg.param_count() / 1e6:.2f}M params, {model.dtype.name}"
        f"{quant}, {wbytes / 1e6:.1f} MB of weights, backend {gpk.backend_name()}")  # fmt: skip
    load = model.load_stats
    if load.get("seconds"):
        say(f"load         {load['bytes'] / 1e6:.1f} MB in {load['seconds']:.3f} s = "
            f"{load['bytes'] / 1e9 / load['seconds']:.2f} GB/s (memory-mapped)")  # fmt: skip
    if res.stats["bucket"] is None:
        say("prefill      not run (--max-new-tokens 0: the prompt alone, as Hugging Face)")
        return
    chunks = res.stats["chunks"]
    say(f"prefill      {res.prefill_s * 1e3:.1f} ms ({prompt_len} tokens, padded to "
        f"{res.stats['bucket']} in {len(chunks)} chunk{'s' if len(chunks) > 1 else ''}, "
        f"batch {batch})")  # fmt: skip
    say(f"decode       {tps:.1f} tok/s per sequence, {tps * batch:.1f} tok/s in all "
        f"({res.decode_steps} steps)")  # fmt: skip
    say(f"weights read {gbs:.2f} GB/s = {100 * gbs / (bw / 1e9):.1f}% of the {bw / 1e9:.1f} GB/s "
        f"{how}")  # fmt: skip
