"""gpk.llm.load and the Model it returns: config + weights + tokenizer + generation."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.streams import synchronize

from .config import ModelConfig
from .files import ModelDir, read_json
from .generate import (
    PREFILL_CHUNK,
    GenerationResult,
    Generator,
    bucket,
    check_chunk,
    check_count,
    prefill_plan,
)
from .loader import (
    INDEX,
    Checkpoint,
    LoadError,
    checkpoint_files,
    load_weights,
    read_index,
    weight_names,
)
from .model import Transformer
from .parallel import parallelize, rank_config, sharder
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
        self._generators: dict[tuple[int, int, int], Generator] = {}
        # What gpk.llm.load measured: checkpoint bytes read and the seconds it took.
        self.load_stats: dict[str, float] = {}
        self.prefill_chunk = PREFILL_CHUNK  # tokens per prefill step (a power of two)

    @property
    def dtype(self) -> dtypes.DType:
        return self.transformer.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of distinct weight arrays (a tied LM head counted once)."""
        seen = {id(a): a.nbytes for a in self.transformer.weights.values()}
        return sum(seen.values())

    def generator(self, batch: int, max_seq_len: int) -> Generator:
        """The Generator for this batch size and cache length (the last one is kept)."""
        chunk = check_chunk(self.prefill_chunk)
        key = (batch, max_seq_len, chunk)
        if key not in self._generators:
            self._generators = {key: Generator(self.transformer, batch, max_seq_len, chunk)}
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
            need = sum(prefill_plan(longest, check_chunk(self.prefill_chunk), 1 << 30))
            need += max_new_tokens
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


def load(path: str | os.PathLike[str], dtype: Any = None, progress: bool | None = None,
         tensor_parallel: int | None = None) -> Model:  # fmt: skip
    """Load a Hugging Face model directory: config.json, *.safetensors, tokenizer.json.

    dtype None keeps the checkpoint's float type; "bfloat16"/"float32"/... casts on load.
    Weights come back read-only. progress None draws a bar on a terminal once loading
    takes more than a moment (pygpukit.progress); True always, False never.
    Only regular files inside the directory are read, and the config, the index, every
    header and the tokenizer are checked before any memory is allocated: a malformed
    checkpoint raises a LoadError naming the file and the field.
    tensor_parallel=N: this process is one of N ranks of gpk.distributed (init(), or
    simulate()) and reads only its shard of each weight (llm/parallel.py).
    """
    model = ModelDir(path)
    config_path = model.path("config.json")
    with model.open("config.json") as f:
        cfg = ModelConfig.from_dict(read_json(f, config_path, "the model config"), config_path)
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
    tp, tp_rank = _tensor_parallel(tensor_parallel)
    rank_cfg = rank_config(cfg, tp)
    weight_map = read_index(model)
    t0 = time.perf_counter()
    ckpt = Checkpoint(checkpoint_files(model))
    try:
        if weight_map is not None:
            ckpt.check_index(weight_map, model.path(INDEX))
        weights, used = load_weights(ckpt, cfg, target, progress, config_path,
                                     sharder(tp_rank, tp) if tp > 1 else None)  # fmt: skip
        nbytes = sum(ckpt.info(name).nbytes for name, _ in weight_names(cfg))
    finally:
        ckpt.close()
    synchronize()  # the last uploads and device casts are asynchronous
    transformer = parallelize(Transformer(rank_cfg, weights, used), tp)
    out = Model(cfg, transformer, tokenizer, model.given)
    out.load_stats = {"seconds": time.perf_counter() - t0, "bytes": float(nbytes)}
    return out


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
