"""The speculative decoding setting: which drafter a round may use and how many drafts it makes.

`mode`: "auto" (MTP drafts when the checkpoint has an MTP layer, n-gram drafts where the context
repeats, each round's choice by the measured acceptance), "mtp" or "ngram" (that drafter only),
"off" (plain decoding). `drafts`: None lets each round choose 1..MAX_DRAFTS (or a plain step
where drafting does not pay); a count forces that many drafts whenever the drafter can make them.
Spelled MODE[:DRAFTS] on the command line (`--speculate mtp:3`) and by `str()`; config.toml's
[speculation] table holds `mode` and `drafts`. Invalid values raise ValueError saying what is
allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from lampo.models.draft_policy import MODES

MAX_DRAFTS = 4
SPELLING = "MODE or MODE:DRAFTS, e.g. auto, off, ngram, mtp:3"


@dataclass(frozen=True)
class Speculation:
    mode: str = "auto"
    drafts: int | None = None  # None: chosen per round

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"the mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.drafts is not None and (type(self.drafts) is not int or not 1 <= self.drafts <= MAX_DRAFTS):
            raise ValueError(_count_error(self.drafts))
        if self.mode == "off" and self.drafts is not None:
            raise ValueError("off makes no drafts, so it takes no draft count")

    def __str__(self) -> str:
        return self.mode if self.drafts is None else f"{self.mode}:{self.drafts}"

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def for_checkpoint(self, has_mtp: bool) -> tuple[Speculation, str]:
        """What runs on a checkpoint with or without MTP weights, and the line that says how it
        differs from the setting ("" when it does not): mtp without them runs as ngram."""
        if has_mtp or self.mode != "mtp":
            return self, ""
        fallback = Speculation("ngram", self.drafts)
        return fallback, (f"speculation {self}: the checkpoint has no MTP weights (mtp.*), so no MTP drafts; "
                          f"using n-gram drafts ({fallback}) instead")


def _count_error(count) -> str:
    return f"the draft count must be a whole number from 1 to {MAX_DRAFTS} (got {count!r})"


def parse_speculation(text: str) -> Speculation:
    """`auto`, `off`, `mtp`, `ngram`, or one of the drafters with a count: `mtp:3`, `auto:2`."""
    mode, sep, count = text.strip().lower().partition(":")
    try:
        if not sep:
            return Speculation(mode)
        if not count.strip().isdigit():
            raise ValueError(_count_error(count.strip()))
        return Speculation(mode, int(count))
    except ValueError as e:
        raise ValueError(f"{text!r}: {e}; expected {SPELLING}") from None
