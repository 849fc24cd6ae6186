"""Every relative link of the README and docs/ leads somewhere: the file exists and, with a
``#fragment``, the page has a heading of that anchor (as GitHub makes them: lower case,
punctuation dropped, spaces as hyphens; a repeated heading gets ``-1``, ``-2``)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.wheelhouse import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def _prose(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    for _, line in _prose(page):
        match = HEADING.match(line)
        if match is None:
            continue
        text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for number, line in _prose(page):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"line {number}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"line {number}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)
