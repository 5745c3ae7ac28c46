"""`pygpukit chat MODEL`: an interactive chat in the terminal, in the model's chat template.

Replies stream as they are generated; the conversation is kept (multi-turn). `/reset`
starts over, `/exit` (or Ctrl-D) quits, Ctrl-C stops a reply without ending the chat.
"""

from __future__ import annotations

import argparse
import queue
import sys
from typing import Any

from pygpukit import settings

PROMPT = "> "


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal (streaming, multi-turn)",
        description="Type a message, get the model's reply as it is generated. /reset "
        "forgets the conversation, /exit or Ctrl-D quits, Ctrl-C stops a reply.",
    )
    p.add_argument("model", help="a model directory, a Hugging Face repo id, or 'tiny'")
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply")
    p.add_argument("--temperature", type=float, default=None, help="default: the model's")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default=None, help="cast weights on load (e.g. bfloat16)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="reply until --max-tokens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model == "tiny":
        settings.prefer_backend("cpu")
    import pygpukit as gpk
    from pygpukit import llm
    from pygpukit.serve.engine import Engine

    try:
        model = llm.load(args.model, dtype=args.dtype)
        if model.tokenizer is None or model.chat_template is None:
            raise gpk.GPUKitError(f"{args.model}: a chat needs tokenizer.json and a chat "
                                  "template (tokenizer_config.json)")  # fmt: skip
        base = model.default_sampling()
        params = llm.SamplingParams(
            base.temperature if args.temperature is None else args.temperature,
            base.top_k if args.top_k is None else args.top_k,
            base.top_p if args.top_p is None else args.top_p,
            args.seed,
        )
        engine = Engine(model, max_model_len=args.max_model_len, max_batch=1,
                        kv_memory=None, max_queue=1).start()  # fmt: skip
    except gpk.GPUKitError as e:
        print(f"pygpukit chat: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"pygpukit chat: {args.model} ({gpk.backend_name()}). /reset starts over, /exit "
          "quits, Ctrl-C stops a reply.", file=sys.stderr)  # fmt: skip
    try:
        _loop(model, engine, params, args)
    finally:
        engine.close()
    return 0


def _initial(args: argparse.Namespace) -> list[dict[str, str]]:
    return [{"role": "system", "content": args.system}] if args.system else []


def _loop(model: Any, engine: Any, params: Any, args: argparse.Namespace) -> None:
    messages = _initial(args)
    while True:
        try:
            line = input(PROMPT)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            return
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            messages = _initial(args)
            print("[conversation reset]")
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply = _reply(model, engine, params, args, messages)
        except KeyboardInterrupt:  # before the reply began
            messages.pop()
            print(" [stopped]")
            continue
        except Exception as e:  # one bad turn (too long, a template error) ends that turn
            messages.pop()
            print(f"[error: {str(e).splitlines()[0]}]")
            continue
        messages.append({"role": "assistant", "content": reply})


def _reply(model: Any, engine: Any, params: Any, args: argparse.Namespace,
           messages: list[dict[str, str]]) -> str:  # fmt: skip
    from pygpukit.serve.engine import Event, Request
    from pygpukit.serve.text import TextStream

    ids = model.chat_ids(messages)
    room = engine.max_model_len - len(ids)
    if room < 1:
        raise ValueError(f"the conversation ({len(ids)} tokens) fills the context of "
                         f"{engine.max_model_len}: /reset")  # fmt: skip
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    stop = frozenset() if args.ignore_eos else engine.eos
    req = engine.submit(Request(ids, min(args.max_tokens, room), events.put, params, stop))
    stream = TextStream(model.tokenizer, [])
    try:
        while True:
            ev = events.get()
            if ev.kind == "token":
                if ev.token in stop:
                    continue
                sys.stdout.write(stream.feed(ev.token))
                sys.stdout.flush()
            elif ev.kind == "done":
                sys.stdout.write(stream.flush() + "\n")
                break
            else:
                raise ev.error or RuntimeError("generation failed")
    except KeyboardInterrupt:
        engine.cancel(req)
        sys.stdout.write(stream.flush() + " [stopped]\n")
    sys.stdout.flush()
    return stream.text
