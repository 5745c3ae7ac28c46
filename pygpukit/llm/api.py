"""gpk.llm.load and the Model it returns: config + weights + tokenizer + generation."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.quant import QuantizedWeight
from pygpukit.streams import synchronize

from .chat_template import ChatTemplate
from .config import ModelConfig
from .files import ModelDir, read_json
from .generate import (
    GenerationResult,
    Generator,
    bucket,
    check_chunk,
    check_count,
    prefill_chunk_for,
    prefill_plan,
)
from .generation_config import GenerationConfig, merge_eos
from .hub import resolve_model
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
from .parallel import parallelize, rank_config, sharder
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
        generation_config: GenerationConfig | None = None,
        chat_template: ChatTemplate | None = None,
    ) -> None:
        self.config, self.transformer, self.tokenizer, self.path = (
            config,
            transformer,
            tokenizer,
            path,
        )
        self.generation_config = generation_config or GenerationConfig()
        self.chat_template = chat_template
        self._generators: dict[tuple[int, int, int], Generator] = {}
        # What gpk.llm.load measured: checkpoint bytes read and the seconds it took.
        self.load_stats: dict[str, float] = {}
        # Tokens per row per prefill step (a power of two); None: prefill_chunk_for(batch).
        self.prefill_chunk: int | None = None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """config.json's EOS ids and generation_config.json's (a chat model's end of turn)."""
        return merge_eos(self.config.eos_token_ids, self.generation_config.eos_token_ids)

    def default_sampling(self) -> SamplingParams:
        """generation_config.json's sampling defaults (greedy when it has none)."""
        return self.generation_config.sampling()

    def chat_ids(self, messages: Sequence[Any], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` in the model's chat template (as HF apply_chat_template)."""
        if self.chat_template is None:
            raise errors.GPUKitValueError(
                f"{self.path}: this model has no chat template "
                "(tokenizer_config.json has no chat_template)"
            )
        if self.tokenizer is None:
            raise errors.GPUKitError(f"{self.path}: this model has no tokenizer.json")
        text = self.chat_template.render(messages, add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def dtype(self) -> dtypes.DType:
        """The float dtype of the model's weights and activations."""
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
        """The `Generator` for a static batch size and KV-cache length (one is kept:
        asking for another shape replaces it).

        Args:
            batch: Rows generated together.
            max_seq_len: The KV cache's length (the padded prompt plus new tokens must fit).

        Returns:
            The generator (its prompts run in chunks of `prefill_chunk` tokens, by default
            prefill_chunk_for(batch): 2048 tokens over the batch).
        """
        chunk = self._chunk(batch)
        key = (batch, max_seq_len, chunk)
        if key not in self._generators:
            self._generators = {key: Generator(self.transformer, batch, max_seq_len, chunk)}
        return self._generators[key]

    def _chunk(self, batch: int) -> int:
        """The prefill chunk for this batch: prefill_chunk, else the batch's default."""
        if self.prefill_chunk is None:
            return prefill_chunk_for(batch)
        return check_chunk(self.prefill_chunk)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (with the BOS token the model expects).

        Args:
            text: The text.

        Returns:
            The ids.

        Raises:
            GPUKitError: The model has no tokenizer.json.
        """
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

        Args:
            prompts: One list of token ids per row.
            max_new_tokens: The most tokens to add per row; 0 returns no new tokens and runs
                nothing (as Hugging Face's generate).
            params: The sampling parameters (default greedy).
            max_seq_len: The KV cache's length; by default the longest prompt's bucket plus
                max_new_tokens, rounded up to a power of two and capped at the model's
                max_position_embeddings.
            stop_at_eos: Stop a row at the model's EOS ids (rows are cut after it).
            on_tokens: Called as on_tokens(step, ids) with each new token of every row as it
                arrives (ids: a NumPy array of the batch's tokens).

        Returns:
            The GenerationResult: new tokens per row, prompt lengths, timings, decode steps.

        Raises:
            ValueError: No prompts, an empty prompt, a bad count, or prompts and new tokens that
                do not fit max_seq_len.
        """
        if len(prompts) == 0:
            raise errors.GPUKitValueError("generate: no prompts (the batch must be >= 1)")
        check_count("max_new_tokens", max_new_tokens, 0)
        if max_seq_len is not None:
            check_count("max_seq_len", max_seq_len, 1)
        longest = max(len(p) for p in prompts)
        if max_seq_len is None:
            need = sum(prefill_plan(longest, self._chunk(len(prompts)), 1 << 30))
            need += max_new_tokens
            max_seq_len = min(self.config.max_position_embeddings, bucket(need, 1 << 30))
        pad = self.config.pad_token_id
        pad = pad if pad is not None else (self.config.bos_token_id or 0)
        gen = self.generator(len(prompts), max_seq_len)
        eos = self.eos_token_ids if stop_at_eos else ()
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
        """Text in, text out: generate a continuation of each prompt.

        Args:
            prompt: A string, or a list of strings generated as one batch.
            max_new_tokens: The most tokens to add (generation stops earlier at EOS).
            temperature: 0 is greedy; otherwise the logits are divided by it.
            top_k: Keep the k most likely tokens (0: off).
            top_p: Keep the smallest set of tokens reaching this probability (1: off).
            seed: Seed the sampling noise (reproducible), or None.

        Returns:
            The generated text without the prompt: a string, or a list for a list of prompts.

        Raises:
            GPUKitError: The model has no tokenizer.json.
            ValueError: A sampling value out of range, or prompts too long for the model.
        """
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
    tensor_parallel: int | None = None,
) -> Model:
    """Load a Hugging Face model directory: config.json, *.safetensors, tokenizer.json,
    and when present generation_config.json and tokenizer_config.json's chat template.

    `path` may also be a Hugging Face repo id ("TinyLlama/TinyLlama-1.1B-Chat-v1.0"): it is
    found in the local Hugging Face cache, else downloaded (llm.hub.resolve_model).

    Only regular files inside the directory are read, and the config, the index, every
    header and the tokenizer are checked before any memory is allocated.

    Args:
        path: The model directory, or a Hugging Face repo id.
        dtype: None keeps the checkpoint's float type; "bfloat16", "float32", ... cast on
            load.
        progress: None draws a progress line on a terminal once loading takes more than a
            moment (pygpukit.progress); True always, False never.
        quantize: "int8", "fp8" or "int4" quantizes a float checkpoint's linear weights as
            they stream in (pygpukit.llm.quantize; int4 symmetric). A checkpoint whose
            config.json has a quantization_config (fp8, compressed-tensors fp8 or int8, AWQ,
            GPTQ) loads quantized as it is (pygpukit.llm.quant_checkpoint).
        quantize_group: The int4 group size along K.
        tensor_parallel: N: this process is one of N ranks of gpk.distributed (init(), or
            simulate()) and reads only its shard of each weight (llm/parallel.py).

    Returns:
        The Model, its weights read-only.

    Raises:
        LoadError: A malformed or missing file (a ValueError and an OSError), naming the file
            and the field.
        DTypeError: An unsupported `dtype`.
    """
    if quantize is not None:
        check_quantize(quantize, quantize_group)
    if isinstance(path, str):
        path = resolve_model(path)
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
    gen_cfg, template = _generation_config(model, cfg), _chat_template(model)
    tp, tp_rank = _tensor_parallel(tensor_parallel)
    if tp > 1 and linears is not None:
        raise errors.GPUKitValueError(
            "load: tensor_parallel with quantized weights is not supported yet"
        )
    rank_cfg = rank_config(cfg, tp)
    weight_map = read_index(model)
    t0 = time.perf_counter()
    ckpt = Checkpoint(checkpoint_files(model))
    try:
        if weight_map is not None:
            ckpt.check_index(weight_map, model.path(INDEX))
        weights, used = load_weights(ckpt, cfg, target, progress, config_path, linears,
                                     sharder(tp_rank, tp) if tp > 1 else None)  # fmt: skip
        nbytes = ckpt.loaded_bytes
    finally:
        ckpt.close()
    synchronize()  # the last uploads and device casts are asynchronous
    transformer = parallelize(Transformer(rank_cfg, weights, used), tp)
    out = Model(cfg, transformer, tokenizer, model.given, gen_cfg, template)
    out.load_stats = {"seconds": time.perf_counter() - t0, "bytes": float(nbytes)}
    return out


def _generation_config(model: ModelDir, cfg: ModelConfig) -> GenerationConfig | None:
    if not model.has("generation_config.json"):
        return None
    path = model.path("generation_config.json")
    with model.open("generation_config.json") as f:
        doc = read_json(f, path, "the generation config")
    return GenerationConfig.from_dict(doc, path, cfg.vocab_size)


def _chat_template(model: ModelDir) -> ChatTemplate | None:
    if not model.has("tokenizer_config.json") and not model.has("chat_template.jinja"):
        return None
    cfg: Any = {}
    path = model.path("tokenizer_config.json")
    if model.has("tokenizer_config.json"):
        with model.open("tokenizer_config.json") as f:
            cfg = read_json(f, path, "the tokenizer config")
    jinja = None
    if model.has("chat_template.jinja"):
        with model.open("chat_template.jinja") as f:
            raw = f.read()
        try:
            jinja = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            where = model.path("chat_template.jinja")
            raise LoadError(f"not UTF-8 (byte {e.start})", file=where) from None
    return ChatTemplate.from_tokenizer_config(cfg, path, jinja)


def _tensor_parallel(size: int | None) -> tuple[int, int]:
    """(ranks, this rank) for load(tensor_parallel=size): the communicator must span them."""
    if size is None or size == 1:
        return 1, 0
    from pygpukit import distributed

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise errors.GPUKitValueError(f"load: tensor_parallel must be an integer >= 1, got "
                                      f"{size!r}")  # fmt: skip
    comm = distributed.comm.current("load(tensor_parallel=...)")
    if comm.world_size != size:
        raise errors.DistributedError(f"load: tensor_parallel={size}, but the communicator has "
                                      f"{comm.world_size} ranks")  # fmt: skip
    return size, comm.rank
