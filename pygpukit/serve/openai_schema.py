"""The OpenAI API's request fields (checked) and response objects (built).

Only what this server implements is accepted: a field of the wrong type or out of range is
a 400 naming it, as OpenAI answers. Fields this server does not know are ignored (clients
send extras); `top_k`, `priority`, `qos` and `ignore_eos` are extensions (vLLM has the
first and the last). An omitted temperature/top_p/top_k takes the model's
generation_config.json default (greedy when it has none), as vLLM does.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pygpukit.llm.sampling import SamplingParams

MAX_STOP = 4  # OpenAI: up to 4 stop sequences
QOS_NAMES = ("guaranteed", "burstable", "best_effort")


class RequestError(Exception):
    """A request this server refuses; `status` is the HTTP status, `param` the field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.message, self.status, self.param, self.kind = message, status, param, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class GenerationRequest:
    """A completion or chat request, checked."""

    model: str | None
    prompt: str | list[int] | None = None  # completions
    messages: list[dict[str, Any]] | None = None  # chat
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    qos: str = "burstable"
    user: str | None = None
    ignore_eos: bool = False

    def sampling(self, default: SamplingParams) -> SamplingParams:
        temperature = default.temperature if self.temperature is None else self.temperature
        top_p = default.top_p if self.top_p is None else self.top_p
        top_k = default.top_k if self.top_k is None else self.top_k
        return SamplingParams(temperature, top_k, top_p, self.seed)


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _get(body: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in kinds:
        raise RequestError(f"'{key}' must be {what}, got {_type_name(v)}", param=key)
    if not isinstance(v, kinds):
        raise RequestError(f"'{key}' must be {what}, got {_type_name(v)}", param=key)
    return v


def _number(body: dict[str, Any], key: str, low: float, high: float, *,
            open_low: bool = False) -> float | None:  # fmt: skip
    v = _get(body, key, (int, float), "a number")
    if v is None:
        return None
    ok = math.isfinite(v) and (v > low if open_low else v >= low) and v <= high
    if not ok:
        lo = "(" if open_low else "["
        raise RequestError(f"'{key}' must be in {lo}{low}, {high}], got {v}", param=key)
    return float(v)


def _int(body: dict[str, Any], key: str, low: int, high: int = 2**63 - 1) -> int | None:
    v = _get(body, key, (int,), "an integer")
    if v is not None and not low <= v <= high:
        raise RequestError(f"'{key}' must be an integer in [{low}, {high}], got {v}", param=key)
    return v  # type: ignore[no-any-return]


def parse_request(body: Any, chat: bool) -> GenerationRequest:
    """Check a /v1/completions (chat False) or /v1/chat/completions body."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {_type_name(body)}")
    model = _get(body, "model", (str,), "a string")
    req = GenerationRequest(model)
    if chat:
        req.messages = _messages(body.get("messages"))
        mt = _int(body, "max_completion_tokens", 1)
        req.max_tokens = mt if mt is not None else _int(body, "max_tokens", 1)
    else:
        req.prompt = _prompt(body.get("prompt"))
        req.max_tokens = _int(body, "max_tokens", 1)
        if req.max_tokens is None and "max_tokens" not in body:
            req.max_tokens = 16  # OpenAI's default for completions
        if body.get("echo"):
            raise RequestError("'echo' is not supported", param="echo")
        if body.get("suffix") is not None:
            raise RequestError("'suffix' is not supported", param="suffix")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise RequestError("only n=1 is supported", param="n")
    best_of = _int(body, "best_of", 1)
    if best_of not in (None, 1):
        raise RequestError("only best_of=1 is supported", param="best_of")
    for key in ("logprobs", "top_logprobs"):
        v = body.get(key)
        if v not in (None, False, 0):
            raise RequestError(f"'{key}' is not supported", param=key)
    for key in ("presence_penalty", "frequency_penalty"):
        v = _number(body, key, -2.0, 2.0)
        if v not in (None, 0.0):
            raise RequestError(f"'{key}' other than 0 is not supported", param=key)
    req.temperature = _number(body, "temperature", 0.0, 2.0)
    req.top_p = _number(body, "top_p", 0.0, 1.0, open_low=True)
    req.top_k = _int(body, "top_k", -1)
    if req.top_k == -1:
        req.top_k = 0  # vLLM's spelling of "off"
    req.seed = _int(body, "seed", 0, 2**63 - 1)
    req.stop = _stop(body.get("stop"))
    req.stream = bool(_get(body, "stream", (bool,), "a boolean") or False)
    opts = _get(body, "stream_options", (dict,), "an object")
    if opts is not None:
        req.include_usage = bool(_get(opts, "include_usage", (bool,), "a boolean") or False)
    req.priority = _int(body, "priority", -(2**31), 2**31 - 1) or 0
    qos = _get(body, "qos", (str,), "a string")
    if qos is not None:
        qos = qos.lower().replace("-", "_")
        if qos not in QOS_NAMES:
            raise RequestError(f"'qos' must be one of {list(QOS_NAMES)}, got {qos!r}", param="qos")
        req.qos = qos
    req.user = _get(body, "user", (str,), "a string")
    req.ignore_eos = bool(_get(body, "ignore_eos", (bool,), "a boolean") or False)
    return req


def _prompt(v: Any) -> str | list[int]:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
        v = v[0]  # a batch of one
    if isinstance(v, str):
        return v
    # Exact ints (JSON's; a bool is not one): the set of the items' types, not a test per
    # item, which took 35 us of the front end's loop for a 320-token prompt (6 us now).
    if isinstance(v, list) and v and set(map(type, v)) == {int}:
        return list(v)
    if v is None:
        raise RequestError("'prompt' is required", param="prompt")
    raise RequestError("'prompt' must be a string or a list of token ids (one prompt)",
                       param="prompt")  # fmt: skip


def _messages(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list) or not v:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"'{where}' must be an object", param=where)
        role = m.get("role")
        if not isinstance(role, str):
            raise RequestError(f"'{where}.role' must be a string", param=f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is supported
            texts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise RequestError(f"'{where}.content' parts must be text parts",
                                       param=f"{where}.content")  # fmt: skip
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise RequestError(f"'{where}.content' must be a string or a list of text parts",
                               param=f"{where}.content")  # fmt: skip
        out.append({**{k: x for k, x in m.items() if k not in ("role", "content")},
                    "role": role, "content": content})  # fmt: skip
    return out


def _stop(v: Any) -> list[str]:
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP:
        raise RequestError(f"'stop' takes at most {MAX_STOP} sequences", param="stop")
    return list(stops)


# -- responses ------------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: the prompt tokens the
    prefix cache served (not prefilled)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}  # fmt: skip


def response(chat: bool, rid: str, model: str, text: str, finish: str | None,
             use: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    """The whole (non-streamed) completion."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": use}  # fmt: skip


