"""The `lampo` command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("lampo: skeleton", file=sys.stderr)
    return 0
