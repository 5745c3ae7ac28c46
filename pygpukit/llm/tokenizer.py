"""Text <-> token ids through the `tokenizers` library (the optional `llm` extra)."""

from __future__ import annotations

import os
from typing import Any

from pygpukit import errors
from pygpukit.errors import LoadError

from .files import open_regular


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise errors.GPUKitError(
            'the tokenizer needs the `tokenizers` package: pip install "pygpukit[llm]"'
        ) from None
    return tokenizers


class Tokenizer:
    """A tokenizer.json (Hugging Face fast tokenizer) wrapper; chat templates are not applied."""

    def __init__(self, tok: Any, bos_id: int | None = None) -> None:
        self._tok = tok
        self.bos_id = bos_id

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], bos_id: int | None = None) -> Tokenizer:
        """Read a tokenizer.json (a regular file: a FIFO is refused, not waited on)."""
        path = os.fspath(path)
        with open_regular(path) as f:
            return cls.from_bytes(f.read(), path, bos_id)

    @classmethod
    def from_bytes(cls, raw: bytes, path: str, bos_id: int | None = None) -> Tokenizer:
        """Parse the contents of a tokenizer.json read from `path` (named in errors)."""
        module = _tokenizers()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise LoadError(f"not UTF-8 (byte {e.start}: {e.reason})", file=path) from None
        try:
            tok = module.Tokenizer.from_str(text)
        except Exception as e:  # the library raises its own Exception subclass
            raise LoadError(f"cannot read the tokenizer: {e}", file=path) from None
        return cls(tok, bos_id)

    @property
    def vocab_size(self) -> int:
        """The number of tokens in the vocabulary (added tokens included)."""
        return int(self._tok.get_vocab_size())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`.

        Args:
            text: The text.
            add_special_tokens: Add the special tokens the tokenizer's post-processor adds (and
                the BOS token when the model has one and the tokenizer adds none).

        Returns:
            The ids.
        """
        ids = list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        # A tokenizer without a post-processor adds no BOS; the model may expect one.
        if add_special_tokens and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            if self._tok.post_processor is None:
                ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of token ids.

        Args:
            ids: The ids.
            skip_special_tokens: Leave special tokens (BOS, EOS) out of the text.

        Returns:
            The text.
        """
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string, or None when it is not in the vocabulary.

        Args:
            token: The token, as the vocabulary spells it.

        Returns:
            The id, or None.
        """
        i = self._tok.token_to_id(token)
        return None if i is None else int(i)
