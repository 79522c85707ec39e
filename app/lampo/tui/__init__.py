"""The full-screen Textual UI: `run_tui(session, settings)`."""

from lampo.tui.app import LampoApp, run_tui

__all__ = ["LampoApp", "run_tui"]
