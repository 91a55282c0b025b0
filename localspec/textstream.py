"""Streaming text out of tokens: UTF-8 pieces that never split a character, cut at stop
strings."""

from __future__ import annotations

import codecs


class TextStream:
    """Incremental UTF-8 decoding with stop strings: never splits a character, and holds back
    any tail that could still become a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = stops
        self._text = ""
        self._sent = 0
        self._cut: int | None = None

    def feed(self, data: bytes) -> bool:
        """Add bytes; True when a stop string appeared (the text is cut before it)."""
        self._text += self._dec.decode(data)
        for s in self._stops:
            i = self._text.find(s, max(0, self._sent - len(s)))
            if i >= 0 and (self._cut is None or i < self._cut):
                self._cut = i
        return self._cut is not None

    def take(self, *, final: bool) -> str:
        if self._cut is not None:
            end = self._cut
        elif final:
            self._text += self._dec.decode(b"", final=True)
            end = len(self._text)
        else:
            end = len(self._text) - self._holdback()
        out = self._text[self._sent : end]
        self._sent = max(self._sent, end)
        return out

    def _holdback(self) -> int:
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self._text) - self._sent), 0, -1):
                if self._text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        return keep
