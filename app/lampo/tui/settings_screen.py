"""The chat settings dialog: sampling, thinking, system prompt and theme.

Dismisses with `(ChatSettings, as_default)` on Save (`as_default`: also write sampling and
thinking to config.toml as the defaults for new chats) or None on Cancel / Esc. Values are
checked with the settings file's own rules (`parse_sampling`); a bad one keeps the dialog open
and names the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from lampo.models.sampling_params import SamplingParams
from lampo.settings import THEMES, SettingsError, parse_sampling

# (field, label, integer?)
SAMPLING_FIELDS = (
    ("temperature", "Temperature", False),
    ("top_p", "Top-p", False),
    ("top_k", "Top-k", True),
    ("min_p", "Min-p", False),
    ("presence_penalty", "Presence penalty", False),
    ("max_tokens", "Max tokens", True),
    ("seed", "Seed (empty: random)", True),
)


@dataclass(frozen=True)
class ChatSettings:
    sampling: SamplingParams
    system_prompt: str
    thinking: bool
    theme: str


def read_sampling(values: dict[str, str]) -> SamplingParams:
    """Sampling from the dialog's text fields; raises SettingsError naming a bad field."""
    table: dict[str, int | float] = {}
    for name, label, integer in SAMPLING_FIELDS:
        text = values[name].strip()
        if not text and name == "seed":
            continue
        try:
            table[name] = int(text) if integer else float(text)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise SettingsError(f"{label}: {text!r} is not {kind}") from None
    return parse_sampling(table)


class SettingsScreen(ModalScreen[tuple[ChatSettings, bool] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: ChatSettings):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        c = self.current
        with VerticalScroll(classes="dialog"):
            yield Static("Chat settings", classes="dialog-title")
            for name, label, _ in SAMPLING_FIELDS:
                value = getattr(c.sampling, name)
                with Horizontal(classes="field-row"):
                    yield Label(label, classes="field-label")
                    yield Input("" if value is None else str(value), id=f"field-{name}", compact=True)
            yield Checkbox("Thinking: let the model reason before answering", c.thinking,
                           id="field-thinking", compact=True)
            with Horizontal(classes="field-row"):
                yield Label("Theme", classes="field-label")
                yield Select([(t, t) for t in THEMES], value=c.theme, allow_blank=False, id="field-theme",
                             compact=True)
            yield Label("System prompt")
            yield TextArea(c.system_prompt, id="system-prompt", soft_wrap=True)
            yield Checkbox("Also use sampling and thinking as defaults for new chats", id="as-default",
                           compact=True)
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Save", variant="primary", id="save", compact=True)

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        values = {name: self.query_one(f"#field-{name}", Input).value for name, _, _ in SAMPLING_FIELDS}
        try:
            sampling = read_sampling(values)
        except SettingsError as e:
            self.query_one("#settings-error", Static).update(f"⚠ {e}")
            return
        chosen = ChatSettings(
            sampling=sampling,
            system_prompt=self.query_one("#system-prompt", TextArea).text,
            thinking=self.query_one("#field-thinking", Checkbox).value,
            theme=str(self.query_one("#field-theme", Select).value),
        )
        self.dismiss((chosen, self.query_one("#as-default", Checkbox).value))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
