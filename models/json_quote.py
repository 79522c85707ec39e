"""Values of a parsed JSON document quoted in one-line error messages, cut short so that a hostile
file (a 100 MB header, a 5,000-element list) never floods the message."""

from __future__ import annotations

import json
from typing import Any

LIMIT = 60


def quote_json(value: Any, limit: int = LIMIT) -> str:
    """`value` as JSON text (NaN and Infinity as Python's json writes them), at most `limit`
    characters (cut ones end in "...")."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quote_name(name: str, limit: int = 2 * LIMIT) -> str:
    """A key (a tensor name) as Python's repr, cut like `quote_json`."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 4] + "...'"
