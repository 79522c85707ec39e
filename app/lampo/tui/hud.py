"""The live performance HUD: decode / prefill speed, speculation, context, VRAM, model.

Three rows of two cells, each cell one line of theme-coloured text built from a `HudState`
(`hud_cells` is pure, so the wording is tested without a terminal). Values that do not apply
show "—": speculation when the backend runs without a draft, VRAM on the CPU backend.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.content import Content
from textual.widgets import Static

from lampo.tui.context_bar import context_bar
from lampo.tui.hud_state import HudState
from lampo.tui.sparkline import sparkline

DASH = "—"
CONTEXT_BAR_CELLS = 12
CELL_IDS = ("decode", "prefill", "spec", "vram", "context", "model")


def _rate(value: float | None) -> str:
    return DASH if value is None else f"{value:,.1f}"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:,.1f}"


def _cell(label: str, body: str, **values) -> Content:
    return Content.from_markup(f"[$text-muted]{label:<8}[/]{body}", **values)


def hud_cells(state: HudState) -> dict[str, Content]:
    """One Content per cell id in `CELL_IDS`."""
    s = state.stats
    spark = sparkline(state.rate_samples, len(state.rate_samples)) if state.rate_samples else ""
    decode = _cell(
        "decode", "[b]$live[/] tok/s  avg [b]$avg[/]  [$accent]$spark",
        live=_rate(state.live_rate), avg=_rate(state.last_reply_rate), spark=spark,
    )
    if s.prompt_n or s.cached_n:
        prefill = _cell(
            "prefill", "[b]$rate[/] tok/s  TTFT [b]$ttft[/] s  [$text-muted]$new new · $cached cached",
            rate=_rate(s.prompt_per_second if s.prompt_ms > 0 else None),
            ttft=f"{s.ttft_ms / 1000:.2f}" if s.ttft_ms else DASH,
            new=f"{s.prompt_n:,}", cached=f"{s.cached_n:,}",
        )
    else:
        prefill = _cell("prefill", DASH)
    if s.draft_n:
        spec = _cell(
            "spec", "[b]$pct[/] accepted  [b]$mean[/] tok/round  [$text-muted]$acc/$drafted",
            pct=f"{s.acceptance:.0%}", mean=f"{s.mean_accepted_length:.2f}",
            acc=f"{s.draft_n_accepted:,}", drafted=f"{s.draft_n:,}",
        )
    else:
        spec = _cell("spec", DASH if not state.info.speculative else "on, no rounds yet")
    vram = (
        _cell("VRAM", "[b]$used[/] / $total GiB", used=_gib(s.vram_used), total=_gib(s.vram_total))
        if s.vram_total else _cell("VRAM", DASH)
    )
    used, pending, ctx_max = state.context_used, state.pending_tokens, state.context_max
    context = Content.assemble(
        _cell("context", ""),
        context_bar(used, pending, ctx_max, CONTEXT_BAR_CELLS),
        Content.from_markup(
            " [b]$used[/] / $max" + (" [$warning]+$pending to send" if pending else ""),
            used=f"{used:,}", max=f"{ctx_max:,}", pending=f"{pending:,}",
        ),
    )
    demo = "[reverse $warning] DEMO (random weights) [/] " if state.info.is_demo else ""
    backend = f"{state.info.backend} {state.info.weights}" if state.info.weights else state.info.backend
    model = _cell("model", demo + "[b]$name[/] · $backend", name=state.info.model_name, backend=backend)
    return dict(zip(CELL_IDS, (decode, prefill, spec, vram, context, model)))


class Hud(Grid):
    """Always-visible HUD; call `show(state)` after changing the state (at most once a frame)."""

    def compose(self) -> ComposeResult:
        for cell_id in CELL_IDS:
            yield Static(id=f"hud-{cell_id}", classes="hud-cell", markup=False)

    def show(self, state: HudState) -> None:
        """Update the cells whose text changed (each update costs a layout pass)."""
        cells = {cell.id: cell for cell in self.query_children(Static)}
        if len(cells) != len(CELL_IDS):
            return  # not composed yet, or being torn down at exit
        for cell_id, content in hud_cells(state).items():
            cell = cells[f"hud-{cell_id}"]
            old = cell.content
            if not isinstance(old, Content) or (old.plain, old.spans) != (content.plain, content.spans):
                cell.update(content)
