"""gpk.llm: SafeTensors Llama/Qwen models, static KV caches, device sampling, generation.

model = gpk.llm.load("path/to/TinyLlama-1.1B", dtype="bfloat16")
text = model.generate("Once upon a time", max_new_tokens=64, temperature=0.8, top_p=0.9)
"""

from __future__ import annotations

from pygpukit.errors import LoadError

from .api import Model, load
from .config import ConfigError, ModelConfig
from .generate import GenerationResult, Generator
from .model import Transformer
from .quantize import quantize_model
from .sampling import SamplingParams, sample
from .tokenizer import Tokenizer

__all__ = [
    "ConfigError", "GenerationResult", "Generator", "LoadError", "Model", "ModelConfig",
    "SamplingParams", "Tokenizer", "Transformer", "load", "quantize_model", "sample",
]  # fmt: skip
