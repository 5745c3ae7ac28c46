"""Model names: a local directory, or a Hugging Face repo id resolved by huggingface_hub.

A repo id already in the local Hugging Face cache resolves without the network; otherwise
it is downloaded (only the files this runtime reads). `tiny` is the built-in test model.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pygpukit.errors import LoadError

# What a model needs; weights in other formats (.bin, .gguf, .pt) are not fetched.
PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]  # fmt: skip
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def looks_like_repo_id(name: str) -> bool:
    """`org/name` that is not an existing path."""
    return bool(_REPO_ID.match(name)) and not os.path.exists(name)


def resolve_model(name: str, revision: str | None = None, offline: bool | None = None) -> str:
    """The local directory of model `name`: an existing directory as given, `tiny` as the
    built-in tiny model, else a Hugging Face repo id from the local cache or downloaded.

    offline None follows HF_HUB_OFFLINE; True never touches the network."""
    if name == "tiny":
        from .tiny import write_tiny_model

        return write_tiny_model()
    if os.path.isdir(name) or not looks_like_repo_id(name):
        return name  # load() says what is wrong with a path that is not a model
    hub = _hub()
    if hub is None:
        raise LoadError(
            "is not a directory; to fetch a Hugging Face repo id install huggingface_hub "
            '(pip install "pygpukit[serve]")',
            file=name,
        )
    try:
        return str(hub.snapshot_download(name, revision=revision, allow_patterns=PATTERNS,
                                         local_files_only=True))  # fmt: skip
    except Exception as cached_miss:  # not in the cache (the library's own error types)
        if offline or (offline is None and _env_offline()):
            raise LoadError(f"not in the local Hugging Face cache and offline ({cached_miss})",
                            file=name) from None  # fmt: skip
    try:
        return str(hub.snapshot_download(name, revision=revision, allow_patterns=PATTERNS))
    except Exception as e:
        raise LoadError(f"cannot download from the Hugging Face Hub: {type(e).__name__}: {e}",
                        file=name) from None  # fmt: skip


def _env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
