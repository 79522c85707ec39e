"""`LampoApp`: the full-screen chat (transcript, prompt editor, prefill bar, live HUD).

Generation runs in a thread worker (`group="gen"`) that only records the session's events into
a `GenerationFeed`; a frame timer (`frame_hz`, 30 by default) moves whatever arrived since the
last frame into the transcript and the HUD, so the UI stays responsive whatever the engine's
speed. Every action has a binding id equal to its `Settings.keys` name, so the user's key map
applies with `set_keymap` (and the footer follows it); the prompt's placeholder, the edit banner
and the notices name the keys bound. The command palette (ctrl+p) lists every action too.

`clock` (monotonic seconds) and `wall_clock` (epoch seconds, for "2 h ago" in the chat list) are
injectable so snapshots are deterministic.

Over 500 lines on purpose: this is the one place where every user action meets the session (one
`action_*` per key-map entry, each a few lines); the widgets, dialogs, feed and transcript it
drives live in their own modules.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Header, Static
from textual.worker import get_current_worker

import lampo.assets
from lampo.attachments import Attachment
from lampo.engine.protocol import Event
from lampo.chat_session import ChatSession
from lampo.keymap import key_label
from lampo.settings import Settings, write_settings
from lampo.store import MessageRecord
from lampo.tui.attachment_chip import PREVIEW_CHARS, AttachmentChip, ChipInfo
from lampo.tui.commands import LampoCommands
from lampo.tui.export import export_chat
from lampo.tui.generation_feed import GenerationFeed
from lampo.tui.footer import LampoFooter
from lampo.tui.hud import Hud
from lampo.tui.hud_state import HudState
from lampo.tui.message_view import AssistantMessage, UserMessage, code_blocks, reply_footer
from lampo.tui.prefill_progress import PrefillProgressBar
from lampo.tui.prompt_input import PromptInput
from lampo.tui.session_list import SessionListScreen
from lampo.tui.settings_screen import ChatSettings, SettingsScreen
from lampo.tui.terminal_driver import terminal_driver
from lampo.tui.themes import THEMES, theme_setting
from lampo.tui.transcript import Transcript

COUNT_DEBOUNCE_S = 0.25
STYLESHEET = Path(lampo.assets.__file__).parent / "styles" / "lampo.tcss"


def chip_info(attachment: Attachment) -> ChipInfo:
    return ChipInfo(attachment.name, attachment.tokens, len(attachment.text), attachment.text[:PREVIEW_CHARS])


def render_record(record: MessageRecord) -> Widget:
    if record.role == "user":
        return UserMessage(record.content, tuple(chip_info(a) for a in record.attachments))
    return AssistantMessage(record.reasoning, record.content, reply_footer(record.stats))


class LampoApp(App):
    CSS_PATH = STYLESHEET
    TITLE = "Lampo"
    PAUSE_GC_ON_SCROLL = True  # Textual >= 8.1: no cyclic-GC pauses while the transcript scrolls
    COMMANDS = App.COMMANDS | {LampoCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate", priority=True),
        Binding("ctrl+e", "edit_last", "Edit", id="edit_last", priority=True),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat", priority=True, show=False),
        Binding("ctrl+o", "chats", "Chats", id="chats", priority=True),
        Binding("ctrl+t", "toggle_thinking", "Thinking", id="toggle_thinking", priority=True, show=False),
        Binding("ctrl+h", "toggle_hud", "HUD", id="toggle_hud", priority=True, show=False),
        Binding("ctrl+y", "copy_last", "Copy reply", id="copy_last", priority=True, show=False),
        Binding("ctrl+a", "attach", "Attach file", id="attach", priority=True, show=False),
        Binding("ctrl+s", "export", "Export", id="export", priority=True, show=False),
        Binding("f2", "settings", "Settings", id="settings", priority=True),
        Binding("ctrl+pageup", "load_earlier", "Load earlier", id="load_earlier", show=False),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True, show=False),
    ]

    def __init__(self, session: ChatSession, settings: Settings, *, settings_path: Path | None = None,
                 export_dir: Path | None = None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, frame_hz: float = 30.0):
        super().__init__()
        if not 1 <= frame_hz <= 120:
            raise ValueError(f"frame_hz must be in [1, 120] (got {frame_hz})")
        self.session, self.settings = session, settings
        self.settings_path, self.export_dir = settings_path, export_dir
        self.clock, self.wall_clock, self.frame_hz = clock, wall_clock, frame_hz
        self.hud_state = HudState(session.backend.info)
        self.attachments: list[Attachment] = []
        self.generating = False
        self.displayed_tokens = 0  # tokens of the live reply shown so far (UI benchmark)
        self._feed = GenerationFeed()
        self._live: AssistantMessage | None = None
        self._frame_timer: Timer | None = None
        self._count_timer: Timer | None = None
        self._editing = False
        self._restore: tuple[str, tuple[Attachment, ...], bool] | None = None  # draft to restore on refusal
        self._paste_count = 0
        for theme in THEMES.values():
            self.register_theme(theme)
        self.theme = THEMES[settings.theme].name

    # ---- layout ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Transcript(render_record, id="transcript")
        yield PrefillProgressBar(clock=self.clock, stop_key=self._key("stop"), id="prefill")
        send, stop = self._key("send"), self._key("stop")  # the texts name the keys bound
        with Vertical(id="composer"):
            yield Horizontal(id="chips")
            yield Static(f"Editing your last message: {send} resends it as a new branch, {stop} cancels.",
                         id="edit-banner", markup=False)
            prompt = PromptInput(paste_threshold=self.settings.paste_threshold, id="prompt")
            prompt.placeholder = f"Message ({send} sends, ctrl+j newline, ctrl+p commands, /attach FILE)"
            yield prompt
        yield Hud(id="hud")
        yield LampoFooter()

    def _key(self, action: str) -> str:
        """The key bound to `action` (a `Settings.keys` name) as texts name it: "Enter", "f8"."""
        return key_label(self.settings.keys[action])

    @property
    def _still_generating(self) -> str:
        return f"A reply is still being generated: {self._key('stop')} stops it."

    async def on_mount(self) -> None:
        self.set_keymap(dict(self.settings.keys))
        await self._show_chat()
        self.prompt.focus()
        if self.session.store.notice:
            self.notify(self.session.store.notice, severity="warning", timeout=15, markup=False)
        self.hud.set_interval(1.0, self._show_store_warnings)  # widget-owned: stops at exit

    def _show_store_warnings(self) -> None:
        """Saving failed / works again (`ChatSession.take_warnings`, from any thread): one toast each."""
        for warning in self.session.take_warnings():
            self.notify(warning, severity="warning", timeout=15, markup=False)

    def on_unmount(self) -> None:
        self.session.cancel()  # quitting mid-reply: let the generation thread end

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def transcript(self) -> Transcript:
        return self.query_one("#transcript", Transcript)

    @property
    def hud(self) -> Hud:
        return self.query_one("#hud", Hud)

    def _refresh_title(self) -> None:
        s = self.session
        self.sub_title = f"{s.title} · thinking {'on' if s.thinking else 'off'} · T={s.sampling.temperature:g}"

    async def _show_chat(self) -> None:
        """Show the session's current chat from scratch (start, resume, new chat, deletion)."""
        await self.transcript.show(self.session.turns)
        self.prompt.sent_history = [t.content for t in self.session.turns if t.role == "user" and t.content]
        self._refresh_title()
        self.hud_state.last_reply_rate = None
        self.hud_state.rate_samples.clear()
        self._schedule_count()

    def watch_theme(self, theme: str) -> None:
        setting = theme_setting(theme)
        if setting is not None and setting != self.settings.theme:
            self.settings = replace(self.settings, theme=setting)
            self._save_settings()

    def _save_settings(self) -> None:
        """Write the settings file; a failure (read-only config directory) is a warning, and the
        change still holds for this run."""
        try:
            write_settings(self.settings, self.settings_path)
        except OSError as e:
            self.notify(f"The settings could not be saved ({e}); the change holds until you quit.",
                        severity="warning", timeout=8, markup=False)

    # ---- sending -----------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        if self.generating:
            self.notify(self._still_generating, severity="warning")
            return
        if text.strip().startswith("/"):
            await self._slash_command(text.strip())
            return
        if not text.strip() and not self.attachments:
            return
        attachments = tuple(self.attachments)
        editing = self._editing
        self._restore = (text, attachments, editing)
        self.prompt.remember(text)
        self.prompt.take_sent(text)  # not clear(): keys typed after this Enter may be there already
        self._set_attachments([])
        self._set_editing(False)
        # Shown at once: the message being sent, after the turns it follows (the session takes it
        # in the worker, which may refuse it; then `_finish` shows the session's turns again).
        user = MessageRecord(0, self.session.chat_id or 0, None, "user", text, attachments=attachments)
        turns = self.session.turns
        if editing:
            last_user = max(i for i, t in enumerate(turns) if t.role == "user")
            await self._begin(lambda: self.session.edit_last_user(text, attachments), [*turns[:last_user], user])
        else:
            await self._begin(lambda: self.session.send(text, attachments), [*turns, user])

    async def _begin(self, start: Callable[[], Iterable[Event]], shown: list[MessageRecord]) -> None:
        """Show `shown` and a live reply view, then run `start` (the session's generation) in the worker."""
        self._live = AssistantMessage(streaming=True)
        await self.transcript.update(shown, self._live)
        self.transcript.anchor()
        self._feed = GenerationFeed(thinking=self.session.thinking)
        self.generating = True
        self.displayed_tokens = 0
        self.hud_state.begin_reply()
        self.hud_state.pending_tokens = 0
        self.hud.show(self.hud_state)
        self._frame_timer = self.hud.set_interval(  # owned by a widget: stops at exit
            1.0 / self.frame_hz, self._frame)
        self._generate(self._feed, start)

    @work(thread=True, exclusive=True, group="gen")
    def _generate(self, feed: GenerationFeed, start: Callable[[], Iterable[Event]]) -> None:
        feed.consume(start)

    async def _frame(self) -> None:
        """Once a frame while generating: show what arrived since the last frame."""
        feed, live = self._feed, self._live
        tokens, finished = feed.tokens, feed.finished  # read before the text: the text is newer
        prefill = self.query_one("#prefill", PrefillProgressBar)
        if feed.progress is not None and not tokens and not finished:
            prefill.show_progress(feed.progress)
        else:
            prefill.hide()
        if feed.stats is not None:
            self.hud_state.on_stats(feed.stats)
        if live is not None and not finished:
            reasoning, answer = feed.parts()
            await live.show_partial(reasoning, answer)
            self.displayed_tokens = tokens
            self.transcript.park_later()
        self.hud.show(self.hud_state)
        if finished and self._frame_timer is not None:
            # Stopping a timer inside its own callback would cancel this very task mid-await:
            # pause it here, stop it from `_finish`, which runs as its own callback.
            self._frame_timer.pause()
            self.call_later(self._finish)

    async def _finish(self) -> None:
        if self._frame_timer is not None:
            self._frame_timer.stop()
            self._frame_timer = None
        feed, live, session = self._feed, self._live, self.session
        self._live = None
        self.query_one("#prefill", PrefillProgressBar).hide()
        last = session.turns[-1] if session.turns else None
        if feed.done is not None and live is not None and last is not None and last.role == "assistant":
            await live.finish(last.reasoning, last.content, reply_footer(last.stats))  # the stored reply
            self.displayed_tokens = feed.tokens
        await self.transcript.update(session.turns)  # drops the live view when nothing was stored
        if feed.done is None:  # refused, or failed before the backend could finish the reply
            if feed.refused is not None:
                self._restore_draft()
                self.notify(str(feed.refused), title="Not sent", severity="error", timeout=12, markup=False)
            else:
                self.notify(feed.error, title="Error", severity="error", timeout=12, markup=False)
        if feed.done is not None:
            self.hud_state.on_done(feed.done)
            if feed.done.reason == "error":
                self.notify(feed.done.error or "the backend failed", title="Error", severity="error", timeout=12,
                            markup=False)
        self.hud_state.generating = False
        self.hud.show(self.hud_state)
        self.generating = False
        self._refresh_title()
        self._schedule_count()

    def _restore_draft(self) -> None:
        if self._restore is None:
            return
        text, attachments, editing = self._restore
        if not self.prompt.text and not self.attachments:
            self.prompt.load_text(text)
            self.prompt.move_cursor(self.prompt.document.end)
            self._set_attachments(list(attachments))
            self._set_editing(editing)

    # ---- context meter -----------------------------------------------------------------------
    def _schedule_count(self) -> None:
        if self._count_timer is not None:
            self._count_timer.stop()
        self._count_timer = self.hud.set_timer(COUNT_DEBOUNCE_S, self._start_count)  # widget-owned: stops at exit

    def _start_count(self) -> None:
        if not self.generating:
            self._count_pending(self.prompt.text, tuple(self.attachments))

    @work(thread=True, exclusive=True, group="count")
    def _count_pending(self, draft: str, attachments: tuple[Attachment, ...]) -> None:
        used = self.session.context_used
        total = self.session.pending_tokens(draft, attachments) if draft.strip() or attachments else 0
        if not get_current_worker().is_cancelled:
            self.call_from_thread(self._show_context, used, max(0, total - used))

    def _show_context(self, used: int, pending: int) -> None:
        if self.generating:
            return
        self.hud_state.set_context(used, pending)
        try:
            hud = self.hud
        except NoMatches:  # the count finished while the chat screen is covered or closing
            return
        hud.show(self.hud_state)

    @on(PromptInput.Changed, "#prompt")
    def _draft_changed(self) -> None:
        self._schedule_count()

    # ---- attachments -------------------------------------------------------------------------
    @on(PromptInput.LongPaste)
    def _long_paste(self, message: PromptInput.LongPaste) -> None:
        self._paste_count += 1
        self._attach_text(f"Pasted text #{self._paste_count}", message.text)

    @work(thread=True, group="attach")
    def _attach_text(self, name: str, text: str) -> None:
        attachment = self.session.add_attachment(name, text)  # counts tokens: off the UI thread
        self.call_from_thread(self._attachment_ready, attachment)

    def _attachment_ready(self, attachment: Attachment) -> None:
        self._set_attachments([*self.attachments, attachment])
        self.notify(f"{attachment.name}: {attachment.tokens:,} tokens attached", timeout=4, markup=False)

    def _set_attachments(self, attachments: list[Attachment]) -> None:
        self.attachments = attachments
        chips = self.query_one("#chips", Horizontal)
        chips.remove_children()
        chips.mount_all([AttachmentChip(chip_info(a), removable=True) for a in attachments])
        chips.set_class(bool(attachments), "-has-chips")
        self._schedule_count()

    @on(AttachmentChip.Removed)
    def _chip_removed(self, message: AttachmentChip.Removed) -> None:
        index = list(self.query_one("#chips", Horizontal).children).index(message.chip)
        self._set_attachments(self.attachments[:index] + self.attachments[index + 1:])

    def attach_file(self, path_text: str) -> None:
        path = Path(path_text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.notify(f"{path}: no such file", severity="error", markup=False)
        except IsADirectoryError:
            self.notify(f"{path}: is a directory, not a file", severity="error", markup=False)
        except UnicodeDecodeError:
            self.notify(f"{path}: not UTF-8 text (binary files cannot be attached)", severity="error", markup=False)
        except OSError as e:
            self.notify(f"{path}: {e.strerror}", severity="error", markup=False)
        else:
            self._attach_text(path.name, text)

    async def _slash_command(self, command: str) -> None:
        name, _, arg = command.partition(" ")
        if name == "/attach" and arg.strip():
            self.prompt.clear()
            self.attach_file(arg.strip())
        elif name == "/attach":
            self.notify("Usage: /attach FILE", severity="warning")
        else:
            self.notify(f"Unknown command {name}. Commands: /attach FILE; ctrl+p lists every action.",
                        severity="warning", markup=False)

    # ---- actions -----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action != "quit" and isinstance(self.screen, ModalScreen):
            return False  # the main screen's keys must not fire under a dialog
        return True

    def action_stop(self) -> None:
        if self.generating:
            self.session.cancel()
        elif self._editing:
            self._set_editing(False)
            self.prompt.clear()
            self._set_attachments([])

    async def action_regenerate(self) -> None:
        if self.generating:
            self.notify(self._still_generating, severity="warning")
            return
        turns = self.session.turns
        if not turns:
            self.notify("Nothing to regenerate: the chat is empty.", severity="warning")
            return
        self._restore = None
        await self._begin(self.session.regenerate, turns[:-1] if turns[-1].role == "assistant" else list(turns))

    def action_edit_last(self) -> None:
        if self.generating:
            self.notify(self._still_generating, severity="warning")
            return
        last_user = next((t for t in reversed(self.session.turns) if t.role == "user"), None)
        if last_user is None:
            self.notify("No message of yours to edit yet.", severity="warning")
            return
        self.prompt.load_text(last_user.content)
        self.prompt.move_cursor(self.prompt.document.end)
        self._set_attachments(list(last_user.attachments))
        self._set_editing(True)
        self.prompt.focus()

    def _set_editing(self, editing: bool) -> None:
        self._editing = editing
        self.query_one("#edit-banner").set_class(editing, "-editing")

    async def action_new_chat(self) -> None:
        if self.generating:
            self.notify(self._still_generating, severity="warning")
            return
        self.session.new_chat()
        self.hud_state = HudState(self.session.backend.info)
        await self._show_chat()

    def action_chats(self) -> None:
        if self.generating:
            self.notify(self._still_generating, severity="warning")
            return
        self.push_screen(SessionListScreen(self.session, self.wall_clock, self.export_dir), self._chat_chosen)

    async def _chat_chosen(self, chat_id: int | None) -> None:
        """Back from the chat list: resume `chat_id`, else re-show (the current chat may have
        been renamed or deleted there)."""
        if chat_id is not None and chat_id != self.session.chat_id:
            try:
                self.session.load(chat_id)
            except (KeyError, OSError) as e:  # deleted by another Lampo; the store cannot be read
                self.notify(f"That chat could not be opened: {e}", severity="error", markup=False)
            else:
                self.hud_state = HudState(self.session.backend.info)
        await self._show_chat()

    def action_toggle_thinking(self) -> None:
        self.session.set_thinking(not self.session.thinking)
        self._refresh_title()
        self.notify(f"Thinking {'on' if self.session.thinking else 'off'} for this chat.", timeout=3)
        self._schedule_count()

    def action_set_lampo_theme(self, name: str) -> None:
        self.theme = THEMES[name].name  # watch_theme saves it

    def action_toggle_hud(self) -> None:
        self.hud.toggle_class("-hidden")

    def last_reply(self) -> MessageRecord | None:
        return next((t for t in reversed(self.session.turns) if t.role == "assistant"), None)

    def action_copy_last(self) -> None:
        reply = self.last_reply()
        if reply is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(reply.content)
        self.notify(f"Copied the last reply ({len(reply.content):,} characters).", timeout=3)

    def action_copy_code(self, index: int = -1) -> None:
        reply = self.last_reply()
        blocks = code_blocks(reply.content) if reply else []
        if not blocks:
            self.notify("The last reply has no code block.", severity="warning")
            return
        code = blocks[index]
        self.copy_to_clipboard(code)
        self.notify(f"Copied a code block ({len(code.splitlines())} lines).", timeout=3)

    def action_attach(self) -> None:
        self.prompt.load_text("/attach ")
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def action_export(self) -> None:
        if not self.session.turns:
            self.notify("Nothing to export: the chat is empty.", severity="warning")
            return
        try:
            path = export_chat(self.session, self.session.chat_id, self.export_dir)
        except OSError as e:
            self.notify(f"Export failed: {e}", severity="error", markup=False)
        else:
            self.notify(f"Exported to {path}", timeout=6)

    def action_settings(self) -> None:
        s = self.session
        current = ChatSettings(s.sampling, s.system_prompt, s.thinking, self.settings.theme)
        self.push_screen(SettingsScreen(current), self._settings_chosen)

    def _settings_chosen(self, chosen: tuple[ChatSettings, bool] | None) -> None:
        if chosen is None:
            return
        new, as_default = chosen
        s = self.session
        s.set_sampling(new.sampling)
        if new.system_prompt != s.system_prompt:
            s.set_system_prompt(new.system_prompt)
        if new.thinking != s.thinking:
            s.set_thinking(new.thinking)
        if as_default:
            self.settings = replace(self.settings, sampling=new.sampling, thinking=new.thinking)
            self._save_settings()
        self.theme = THEMES[new.theme].name  # watch_theme saves a changed theme
        self._refresh_title()
        self._schedule_count()

    async def action_load_earlier(self) -> None:
        if not await self.transcript.load_earlier():
            self.notify("This is the beginning of the chat.", timeout=2)


def run_tui(session: ChatSession, settings: Settings) -> None:
    app = LampoApp(session, settings)
    app.driver_class = terminal_driver(app.driver_class)  # terminal input that cannot crash it
    app.run()
