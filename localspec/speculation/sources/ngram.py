"""The drafter-free source: continuations of the current stream found earlier in it (the
prompt, the conversation's earlier turns, what was generated) or, bounded, in the session's
other generations (ngram_index.py holds the indexes and says why they are built as they are).

The stream is every emitted token: the prompt, then each step's accepted drafts and the
target's own token. A proposal is the longest match's continuation (a chain) and, as extra
branches, the continuations that followed the same n-gram with other next tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..drafttree import NGRAM, DraftTree
from .ngram_index import MAX_MATCH, Continuation, NGramIndex, SessionStore

CONTEXT_CAPACITY = 1 << 20  # tokens of the current stream indexed (far above any context)
SESSION_CAPACITY = 1 << 16  # tokens of the session's other generations
ALT_LEN = 4  # tokens per alternative branch


@dataclass(frozen=True)
class NGramOffer:
    """What the n-gram index proposes for this step: the length of the context it matched
    and the continuations it has (auto's source choice prices it from these)."""

    match_len: int
    length: int  # tokens of the main continuation available
    alternatives: int  # further continuations (other next tokens) available


@dataclass(frozen=True)
class NGramProposal:
    continuations: list[Continuation]  # best first; the first is the main one

    @property
    def offer(self) -> NGramOffer:
        main = self.continuations[0]
        return NGramOffer(main.match_len, len(main.tokens), len(self.continuations) - 1)


class NGramSource:
    def __init__(self) -> None:
        self.context = NGramIndex(capacity=CONTEXT_CAPACITY)
        self.session = SessionStore(capacity=SESSION_CAPACITY)
        self._generated_from = 0
        # emitted tokens not yet indexed: they join the index at the next read, in one
        # extend (cheaper per token than one each step while auto's lookups rest)
        self._pending: list[int] = []

    def _catch_up(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self.context.extend(pending)

    def sync(self, stream: Sequence[int]) -> None:
        """Make the index hold exactly this stream (a new call's prompt and first token):
        what it shares with the indexed stream is kept, the rest replaced."""
        self._catch_up()
        have = self.context.tokens
        n = min(len(have), len(stream))
        i = 0
        while i < n and have[i] == stream[i]:
            i += 1
        if i < len(have):
            self.context.truncate(i)
        self.context.extend(stream[i:])
        self._generated_from = len(stream) - 1  # the first token chosen by the target

    def extend(self, tokens: Sequence[int]) -> None:
        """Emitted tokens join the stream (indexed when the index is next read)."""
        self._pending.extend(tokens)

    def lookup(self, max_len: int, branches: int) -> NGramProposal | None:
        """The best continuations of the stream's end: from the stream itself, or from the
        session's memory when that matches longer."""
        self._catch_up()
        found = self.context.lookup(max_len, branches)
        if len(self.session):
            query = self.context.tokens[-MAX_MATCH:]
            other = self.session.lookup(query, max_len, branches)
            if other and (not found or other[0].match_len > found[0].match_len):
                found = other
        found = [c for c in found if c.tokens]
        return NGramProposal(found) if found else None

    def draft(self, proposal: NGramProposal, length: int, alternatives: int) -> DraftTree:
        """The main continuation's first `length` tokens and up to `alternatives` other
        continuations (ALT_LEN tokens each) as branches under the root."""
        tree = DraftTree()
        spine, parent = [], -1
        for t in proposal.continuations[0].tokens[:length]:
            parent = tree.add(t, parent, NGRAM)
            spine.append(parent)
        tree.spine[NGRAM] = spine
        for alt in proposal.continuations[1 : 1 + alternatives]:
            parent = -1
            for j, t in enumerate(alt.tokens[:ALT_LEN]):
                parent = tree.add(t, parent, NGRAM)
                if j == 0:
                    tree.alternatives.append(parent)
        return tree

    def remember(self) -> None:
        """What the call generated (with the prompt's last tokens before it, so its start can
        match) joins the session's memory, bounded, the oldest forgotten."""
        self._catch_up()
        start = max(0, self._generated_from - MAX_MATCH)
        if len(self.context) - self._generated_from > 1:
            self.session.add(self.context.tokens[start:])

    def forget(self) -> None:
        self._pending = []
        self.context.clear()
        self.session.clear()
        self._generated_from = 0

    @property
    def nbytes(self) -> int:
        self._catch_up()
        return self.context.nbytes + self.session.nbytes
