"""generation_config.json: a model's own generation defaults (EOS ids, sampling).

Hugging Face's generate reads this file before any argument: a chat model lists its
end-of-turn token among the EOS ids there (Llama 3's <|eot_id|>, Qwen's <|im_end|>), and
a model that wants sampling says do_sample with its temperature/top_p/top_k. Unset
fields keep transformers' GenerationConfig defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .config import ConfigError
from .sampling import SamplingParams

HF_TOP_K = 50  # transformers' GenerationConfig default, used when do_sample and top_k unset


@dataclass(frozen=True)
class GenerationConfig:
    """The fields of generation_config.json this runtime uses."""

    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = HF_TOP_K
    top_p: float = 1.0
    max_new_tokens: int | None = None

    @classmethod
    def from_dict(cls, d: Any, source: str, vocab: int) -> GenerationConfig:
        """Check every field this runtime reads (types and ranges), naming file and field."""
        if not isinstance(d, dict):
            raise ConfigError(f"expected a JSON object, got {type(d).__name__}", file=source)

        def fail(key: str, want: str) -> ConfigError:
            return ConfigError(f"must be {want}, got {d[key]!r}", file=source, field=key)

        def token(key: str, v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
                raise fail(key, f"a token id in [0, {vocab})")
            return v

        def number(key: str, default: float, low: float, high: float = math.inf) -> float:
            v = d.get(key)
            if v is None:
                return default
            if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
                raise fail(key, f"a number in [{low}, {high}]")
            return float(v)

        eos = d.get("eos_token_id")
        eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
        bos, pad = d.get("bos_token_id"), d.get("pad_token_id")
        do_sample = d.get("do_sample", False)
        if do_sample is None:
            do_sample = False
        if not isinstance(do_sample, bool):
            raise fail("do_sample", "true or false")
        top_k = d.get("top_k", HF_TOP_K)
        top_k = HF_TOP_K if top_k is None else top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise fail("top_k", "an integer >= 0")
        max_new = d.get("max_new_tokens")
        if max_new is not None and (
            isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0
        ):
            raise fail("max_new_tokens", "an integer >= 0")
        top_p = number("top_p", 1.0, 0.0, 1.0)
        if top_p == 0:
            raise fail("top_p", "a number in (0, 1]")
        return cls(
            eos_token_ids=tuple(token("eos_token_id", e) for e in eos_list),
            bos_token_id=None if bos is None else token("bos_token_id", bos),
            pad_token_id=None if pad is None else token("pad_token_id", pad),
            do_sample=do_sample,
            temperature=number("temperature", 1.0, 0.0),
            top_k=top_k,
            top_p=top_p,
            max_new_tokens=max_new,
        )

    def sampling(self) -> SamplingParams:
        """The default SamplingParams: greedy unless the model asks for sampling."""
        if not self.do_sample or self.temperature == 0:
            return SamplingParams()
        return SamplingParams(self.temperature, self.top_k, self.top_p)


def merge_eos(*groups: tuple[int, ...]) -> tuple[int, ...]:
    """The union of EOS id lists, in first-seen order."""
    out: list[int] = []
    for g in groups:
        out.extend(i for i in g if i not in out)
    return tuple(out)
