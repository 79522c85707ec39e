"""Lampo's two colour themes; settings name them "dark" and "light"."""

from __future__ import annotations

from textual.theme import Theme

LAMPO_DARK = Theme(
    name="lampo-dark",
    primary="#F2A33A",  # lamp amber
    secondary="#7AA2F7",
    accent="#E0AF68",
    warning="#FF9E64",
    error="#F7768E",
    success="#9ECE6A",
    foreground="#D8DEE9",
    background="#16161E",
    surface="#1E1F2B",
    panel="#262838",
    dark=True,
)

LAMPO_LIGHT = Theme(
    name="lampo-light",
    primary="#B85C00",
    secondary="#2E5DA8",
    accent="#A35200",
    warning="#C2410C",
    error="#B42318",
    success="#2F7A2F",
    foreground="#1F2328",
    background="#FBF8F2",
    surface="#F1ECE2",
    panel="#E6DFD1",
    dark=False,
)

THEMES = {"dark": LAMPO_DARK, "light": LAMPO_LIGHT}


def theme_setting(textual_name: str) -> str | None:
    """The settings value ("dark"/"light") of a Textual theme name, None for other themes."""
    return next((key for key, theme in THEMES.items() if theme.name == textual_name), None)
