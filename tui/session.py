"""The conversation in memory and in the store, kept in agreement after every reply.

A turn (a prompt and its reply) enters the history and the store together: a failed reply
leaves both untouched, a stopped one is kept whole. When the store refuses a write (locked,
full, read-only), the turn stays in memory and in `unsaved`, and every later save retries it.
"""

from __future__ import annotations

from .store import ChatStore, HistoryError, Message, Turn


class ChatSession:
    def __init__(self, store: ChatStore, *, system: str = "") -> None:
        self.store = store
        self.system = system
        self.conversation_id: int | None = None  # None until its first turn is saved
        self.history: list[dict[str, str]] = []  # whole turns only
        self.unsaved: list[Turn] = []
        self.target = ""  # recorded with a new conversation
        self.draft = ""

    def messages_for(self, prompt: str) -> list[dict[str, str]]:
        """The chat to send for a new prompt: system, the turns so far, the prompt."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, {"role": "user", "content": prompt}]

    def add_turn(self, turn: Turn) -> HistoryError | None:
        """Keep a finished (or stopped) turn; returns why it could not be saved, if so."""
        self.history += [
            {"role": "user", "content": turn.prompt},
            {"role": "assistant", "content": turn.reply},
        ]
        self.unsaved.append(turn)
        return self.save()

    def save(self) -> HistoryError | None:
        """Write the unsaved turns in one transaction (creating the conversation if new)."""
        if not self.unsaved:
            return None
        try:
            self.conversation_id = self.store.add_turns(
                self.conversation_id,
                self.unsaved,
                title=self.unsaved[0].prompt[:60],
                target=self.target,
                draft=self.draft,
                system=self.system,
            )
        except HistoryError as exc:
            return exc
        self.unsaved.clear()
        return None

    def set_system(self, system: str) -> None:
        """Raises HistoryError if a saved conversation cannot record it (memory has it)."""
        self.system = system
        if self.conversation_id is not None:
            self.store.set_system(self.conversation_id, system)

    def reset(self) -> None:
        self.conversation_id, self.history, self.unsaved = None, [], []

    def open(self, conversation_id: int) -> tuple[str, list[Message]]:
        """Load a saved conversation (HistoryError if it cannot be read); returns its title
        and messages."""
        conv = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        self.reset()
        self.conversation_id, self.system = conversation_id, conv.system
        self.history = [{"role": m.role, "content": m.content} for m in messages]
        return conv.title, messages
