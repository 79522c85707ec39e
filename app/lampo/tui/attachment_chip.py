"""An attachment chip: a long paste or an attached file shown as `name · N tokens`, never as text.

The chip's tooltip previews the first lines. A removable chip (in the prompt area) posts
`AttachmentChip.Removed` when clicked; chips inside sent messages are read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import Static

PREVIEW_CHARS = 600


@dataclass(frozen=True)
class ChipInfo:
    name: str
    tokens: int
    chars: int
    preview: str = ""

    @property
    def label(self) -> str:
        return f"📎 {self.name} · {self.tokens:,} tokens"


class AttachmentChip(Static):
    class Removed(Message):
        def __init__(self, chip: "AttachmentChip"):
            super().__init__()
            self.chip = chip

    def __init__(self, info: ChipInfo, *, removable: bool):
        label = info.label + ("  ✕" if removable else "")
        super().__init__(label, classes="chip", markup=False)
        self.info = info
        self.removable = removable
        preview = info.preview[:PREVIEW_CHARS]
        self.tooltip = f"{info.chars:,} characters\n\n{preview}" + ("…" if info.chars > len(preview) else "")

    def on_click(self, event: events.Click) -> None:
        if self.removable:
            event.stop()
            self.post_message(self.Removed(self))
