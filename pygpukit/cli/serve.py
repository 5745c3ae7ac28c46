"""`pygpukit serve MODEL`: an OpenAI-compatible HTTP server with continuous batching."""

from __future__ import annotations

import argparse
import sys

from pygpukit import settings

from .quantize_args import add_quantize_arguments, quantize_options


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (continuous batching)",
        description="GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed "
        "or not), GET /health. Requests share one running batch over a paged KV cache; "
        "admission goes through the scheduler (a request's KV blocks are its reservation).",
    )
    p.add_argument("model", help="a model directory, a Hugging Face repo id, or 'tiny'")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the name clients ask for")
    p.add_argument("--dtype", default=None, help="cast weights on load (e.g. bfloat16)")
    add_quantize_arguments(p)
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens")
    p.add_argument(
        "--kv-memory",
        default=None,
        help="bytes for the KV cache ('4GB'; default a quarter of free GPU memory)",
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-batch", type=int, default=256, help="most sequences decoding at once")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="most requests waiting; more get 429")  # fmt: skip
    p.add_argument("--prefill-chunk", type=int, default=512,
                   help="the most tokens of one prompt one engine step prefills; a longer "
                   "prompt is split over steps")  # fmt: skip
    p.add_argument("--step-tokens", type=int, default=None,
                   help="token budget of one engine step (one launch) with decode rows: "
                   "decode rows + prompt tokens (default max(2 x prefill chunk, max batch + "
                   "prefill chunk))",
                   )  # fmt: skip
    p.add_argument("--prefill-step-tokens", type=int, default=None,
                   help="token budget of a step of prompts alone; a step of d decode rows "
                   "takes up to this / d when that is more than --step-tokens (default: "
                   "--step-tokens)")  # fmt: skip
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                   help="compute every prompt whole (default: a prompt's full blocks that "
                   "an earlier request computed, from its start, are reused)")  # fmt: skip
    p.add_argument("--single-process", action="store_true",
                   help="run the HTTP front end in the engine's process (default: a process "
                   "of its own, so the engine thread never waits for the event loop)")  # fmt: skip
    p.add_argument("--front-ends", type=int, default=1,
                   help="HTTP front-end processes sharing the port (SO_REUSEPORT), each with "
                   "its connection to the engine: they share the requests' intake and the "
                   "streams' chunks")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, start the engine and serve until Ctrl-C."""
    if args.model == "tiny":
        settings.prefer_backend("cpu")
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.scheduler.args import memory_size
    from pygpukit.serve.engine import Engine
    from pygpukit.serve.server import Server

    try:
        kv = None if args.kv_memory is None else memory_size("serve", "--kv-memory",
                                                               args.kv_memory)  # fmt: skip
        model = llm.load(args.model, dtype=args.dtype, **quantize_options(args))
        engine = Engine(model, max_model_len=args.max_model_len, kv_memory=kv,
                        block_size=args.block_size, max_batch=args.max_batch,
                        prefill_chunk=args.prefill_chunk, max_queue=args.max_queue,
                        step_tokens=args.step_tokens,
                        prefill_step_tokens=args.prefill_step_tokens,
                        prefix_caching=args.prefix_caching)  # fmt: skip
        name = args.served_model_name or args.model
        server = Server(model, engine, name, args.host, args.port, "info",
                        processes=1 if args.single_process else 2,
                        front_ends=args.front_ends)  # fmt: skip
    except gpk.GPUKitError as e:
        print(f"pygpukit serve: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    st = engine.stats()
    print(f"pygpukit serve: {name} on http://{args.host}:{args.port}/v1 ({gpk.backend_name()}, "
          f"{st['num_blocks']} KV blocks of {st['block_size']} tokens, max_model_len "
          f"{st['max_model_len']})", file=sys.stderr)  # fmt: skip
    try:
        server.run()
    except gpk.GPUKitError as e:  # the front end's process could not listen
        print(f"pygpukit serve: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0
