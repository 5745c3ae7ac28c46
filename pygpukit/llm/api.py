"""gpk.llm.load and the Model it returns: config + weights + tokenizer + generation."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.quant import QuantizedWeight

from .config import ModelConfig
from .files import ModelDir, read_json
from .generate import GenerationResult, Generator, bucket, check_count
from .loader import (
    INDEX,
    Checkpoint,
    LinearSource,
    LoadError,
    checkpoint_files,
    load_weights,
    read_index,
)
from .model import Transformer
from .quant_checkpoint import PrequantizedLinears, read_quant_config
from .quantize import DEFAULT_GROUP, QuantizeOnLoad, check_quantize
from .sampling import SamplingParams
from .tokenizer import Tokenizer


class Model:
    """A loaded causal LM. `generate` takes text (needs the tokenizer) or token ids."""

    def __init__(
        self,
        config: ModelConfig,
        transformer: Transformer,
        tokenizer: Tokenizer | None,
        path: str = "",
    ) -> None:
        self.config, self.transformer, self.tokenizer, self.path = (
            config,
            transformer,
            tokenizer,
            path,
        )
        self._generators: dict[tuple[int, int], Generator] = {}

    @property
    def dtype(self) -> dtypes.DType:
        return self.transformer.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of distinct weight arrays (a tied LM head counted once)."""
        seen = {id(a): a.nbytes for a in self.transformer.weights.values()}
        return sum(seen.values())

    @property
    def quantization(self) -> str:
        """The quantized weights' formats ("int8", "int4 g128 asym", ...), "" for none."""
        specs = {w.spec.label for w in self.transformer.weights.values()
                 if isinstance(w, QuantizedWeight)}  # fmt: skip
        return ", ".join(sorted(specs))

    def generator(self, batch: int, max_seq_len: int) -> Generator:
        key = (batch, max_seq_len)
        if key not in self._generators:
            self._generators = {key: Generator(self.transformer, batch, max_seq_len)}
        return self._generators[key]

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise errors.GPUKitError(f"{self.path}: this model has no tokenizer.json")
        return self.tokenizer.encode(text)

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        params: SamplingParams | None = None,
        max_seq_len: int | None = None,
        stop_at_eos: bool = True,
        on_tokens: Callable[[int, Any], None] | None = None,
    ) -> GenerationResult:
        """Generate for a static batch of token-id prompts (one row each).

        max_new_tokens 0 returns no new tokens (as Hugging Face's generate).
        """
        if len(prompts) == 0:
            raise errors.GPUKitValueError("generate: no prompts (the batch must be >= 1)")
        check_count("max_new_tokens", max_new_tokens, 0)
        if max_seq_len is not None:
            check_count("max_seq_len", max_seq_len, 1)
        longest = max(len(p) for p in prompts)
        if max_seq_len is None:
            need = bucket(longest, 1 << 30) + max_new_tokens
            max_seq_len = min(self.config.max_position_embeddings, bucket(need, 1 << 30))
        pad = self.config.pad_token_id
        pad = pad if pad is not None else (self.config.bos_token_id or 0)
        gen = self.generator(len(prompts), max_seq_len)
        eos = self.config.eos_token_ids if stop_at_eos else ()
        return gen.generate(prompts, max_new_tokens, params, eos, on_tokens, pad_id=pad)

    def generate(
        self,
        prompt: str | Sequence[str],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> str | list[str]:
        """Text in, text out (a list for a list of prompts, generated as one batch)."""
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        params = SamplingParams(temperature, top_k, top_p, seed)
        res = self.generate_ids([self.encode(t) for t in texts], max_new_tokens, params)
        assert self.tokenizer is not None
        outs = [self.tokenizer.decode(toks) for toks in res.tokens]
        return outs[0] if isinstance(prompt, str) else outs


def load(
    path: str | os.PathLike[str],
    dtype: Any = None,
    progress: bool | None = None,
    quantize: str | None = None,
    quantize_group: int = DEFAULT_GROUP,
) -> Model:
    """Load a Hugging Face model directory: config.json, *.safetensors, tokenizer.json.

    dtype None keeps the checkpoint's float type; "bfloat16"/"float32"/... casts on load.
    Weights come back read-only. progress None draws a bar on a terminal once loading
    takes more than a moment (pygpukit.progress); True always, False never.
    quantize "int8" | "fp8" | "int4" quantizes a float checkpoint's linear weights as they
    stream in (pygpukit.llm.quantize; int4 symmetric, groups of quantize_group along K).
    A checkpoint with a quantization_config in config.json (fp8, compressed-tensors fp8 or
    int8, AWQ, GPTQ) loads quantized as it is (pygpukit.llm.quant_checkpoint).
    Only regular files inside the directory are read, and the config, the index, every
    header and the tokenizer are checked before any memory is allocated: a malformed
    checkpoint raises a LoadError naming the file and the field.
    """
    if quantize is not None:
        check_quantize(quantize, quantize_group)
    model = ModelDir(path)
    config_path = model.path("config.json")
    with model.open("config.json") as f:
        raw = read_json(f, config_path, "the model config")
    cfg = ModelConfig.from_dict(raw, config_path)
    qc = read_quant_config(raw, config_path)
    linears: LinearSource | None = None
    if qc is not None and quantize is not None:
        raise errors.GPUKitValueError(
            f"load: quantize={quantize!r}, but {config_path} says the checkpoint is already "
            f"quantized ({qc.method}); load it without quantize="
        )
    if qc is not None:
        linears = PrequantizedLinears(qc)
    elif quantize is not None:
        linears = QuantizeOnLoad(quantize, quantize_group)
    target = None
    if dtype is not None:
        try:
            target = dtypes.as_dtype(dtype)
        except dtypes.UnsupportedDType as e:
            raise errors.DTypeError(f"load: {e}") from None
    tokenizer = None
    if model.has("tokenizer.json"):
        tok_path = model.path("tokenizer.json")
        with model.open("tokenizer.json") as f:
            tokenizer = Tokenizer.from_bytes(f.read(), tok_path, cfg.bos_token_id)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise LoadError(
                f"{tokenizer.vocab_size} tokens, more than {config_path}'s vocab_size "
                f"{cfg.vocab_size}",
                file=tok_path,
                field="vocab",
            )
    weight_map = read_index(model)
    ckpt = Checkpoint(checkpoint_files(model))
    try:
        if weight_map is not None:
            ckpt.check_index(weight_map, model.path(INDEX))
        weights, used = load_weights(ckpt, cfg, target, progress, config_path, linears)
    finally:
        ckpt.close()
    return Model(cfg, Transformer(cfg, weights, used), tokenizer, model.given)
