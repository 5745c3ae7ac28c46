"""Token ids to streamed text: incremental detokenization and stop strings.

Byte-level tokens only form characters together, so the text is the decode of all the new
ids, and a delta is sent once it no longer ends in a partial character (U+FFFD). A stop
string ends the text before it; up to len(longest stop) - 1 characters are held back, so
a stop string split across tokens is never partly sent.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed ids, get the text deltas that are safe to send."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tok = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # the text so far (cut at a stop string when one matched)
        self.sent = 0  # characters of self.text already returned
        self.stopped = False

    def feed(self, token: int) -> str:
        """The new text safe to send after `token` (may be empty)."""
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        if text.endswith(REPLACEMENT):
            return ""
        self.text = text
        if self.stop:
            hits = [i for s in self.stop if (i := text.find(s, max(0, self.sent - len(s)))) >= 0]
            if hits:
                self.text = text[: min(hits)]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(max(self.sent, len(self.text) - self.hold))

    def flush(self) -> str:
        """The rest at the end of generation (a held-back tail that was no stop string)."""
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        out = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return out
