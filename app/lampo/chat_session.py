"""`ChatSession`: the chat controller both UIs drive (no UI code here).

It owns the active conversation: `turns` (the messages of the active branch, root first), the
chat's system prompt, sampling and thinking switch, and persists everything to the `Store` as it
happens (the chat row is created at the first send, so empty chats leave no trace).

Generation (`send`, `regenerate`, `edit_last_user`) validates eagerly - the backend refuses a
prompt that does not fit (`ContextOverflow`) at call time, before anything changes - and returns
an iterator of the backend's events, meant to be consumed in a worker thread. While it runs, `reply_raw` holds the
text generated so far and `reply_parts()` its (reasoning, answer) split. The reply is written to
the store as it grows: its row is inserted at the first generated text (and becomes the chat's
head), then rewritten at most every SAVE_INTERVAL_S seconds, so a crash or kill loses at most
that much; such a row reads back as `interrupted`. When the backend reports `Done` the reply gets
its final write and joins `turns`; a cancelled reply is kept as far as it got, marked `stopped`
(an empty cancelled reply is not stored). Regenerating and editing never delete: they add a
sibling branch (`parent_id`) and move the chat's head to it.

A failed write (full disk, I/O error, read-only file, a lock held too long) never stops the chat:
what was not stored stays in `turns` (id 0 until stored), the front ends hear of it once through
`take_warnings()`, and every later change retries the whole backlog, parents first.

Each request asks the backend to snapshot its state at the end of the last user turn, so the
next turn - or a regenerate - resumes there instead of prefilling the whole history again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, replace
from typing import Any, Iterator, Sequence

from lampo.attachments import Attachment, user_content
from lampo.engine.protocol import Backend, Done, Event, GenerationRequest, Stats, TokenEvent
from lampo.models.chat_format import Message, PromptCounter, TurnEncoder, build_prompt, split_reasoning
from lampo.models.sampling_params import SamplingParams
from lampo.store import ChatRecord, MessageRecord, Store, StoreError

NEW_CHAT_TITLE = "New chat"
TITLE_CHARS = 60
SAVE_INTERVAL_S = 1.0  # a streaming reply is rewritten in the store at most this often


class ChatSession:
    def __init__(self, backend: Backend, tokenizer, store: Store, *, system_prompt: str = "",
                 sampling: SamplingParams | None = None, thinking: bool = True):
        self.backend, self.tokenizer, self.store = backend, tokenizer, store
        self._defaults = (system_prompt, sampling or SamplingParams(), thinking)
        self._cancel = threading.Event()
        self._turn_ids = TurnEncoder(tokenizer)  # the conversation's turns, each tokenized once
        self._counter = PromptCounter(self._turn_ids)
        self._sync_lock = threading.RLock()  # the UI thread and the generation worker both write
        self._warnings: list[str] = []
        self._store_failing = False
        self._reset_fields()

    def _reset_fields(self) -> None:
        self.chat_id: int | None = None
        self.title = NEW_CHAT_TITLE
        self.system_prompt, self.sampling, self.thinking = self._defaults
        self.turns: list[MessageRecord] = []
        self._reply_pieces: list[str] = []
        self._reply_thinking = self.thinking
        self.last_stats: Stats | None = None
        self.last_done: Done | None = None
        self._context_used: int | None = 0
        self._saved_n = 0  # turns[:_saved_n] are in the store in their final form
        self._dirty: set[str] = set()  # chat fields changed since last written
        self._live_id: int | None = None  # the store row of the reply being generated
        self._last_save = float("-inf")  # time.monotonic() of its last write

    # ---- the conversation ---------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """What the model sees: system prompt, then each turn (attachments inlined)."""
        return self._messages_for(self.turns)

    @property
    def context_max(self) -> int:
        return self.backend.info.context_max

    @property
    def context_used(self) -> int:
        """Tokens of the conversation so far (what the engine holds after the last reply)."""
        if self._context_used is None:
            self._context_used = self._counter.conversation_tokens(self.messages) if self.turns else 0
        return self._context_used

    def add_attachment(self, name: str, text: str) -> Attachment:
        """Count the text's tokens and store it once (deduplicated by SHA-256; if that fails, it
        is stored with the message that carries it)."""
        attachment = Attachment.create(name, text, self.tokenizer)
        try:
            self.store.put_attachment(attachment)
        except StoreError as e:
            self._saving_failed(e)
        return attachment

    def take_warnings(self) -> list[str]:
        """Warnings for the user not yet shown (saving failed / works again), oldest first; each
        is returned once. Safe to call from any thread."""
        with self._sync_lock:
            warnings, self._warnings = self._warnings, []
        return warnings

    def pending_tokens(self, draft: str, attachments: Sequence[Attachment] = ()) -> int:
        """Prompt tokens if `draft` (+ attachments) were sent now, generation prompt included."""
        return self._counter.prompt_tokens(self._messages_for(self.turns + [self._user(draft, attachments)]),
                                           enable_thinking=self.thinking)

    def reply_parts(self) -> tuple[str, str]:
        """(reasoning, answer) of `reply_raw`, the reply being generated or the last one."""
        return split_reasoning(self.reply_raw, self._reply_thinking)

    # ---- generation ---------------------------------------------------------------------------
    def send(self, text: str, attachments: Sequence[Attachment] = ()) -> Iterator[Event]:
        """Append a user message and generate the reply (see the module docstring)."""
        if not text.strip() and not attachments:
            raise ValueError("nothing to send: the message is empty")
        user = self._user(text, attachments)
        events = self._start(self.turns + [user])
        if self.chat_id is None and self.title == NEW_CHAT_TITLE:
            self.title = _title_from(text, attachments)
        self._append(user)
        return self._stream(events)

    def regenerate(self) -> Iterator[Event]:
        """Generate a new reply to the last user message (the old reply stays as a branch)."""
        if not self.turns:
            raise ValueError("nothing to regenerate: the chat is empty")
        user_index = len(self.turns) - (2 if self.turns[-1].role == "assistant" else 1)
        events = self._start(self.turns[: user_index + 1])
        self._truncate(user_index + 1)
        self._save_chat("head_id")
        return self._stream(events)

    def edit_last_user(self, text: str, attachments: Sequence[Attachment] | None = None) -> Iterator[Event]:
        """Replace the last user message (as a new branch) and generate a reply to it.
        `attachments=None` keeps the old message's attachments."""
        index = max((i for i, t in enumerate(self.turns) if t.role == "user"), default=None)
        if index is None:
            raise ValueError("no user message to edit")
        old = self.turns[index]
        attachments = old.attachments if attachments is None else attachments
        if not text.strip() and not attachments:
            raise ValueError("nothing to send: the message is empty")
        user = self._user(text, attachments)
        events = self._start(self.turns[:index] + [user])
        self._truncate(index)
        self._append(user)
        return self._stream(events)

    @property
    def reply_raw(self) -> str:
        """The raw text of the reply being generated (or the last one), thinking included."""
        return "".join(self._reply_pieces)

    def cancel(self) -> None:
        """Stop the running generation (the partial reply is kept)."""
        self._cancel.set()

    def _start(self, turns: Sequence[MessageRecord]) -> Iterator[Event]:
        """The backend's reply to `turns`. The backend refuses a prompt that does not fit the
        context (ContextOverflow, with the numbers) before it does anything, and before anything
        here changes: the callers change the conversation only once this returned."""
        prompt = build_prompt(self._turn_ids, self._messages_for(turns), enable_thinking=self.thinking)
        request = GenerationRequest(prompt.ids, self.sampling, snapshot_at=(prompt.reuse_boundary,))
        self._cancel.clear()
        events = self.backend.generate(request, self._cancel)
        self._reply_pieces, self.last_done, self._context_used = [], None, None
        self._reply_thinking = self.thinking
        self._live_id, self._last_save = None, float("-inf")
        return events

    def _stream(self, events: Iterator[Event]) -> Iterator[Event]:
        done: Done | None = None
        try:
            for event in events:
                if isinstance(event, TokenEvent):
                    self._reply_pieces.append(event.text)  # joined on demand: no O(n^2) re-copying
                    self._save_partial()
                elif isinstance(event, Stats):
                    self.last_stats = event
                elif isinstance(event, Done):
                    done = event
                yield event
        except Exception as e:
            done = Done("error", self.last_stats or Stats(), f"{type(e).__name__}: {e}")
            raise
        finally:  # also when the consumer stops early or the backend raises
            close = getattr(events, "close", None)
            if close:
                close()
            self._finish(done or Done("cancelled", self.last_stats or Stats(), "interrupted"))

    def _save_partial(self) -> None:
        """Write the reply so far: at its first text, then at most every SAVE_INTERVAL_S."""
        now = time.monotonic()
        if now - self._last_save < SAVE_INTERVAL_S or not self.reply_raw:
            return
        self._last_save = now
        reasoning, answer = self.reply_parts()
        stats = _stats_dict("interrupted", self.last_stats or Stats())  # what a crash leaves behind
        with self._sync_lock:
            if not self._sync():  # the turns it answers are not stored yet: retried next time
                return
            try:
                if self._live_id is None:
                    self._live_id = self.store.add_message(self.chat_id, self.turns[-1].id, "assistant", answer,
                                                           reasoning=reasoning, stats=stats, complete=False)
                else:
                    self.store.update_message(self._live_id, answer, reasoning=reasoning, stats=stats, complete=False)
            except StoreError as e:
                self._saving_failed(e)
            else:
                self._saving_works()

    def _finish(self, done: Done) -> None:
        self.last_done, self.last_stats = done, done.stats
        self._context_used = done.stats.context_used or None
        if done.reason in ("cancelled", "error") and not self.reply_raw:
            return
        reasoning, answer = self.reply_parts()
        with self._sync_lock:
            self.turns.append(MessageRecord(self._live_id or 0, self.chat_id or 0, self.turns[-1].id, "assistant",
                                            answer, reasoning, done.reason in ("cancelled", "error"),
                                            stats=_stats_dict(done.reason, done.stats, done.error)))
            self._live_id = None
            self._sync()

    # ---- chats --------------------------------------------------------------------------------
    def new_chat(self) -> None:
        """Start an empty chat with the default settings and let the engine drop its state."""
        self._leave(self._sync())

    def load(self, chat_id: int) -> None:
        """Resume a stored chat; the engine re-prefills its history on the next send."""
        stored = self._sync()  # first: reloading this chat must read what it holds
        chat = self.store.get_chat(chat_id)
        turns = self.store.branch(chat.id, chat.head_id)
        self._leave(stored)
        self.chat_id, self.title = chat.id, chat.title
        self.system_prompt, self.sampling, self.thinking = chat.system_prompt, chat.sampling, chat.thinking
        self.turns, self._saved_n = turns, len(turns)
        self._context_used = None

    def list_chats(self) -> list[ChatRecord]:
        return self.store.list_chats()

    def rename(self, title: str, chat_id: int | None = None) -> None:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a chat title cannot be empty")
        if chat_id is None or chat_id == self.chat_id:
            self.title = title
            self._save_chat("title")
        else:
            self.store.update_chat(chat_id, title=title)

    def delete(self, chat_id: int | None = None) -> None:
        """Delete a stored chat (default: this one, which then becomes a new empty chat)."""
        target = self.chat_id if chat_id is None else chat_id
        if target is not None:
            self.store.delete_chat(target)
        if target == self.chat_id:
            self._leave(stored=True)  # nothing of it is wanted any more

    def set_sampling(self, sampling: SamplingParams) -> None:
        sampling.validate()
        self.sampling = sampling
        self._save_chat("sampling")

    def set_thinking(self, on: bool) -> None:
        self.thinking = on
        self._save_chat("thinking")

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text
        self._context_used = None
        self._save_chat("system_prompt")

    def export_markdown(self, chat_id: int | None = None) -> str:
        """The chat (default: this one) as Markdown: reasoning in <details>, attachments listed."""
        if chat_id is None or chat_id == self.chat_id:
            title, system, turns = self.title, self.system_prompt, self.turns
        else:
            chat = self.store.get_chat(chat_id)
            title, system, turns = chat.title, chat.system_prompt, self.store.branch(chat_id, chat.head_id)
        return markdown_transcript(title, system, turns)

    # ---- internals ----------------------------------------------------------------------------
    def _user(self, text: str, attachments: Sequence[Attachment]) -> MessageRecord:
        return MessageRecord(0, self.chat_id or 0, None, "user", text, attachments=tuple(attachments))

    def _leave(self, stored: bool) -> None:
        """Drop this chat for an empty one (the engine drops its state); `stored` False: say
        what of it the store never got."""
        if not stored:
            unsaved = len(self.turns) - self._saved_n
            lost = f"{unsaved} message{'s' if unsaved != 1 else ''}" if unsaved else "its latest settings"
            self._warn(f'"{self.title}" was left with {lost} the chat database never got.')
        self._reset_fields()
        self.backend.reset()

    def _append(self, turn: MessageRecord) -> None:
        with self._sync_lock:
            self.turns.append(turn)
            self._sync()

    def _truncate(self, count: int) -> None:
        with self._sync_lock:
            del self.turns[count:]
            self._saved_n = min(self._saved_n, count)

    def _save_chat(self, *fields: str) -> None:
        with self._sync_lock:
            self._dirty.update(fields)
            self._sync()

    def _sync(self) -> bool:
        """Bring the store up to date with this chat: its row (at the first turn), each turn not
        stored yet (parents first), then changed chat fields. True when nothing is left to write;
        on a StoreError the rest waits for the next call and the user is told (once)."""
        with self._sync_lock:
            backlog = self.chat_id is None or self._saved_n < len(self.turns) or self._dirty
            try:
                if self.chat_id is None:
                    if not self.turns:
                        return True
                    self.chat_id = self.store.create_chat(self.title, self.system_prompt, self.sampling, self.thinking)
                    self._dirty.clear()
                while self._saved_n < len(self.turns):
                    self._store_turn(self._saved_n)
                    self._saved_n += 1
                if self._dirty:
                    self.store.update_chat(self.chat_id, **{f: self._chat_field(f) for f in self._dirty})
                    self._dirty.clear()
            except StoreError as e:
                self._saving_failed(e)
                return False
            if backlog:
                self._saving_works()
            return True

    def _store_turn(self, i: int) -> None:
        turn, parent_id = self.turns[i], (self.turns[i - 1].id if i else None)
        if turn.id:  # a streamed reply: its row exists, this is its final form
            self.store.update_message(turn.id, turn.content, reasoning=turn.reasoning, stopped=turn.stopped,
                                      stats=turn.stats)
        else:
            turn = replace(turn, id=self.store.add_message(
                self.chat_id, parent_id, turn.role, turn.content, reasoning=turn.reasoning,
                stopped=turn.stopped, stats=turn.stats, attachments=turn.attachments))
        self.turns[i] = replace(turn, chat_id=self.chat_id, parent_id=parent_id)

    def _chat_field(self, name: str) -> Any:
        if name == "head_id":  # the reply being written, else the last turn
            return self._live_id or (self.turns[-1].id if self.turns else None)
        return getattr(self, name)

    def _saving_failed(self, error: StoreError) -> None:
        with self._sync_lock:
            if not self._store_failing:
                self._store_failing = True
                self._warn(f"Not saved: {error}. The chat goes on in memory; saving is retried with every change.")

    def _saving_works(self) -> None:
        with self._sync_lock:
            if self._store_failing:
                self._store_failing = False
                self._warn("Saving works again: this chat is stored.")

    def _warn(self, text: str) -> None:
        with self._sync_lock:
            self._warnings.append(text)

    def _messages_for(self, turns: Sequence[MessageRecord]) -> list[Message]:
        system = [Message("system", self.system_prompt)] if self.system_prompt.strip() else []
        return system + [_as_message(t) for t in turns]