def chunk(chat: bool, rid: str, model: str, text: str | None, finish: str | None,
          first: bool = False, use: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """One server-sent event of a stream (text None: the usage-only last chunk)."""
    out: dict[str, Any] = {"id": rid,
                           "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": model}  # fmt: skip
    if text is None:
        out["choices"] = []
    elif chat:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        out["choices"] = [{"index": 0, "delta": delta, "logprobs": None,
                           "finish_reason": finish}]  # fmt: skip
    else:
        out["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    if use is not None:
        out["usage"] = use
    return out


class StreamChunks:
    """One stream's text chunks as server-sent event lines. Every chunk of a stream has
    the same id, object, created and model, so that part is serialised once and a chunk
    costs one json.dumps of its text: the HTTP loop writes one per stream per decode
    step. The JSON is chunk()'s."""

    def __init__(self, chat: bool, rid: str, model: str) -> None:
        self.chat = chat
        head = chunk(chat, rid, model, None, None)
        del head["choices"]
        self._head = json.dumps(head, ensure_ascii=False)[:-1] + ', "choices": [{"index": 0, '

    def sse(self, text: str, finish: str | None, first: bool = False) -> str:
        """The event line of chunk(chat, rid, model, text, finish, first)."""
        t = json.dumps(text, ensure_ascii=False)
        f = "null" if finish is None else json.dumps(finish)
        if self.chat:
            role = ', "role": "assistant"' if first else ""
            body = f'"delta": {{"content": {t}{role}}}, "logprobs": null, "finish_reason": {f}'
        else:
            body = f'"text": {t}, "logprobs": null, "finish_reason": {f}'
        return f"data: {self._head}{body}}}]}}\n\n"
