"""The conversation in memory and in the store, kept in agreement after every reply.

`turns` is the active branch, whole turns only: a turn (a prompt and its reply) enters it and
the store together; a failed reply leaves both untouched, a stopped one is kept whole. A retry
(`add_version`) keeps the old reply as a version of the prompt; an edit (`replace_turn`) starts
a new branch at that prompt and keeps the old one in the store. `switch_reply` and
`switch_prompt` browse those versions.

A turn the user saw is never lost. When the store refuses a write (locked, full, read-only),
the turn stays in `turns` and in `unsaved`, and every later save retries the writes in the
order they were made. Each remembers the turn it hangs from (the turn before a new or edited
prompt, the turn whose prompt a retry answers), not an id: that turn is written first, so the
tree comes out as if every write had succeeded at once, whatever failed in between. So a retry
of a turn that is itself unsaved is kept too: both replies are written, as two versions.
Versions exist only in the store: switching first saves what is unsaved, and refuses
(HistoryError) while the store does. `reset` and `open` drop unsaved writes (the app warns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .store import ChatStore, HistoryError, Turn


@dataclass
class _Write:
    """A turn the store has not accepted yet, and the turn it hangs from: for a new turn the
    one before it (None: a first prompt), for a reply version the turn whose prompt it
    answers. That turn was saved before, or is an earlier write, so its ids are known by the
    time this one is written."""

    turn: Turn
    on: Turn | None
    version: bool = False  # a new reply to on's prompt, not a new turn after on


class ChatSession:
    def __init__(self, store: ChatStore, *, system: str = "") -> None:
        self.store = store
        self.system = system
        self.conversation_id: int | None = None  # None until its first turn is saved
        self.turns: list[Turn] = []  # the active branch
        self._writes: list[_Write] = []  # refused by the store so far, oldest first
        self.target = ""  # recorded with a new conversation
        self.draft = ""

    @property
    def history(self) -> list[dict[str, str]]:
        """The active branch as chat messages."""
        return _messages(self.turns)

    @property
    def unsaved(self) -> list[Turn]:
        """Turns and reply versions not written yet, in the order they will be."""
        return [w.turn for w in self._writes]

    def messages_for(self, prompt: str, upto: int | None = None) -> list[dict[str, str]]:
        """The chat to send for a prompt: system, the first `upto` turns (all when None), the
        prompt. A retry of turn i sends its prompt with upto=i; an edit of turn i, the new one."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        turns = self.turns if upto is None else self.turns[:upto]
        return [*system, *_messages(turns), {"role": "user", "content": prompt}]

    def add_turn(self, turn: Turn) -> HistoryError | None:
        """Keep a finished (or stopped) turn; returns why it could not be saved, if so."""
        self._writes.append(_Write(turn, self.turns[-1] if self.turns else None))
        self.turns.append(turn)
        return self.save()

    def add_version(self, reply: str, stats: dict[str, Any] | None) -> HistoryError | None:
        """A retried reply to the last turn's prompt: it becomes the active reply, the old one
        stays a version (even if the old one is still unsaved: both are written, in order).
        Returns why it could not be saved, if so; raises HistoryError if there is no turn."""
        last = self._turn(len(self.turns) - 1)
        n = last.reply_versions + 1  # the store's count once all writes before it are saved
        turn = Turn(last.prompt, reply, stats, last.prompt_id, None,
                    last.prompt_version, last.prompt_versions, n, n)  # fmt: skip
        self._writes.append(_Write(turn, last, version=True))
        self.turns[-1] = turn
        return self.save()

    def replace_turn(self, index: int, turn: Turn) -> HistoryError | None:
        """An edit: turn `index` (0-based) becomes `turn`, a new version of that prompt, and the
        turns after it leave the active branch (they stay in the store, unsaved ones too, as
        the old branch). Returns why it could not be saved, if so; raises HistoryError if there
        is no such turn."""
        old = self._turn(index)
        turn.prompt_version = turn.prompt_versions = old.prompt_versions + 1
        self._writes.append(_Write(turn, self.turns[index - 1] if index else None))
        self.turns[index:] = [turn]
        return self.save()

    def switch_reply(self, index: int, version: int) -> Turn:
        """Show reply version `version` (1-based) of turn `index`, with that reply's newest
        continuation below it; returns the new turns[index]. Raises HistoryError if there is
        no such turn or version, or if the store cannot save what is unsaved or switch."""
        reply_id = self._saved(index).reply_id
        assert reply_id is not None  # set by saving
        return self._switch(index, reply_id, version, "reply")

    def switch_prompt(self, index: int, version: int) -> Turn:
        """Show prompt version `version` (1-based, one per edit) of turn `index`, with the
        branch that followed it; otherwise as switch_reply."""
        prompt_id = self._saved(index).prompt_id
        assert prompt_id is not None
        return self._switch(index, prompt_id, version, "prompt")

    def save(self) -> HistoryError | None:
        """Write the unsaved turns, oldest first (creating the conversation if new); stops at
        the first the store refuses and returns why."""
        while self._writes:
            try:
                self._write(self._writes[0])
            except HistoryError as exc:
                return exc
            del self._writes[0]
        return None

    def set_system(self, system: str) -> None:
        """Raises HistoryError if a saved conversation cannot record it (memory has it)."""
        self.system = system
        if self.conversation_id is not None:
            self.store.set_system(self.conversation_id, system)

    def reset(self) -> None:
        self.conversation_id, self.turns, self._writes = None, [], []

    def open(
        self, conversation_id: int, message_id: int | None = None
    ) -> tuple[str, list[Turn], int | None]:
        """Load a saved conversation (HistoryError if it cannot be read); returns its title, its
        active turns and the index of the turn holding message_id. Given a message_id (a search
        hit), the branch through it becomes the active one, in the store too."""
        conv = self.store.conversation(conversation_id)
        if message_id is not None:
            self.store.set_head(conversation_id, message_id)
        turns = self.store.turns(conversation_id)
        self.reset()
        self.conversation_id, self.system, self.turns = conversation_id, conv.system, turns
        found = [i for i, t in enumerate(turns) if message_id in (t.prompt_id, t.reply_id)]
        return conv.title, turns, found[0] if found else None

    # --- internals ---------------------------------------------------------------------------

    def _turn(self, index: int) -> Turn:
        if not 0 <= index < len(self.turns):
            raise HistoryError(f"there is no turn {index + 1} (the conversation has "
                               f"{len(self.turns)})")  # fmt: skip
        return self.turns[index]

    def _saved(self, index: int) -> Turn:
        """Turn `index` once everything unsaved is written (versions live in the store)."""
        self._turn(index)
        exc = self.save()
        if exc is not None:
            raise exc
        return self.turns[index]

    def _switch(self, index: int, message_id: int, version: int, what: str) -> Turn:
        assert self.conversation_id is not None  # the turn is saved
        versions = self.store.siblings(message_id)
        if not 1 <= version <= len(versions):
            raise HistoryError(
                f"turn {index + 1} has no {what} version {version} (it has {len(versions)})"
            )
        self.store.set_head(self.conversation_id, versions[version - 1].id)
        self.turns = self.store.turns(self.conversation_id)
        return self.turns[index]

    def _write(self, w: _Write) -> None:
        t = w.turn
        if w.version:
            assert w.on is not None and w.on.prompt_id is not None
            assert self.conversation_id is not None
            t.prompt_id = w.on.prompt_id
            t.reply_id = self.store.add_reply(self.conversation_id, t.prompt_id, t.reply, t.stats)
            return
        after = None if w.on is None else w.on.reply_id
        assert w.on is None or after is not None  # written before this one
        self.conversation_id = self.store.add_turns(
            self.conversation_id,
            [t],
            title=t.prompt.strip().split("\n")[0][:60],  # used only if the conversation is new
            target=self.target,
            draft=self.draft,
            system=self.system,
            after=after,
        )


def _messages(turns: list[Turn]) -> list[dict[str, str]]:
    return [
        m
        for t in turns
        for m in ({"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.reply})
    ]
