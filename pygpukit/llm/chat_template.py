"""Chat templates: tokenizer_config.json's `chat_template` rendered as Hugging Face does.

transformers' apply_chat_template compiles the template in jinja2's immutable sandbox with
trim_blocks and lstrip_blocks, the loopcontrols extension, and the globals
raise_exception, strftime_now, a tojson filter that does not escape HTML, and passes the
tokenizer's special tokens (bos_token, eos_token, ...) and add_generation_prompt. The
same environment here gives the same text; the ids are then the tokenizer's encoding of
that text without added special tokens (the template writes its own BOS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pygpukit import errors

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                "cls_token", "mask_token")  # fmt: skip


class ChatTemplateError(errors.GPUKitValueError):
    """The template could not be rendered for these messages (it raised, or is broken)."""


def _jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        import jinja2.sandbox
    except ImportError:
        raise errors.GPUKitError(
            'chat templates need `jinja2`: pip install "pygpukit[serve]"'
        ) from None
    return jinja2


def _token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return str(v["content"])
    return None


class ChatTemplate:
    """One model's chat template and the special tokens its template reads."""

    def __init__(self, source: str, special: Mapping[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source:
            raise errors.GPUKitValueError("a chat template must be a non-empty string")
        self.source = source
        self.special = dict(special or {})
        self._compiled: Any = None

    @classmethod
    def from_tokenizer_config(cls, cfg: Any, path: str, jinja_file: str | None = None
                              ) -> ChatTemplate | None:  # fmt: skip
        """The template of a tokenizer_config.json document (None when it has none).
        `jinja_file`: the text of a chat_template.jinja beside it, which wins (as in HF)."""
        if not isinstance(cfg, dict):
            raise errors.LoadError(f"expected a JSON object, got {type(cfg).__name__}", file=path)
        template = jinja_file if jinja_file is not None else cfg.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is None:
            return None
        if not isinstance(template, str) or not template:
            raise errors.LoadError("must be a non-empty string", file=path, field="chat_template")
        special = {k: t for k in SPECIAL_KEYS if (t := _token_text(cfg.get(k))) is not None}
        return cls(template, special)

    def _template(self) -> Any:
        if self._compiled is None:
            self._compiled = _compile(self.source)
        return self._compiled

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **extra: Any) -> str:  # fmt: skip
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
        jinja2 = _jinja()
        try:
            template = self._template()
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template: cannot compile: {e}") from None
        data = json.loads(json.dumps(list(messages)))  # plain JSON values only, a fresh copy
        try:
            return str(template.render(messages=data, add_generation_prompt=add_generation_prompt,
                                       **self.special, **extra))  # fmt: skip
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"chat template: {type(e).__name__}: {e}") from None


def _compile(source: str) -> Any:
    jinja2 = _jinja()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class Generation(jinja2.ext.Extension):  # type: ignore[misc,name-defined]
        """{% generation %}...{% endgeneration %} (HF marks assistant tokens with it): the
        body, rendered as is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return str(caller())

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)
