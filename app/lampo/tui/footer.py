"""Textual's footer without its key leak.

Each key the footer composes binds its `compact` to the footer's (`data_bind`), which adds a
watcher on the footer that holds the key. Textual (8.2) drops the watchers of removed keys only
when `compact` next changes, and the footer re-composes its keys whenever the bindings change (a
dialog opens or closes, the focus moves), so every visit to a dialog kept the old keys alive for
good. This footer drops those watchers after each re-compose.
"""

from __future__ import annotations

from textual.widgets import Footer


class LampoFooter(Footer):
    async def recompose(self) -> None:
        await super().recompose()
        watchers: dict[str, list] = getattr(self, "__watchers", {})
        for callbacks in watchers.values():
            callbacks[:] = [(node, callback) for node, callback in callbacks if node.is_attached]
