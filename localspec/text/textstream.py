"""Streaming text out of tokens: UTF-8 pieces that never split a character, cut at stop
strings."""

from __future__ import annotations

import codecs


class TextStream:
    """Incremental UTF-8 decoding with stop strings: never splits a character (one that the
    end of generation cuts off is dropped), and holds back any tail that could still become a
    stop string."""

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
            # a character cut off by the end of generation (max_tokens, a full context) is
            # dropped, as llama-cpp-python does, not shown as U+FFFD; malformed bytes are not
            # a cut and still decode to U+FFFD
            pending, _ = self._dec.getstate()
            if pending and _valid_prefix(pending):
                self._dec.reset()
            else:
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


def decode_text(data: bytes) -> str:
    """The text of a finished generation's bytes, as the events give it: malformed bytes read
    as U+FFFD, a character cut off at the end is dropped."""
    ts = TextStream([])
    ts.feed(data)
    return ts.take(final=True)


def _valid_prefix(data: bytes) -> bool:
    """True when ``data`` starts a UTF-8 character that more bytes could complete. The
    decoder holds back such a start, but also an encoded surrogate (ED A0..BF), which no
    continuation makes valid."""
    size = 2 if data[0] < 0xE0 else 3 if data[0] < 0xF0 else 4
    pad = size - len(data)
    if pad <= 0:
        return False
    # a lead's second byte may be restricted to the low (ED, F4) or high (E0, F0) range
    for fill in (b"\x80", b"\xbf"):
        try:
            (data + fill * pad).decode("utf-8")
            return True
        except UnicodeDecodeError:
            pass
    return False