def _stats_dict(reason: str, stats: Stats, error: str = "") -> dict[str, Any]:
    """What is stored with a reply: why it ended ("interrupted" while it is being written), and the
    stats as the store's JSON gives them back (tuples as lists)."""
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(stats).items()}
    return {"reason": reason, "error": error, **fields}


def _as_message(turn: MessageRecord) -> Message:
    if turn.role == "user":
        return Message("user", user_content(turn.content, turn.attachments))
    return Message("assistant", turn.content, turn.reasoning)


def _title_from(text: str, attachments: Sequence[Attachment]) -> str:
    words = " ".join(text.split()) or (attachments[0].name if attachments else NEW_CHAT_TITLE)
    return words if len(words) <= TITLE_CHARS else words[: TITLE_CHARS - 1].rstrip() + "…"


def markdown_transcript(title: str, system_prompt: str, turns: Sequence[MessageRecord]) -> str:
    out = [f"# {title}", ""]
    if system_prompt.strip():
        out += ["**System:**", "", system_prompt.strip(), ""]
    for turn in turns:
        if turn.role == "user":
            out += ["## You", ""]
            out += [f"- 📎 {a.name} ({a.tokens:,} tokens)" for a in turn.attachments]
            out += ["", turn.content.strip(), ""]
        else:
            out += ["## Assistant", ""]
            if turn.reasoning.strip():
                out += ["<details><summary>Thinking</summary>", "", turn.reasoning.strip(), "", "</details>", ""]
            out += [turn.content.strip(), ""]
            if turn.interrupted:
                out += ["*(interrupted: Lampo quit before this reply was finished)*", ""]
            elif turn.stopped:
                out += ["*(stopped)*", ""]
    return "\n".join(out).rstrip() + "\n"
