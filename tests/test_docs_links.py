"""Every relative link in the README and docs/ reaches a file of the repository, and every
#anchor a heading of its target (GitHub's heading ids: lower case, punctuation dropped, spaces as
hyphens, a repeated heading suffixed -1, -2, ...)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def heading_id(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def heading_ids(markdown: str) -> set[str]:
    ids, seen, fenced = set(), Counter(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = heading_id(m.group(2))
            ids.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return ids


def relative_links(markdown: str) -> list[str]:
    return [t for t in LINK.findall(markdown) if not re.match(r"[a-z]+:", t)]


def test_heading_ids_follow_githubs_rule():
    text = "# Keys as M (b6eddcb, 2026-12-05)\n## `lampo convert`: FP8\n```\n# not a heading\n```\n## Tools\n## Tools\n"
    assert heading_ids(text) == {"keys-as-m-b6eddcb-2026-12-05", "lampo-convert-fp8", "tools", "tools-1"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in relative_links(text):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in heading_ids(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)
