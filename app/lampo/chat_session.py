"""`ChatSession`: the chat controller both UIs drive (no UI code here).

It owns the active conversation: `turns` (the stored messages of the active branch, root first),
the chat's system prompt, sampling and thinking switch, and persists everything to the `Store`
as it happens (the chat row is created at the first send, so empty chats leave no trace).

Generation (`send`, `regenerate`, `edit_last_user`) validates eagerly - a prompt that does not fit
raises `ContextOverflow` at call time, before anything changes - and returns an iterator of the
backend's events, meant to be consumed in a worker thread. While it runs, `reply_raw` holds the
text generated so far and `reply_parts()` its (reasoning, answer) split. When the backend reports
`Done` the assistant message is stored; a cancelled reply is kept as far as it got, marked
`stopped` (an empty cancelled reply is not stored). Regenerating and editing never delete: they
add a sibling branch (`parent_id`) and move the chat's head to it.

Each request asks the backend to snapshot its state at the end of the last user turn, so the
next turn - or a regenerate - resumes there instead of prefilling the whole history again.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Iterator, Sequence

from lampo.attachments import Attachment, user_content
from lampo.backend import Backend, ContextOverflow, Done, Event, GenerationRequest, Stats, TokenEvent
from lampo.models.chat_format import Message, Prompt, build_prompt, render, split_reasoning
from lampo.models.sampling_params import SamplingParams
from lampo.store import ChatRecord, MessageRecord, Store

NEW_CHAT_TITLE = "New chat"
TITLE_CHARS = 60


class ChatSession:
    def __init__(self, backend: Backend, tokenizer, store: Store, *, system_prompt: str = "",
                 sampling: SamplingParams | None = None, thinking: bool = True):
        self.backend, self.tokenizer, self.store = backend, tokenizer, store
        self._defaults = (system_prompt, sampling or SamplingParams(), thinking)
        self._cancel = threading.Event()
        self._counts: dict[str, int] = {}  # memo: rendered history prefix -> token count
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
            self._context_used = self._count(render(self.messages, add_generation_prompt=False)) \
                if self.turns else 0
        return self._context_used

    def add_attachment(self, name: str, text: str) -> Attachment:
        """Count the text's tokens and store it once (deduplicated by SHA-256)."""
        attachment = Attachment.create(name, text, self.tokenizer)
        self.store.put_attachment(attachment)
        return attachment

    def pending_tokens(self, draft: str, attachments: Sequence[Attachment] = ()) -> int:
        """Prompt tokens if `draft` (+ attachments) were sent now, generation prompt included."""
        return self._count_prompt(self.turns + [self._user(draft, attachments)])

    def check_fits(self, draft: str, attachments: Sequence[Attachment] = ()) -> None:
        """Raise ContextOverflow (with the numbers) when the next prompt does not fit."""
        self._fit(self.pending_tokens(draft, attachments))

    def reply_parts(self) -> tuple[str, str]:
        """(reasoning, answer) of `reply_raw`, the reply being generated or the last one."""
        if not self._reply_thinking:
            return "", self.reply_raw.strip()
        return split_reasoning(self.reply_raw)

    # ---- generation ---------------------------------------------------------------------------
    def send(self, text: str, attachments: Sequence[Attachment] = ()) -> Iterator[Event]:
        """Append a user message and generate the reply (see the module docstring)."""
        if not text.strip() and not attachments:
            raise ValueError("nothing to send: the message is empty")
        user = self._user(text, attachments)
        prompt = self._prompt(self.turns + [user])
        self._ensure_chat(text, attachments)
        return self._generate(prompt, self._store_user(user, self._head_id()))

    def regenerate(self) -> Iterator[Event]:
        """Generate a new reply to the last user message (the old reply stays as a branch)."""
        if not self.turns:
            raise ValueError("nothing to regenerate: the chat is empty")
        user_index = len(self.turns) - (2 if self.turns[-1].role == "assistant" else 1)
        prompt = self._prompt(self.turns[: user_index + 1])
        del self.turns[user_index + 1:]
        self._save_chat(head_id=self.turns[-1].id)
        return self._generate(prompt, self.turns[-1])

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
        prompt = self._prompt(self.turns[:index] + [user])
        del self.turns[index:]
        return self._generate(prompt, self._store_user(user, old.parent_id))

    @property
    def reply_raw(self) -> str:
        """The raw text of the reply being generated (or the last one), thinking included."""
        return "".join(self._reply_pieces)

    def cancel(self) -> None:
        """Stop the running generation (the partial reply is kept)."""
        self._cancel.set()

    def _generate(self, prompt: Prompt, user: MessageRecord) -> Iterator[Event]:
        self._cancel.clear()
        self._reply_pieces, self.last_done, self._context_used = [], None, None
        self._reply_thinking = self.thinking
        request = GenerationRequest(prompt.ids, self.sampling, snapshot_at=(prompt.reuse_boundary,))
        events = self.backend.generate(request, self._cancel)
        return self._stream(events, user)

    def _stream(self, events: Iterator[Event], user: MessageRecord) -> Iterator[Event]:
        done: Done | None = None
        try:
            for event in events:
                if isinstance(event, TokenEvent):
                    self._reply_pieces.append(event.text)  # joined on demand: no O(n^2) re-copying
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
            self._finish(user, done or Done("cancelled", self.last_stats or Stats(), "interrupted"))

    def _finish(self, user: MessageRecord, done: Done) -> None:
        self.last_done, self.last_stats = done, done.stats
        self._context_used = done.stats.context_used or None
        if done.reason in ("cancelled", "error") and not self.reply_raw:
            return
        reasoning, answer = self.reply_parts()
        stats = {"reason": done.reason, "error": done.error, **asdict(done.stats)}
        stopped = done.reason in ("cancelled", "error")
        message_id = self.store.add_message(self.chat_id, user.id, "assistant", answer,
                                            reasoning=reasoning, stopped=stopped, stats=stats)
        self.turns.append(MessageRecord(message_id, self.chat_id, user.id, "assistant", answer,
                                        reasoning, stopped, stats=stats))

    # ---- chats --------------------------------------------------------------------------------
    def new_chat(self) -> None:
        """Start an empty chat with the default settings and let the engine drop its state."""
        self._reset_fields()
        self.backend.reset()

    def load(self, chat_id: int) -> None:
        """Resume a stored chat; the engine re-prefills its history on the next send."""
        chat = self.store.get_chat(chat_id)
        self._reset_fields()
        self.backend.reset()
        self.chat_id, self.title = chat.id, chat.title
        self.system_prompt, self.sampling, self.thinking = chat.system_prompt, chat.sampling, chat.thinking
        self.turns = self.store.branch(chat.id, chat.head_id)
        self._context_used = None

    def list_chats(self) -> list[ChatRecord]:
        return self.store.list_chats()

    def rename(self, title: str, chat_id: int | None = None) -> None:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a chat title cannot be empty")
        target = self.chat_id if chat_id is None else chat_id
        if target == self.chat_id:
            self.title = title
        if target is not None:
            self.store.update_chat(target, title=title)

    def delete(self, chat_id: int | None = None) -> None:
        """Delete a stored chat (default: this one, which then becomes a new empty chat)."""
        target = self.chat_id if chat_id is None else chat_id
        if target is not None:
            self.store.delete_chat(target)
        if target == self.chat_id:
            self.new_chat()

    def set_sampling(self, sampling: SamplingParams) -> None:
        sampling.validate()
        self.sampling = sampling
        self._save_chat(sampling=sampling)

    def set_thinking(self, on: bool) -> None:
        self.thinking = on
        self._save_chat(thinking=on)

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text
        self._context_used = None
        self._save_chat(system_prompt=text)

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

    def _head_id(self) -> int | None:
        return self.turns[-1].id if self.turns else None

    def _ensure_chat(self, text: str, attachments: Sequence[Attachment]) -> None:
        if self.chat_id is None:
            if self.title == NEW_CHAT_TITLE:
                self.title = _title_from(text, attachments)
            self.chat_id = self.store.create_chat(self.title, self.system_prompt, self.sampling, self.thinking)

    def _store_user(self, user: MessageRecord, parent_id: int | None) -> MessageRecord:
        message_id = self.store.add_message(self.chat_id, parent_id, "user", user.content,
                                            attachments=user.attachments)
        record = MessageRecord(message_id, self.chat_id, parent_id, "user", user.content,
                               attachments=user.attachments)
        self.turns.append(record)
        return record

    def _save_chat(self, **changes) -> None:
        if self.chat_id is not None:
            self.store.update_chat(self.chat_id, **changes)

    def _messages_for(self, turns: Sequence[MessageRecord]) -> list[Message]:
        system = [Message("system", self.system_prompt)] if self.system_prompt.strip() else []
        return system + [_as_message(t) for t in turns]

    def _prompt(self, turns: Sequence[MessageRecord]) -> Prompt:
        prompt = build_prompt(self.tokenizer, self._messages_for(turns), enable_thinking=self.thinking)
        self._fit(len(prompt.ids))
        return prompt

    def _count_prompt(self, turns: Sequence[MessageRecord]) -> int:
        """Token count as build_prompt would give, tokenizing only the last turn each time: the
        history before it is memoised (the split falls before `<|im_start|>`, an added token,
        so counts add up exactly)."""
        text = render(self._messages_for(turns), enable_thinking=self.thinking)
        last_turn = text.rfind("<|im_start|>user\n")
        return self._count(text[:last_turn], memo=True) + self._count(text[last_turn:])

    def _count(self, text: str, memo: bool = False) -> int:
        if not memo:
            return self.tokenizer.count(text)
        if text not in self._counts:
            self._counts = {text: self.tokenizer.count(text)}  # keep one entry: the live history
        return self._counts[text]

    def _fit(self, prompt_tokens: int) -> None:
        if prompt_tokens > self.context_max:
            raise ContextOverflow(prompt_tokens, self.sampling.max_tokens, self.context_max)


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
            if turn.stopped:
                out += ["*(stopped)*", ""]
    return "\n".join(out).rstrip() + "\n"
