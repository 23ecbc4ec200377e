"""The README is for users and short; README.md and docs/*.md carry no dates, clock times, issue
numbers or stories of the machines they were written on, and every relative link in them
resolves (to a file, and to a heading when it names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
#: what may not appear, each with a name for the failure message
FORBIDDEN: dict[str, re.Pattern[str]] = {
    "ISO date": re.compile(r"\b(?:19|20)\d{2}-[01]\d-[0-3]\d\b"),
    "calendar date": re.compile(rf"\b\d{{1,2}} {_MONTH},? (?:19|20)\d{{2}}\b", re.I),
    "calendar date (month first)": re.compile(rf"\b{_MONTH} \d{{1,2}},? (?:19|20)\d{{2}}\b",
                                              re.I),
    "clock time": re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:[–-]\s*\d{1,2}:\d{2}\s*)?UTC\b"),
    "issue number": re.compile(r"\bissues?\s*#?\d+", re.I),
    "machine story": re.compile(r"earlier (?:session|machine)|when this was written|"
                                r"tried here|measured here|today's machine", re.I),
    "path outside the repository": re.compile(r"\.\./shared"),
}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_dates_clock_times_issue_numbers_or_machine_stories(page: Path):
    text = page.read_text()
    found = [f"{what}: {m.group(0)!r}" for what, pattern in FORBIDDEN.items()
             for m in pattern.finditer(text)]
    assert not found, f"{_rel(page)}: {found}"


@pytest.mark.parametrize("text,what", [
    ("Measured on 25 Nov 2026 (08:13–08:35 UTC)", "calendar date"),
    ("measured 2026-11-25 on the", "ISO date"),
    ("(08:13–08:35 UTC)", "clock time"),
    ("from before the warm client (issue 12)", "issue number"),
    ("An earlier session's machine ran", "machine story"),
    ("with MNIST in ../shared/data", "path outside the repository"),
])
def test_the_patterns_catch_what_they_name(text, what):
    assert FORBIDDEN[what].search(text)


def test_the_patterns_leave_ordinary_numbers_alone():
    text = "τ_c = 5, 73.9 %, 1.49 GB, 20–40 s, 127.0.0.1:39091, 0.0.0.0:9090, 3.11, 2.13.0"
    assert not [w for w, p in FORBIDDEN.items() if p.search(text)]


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", body, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path):
    broken = []
    body = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in _LINK.findall(body):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{_rel(page)}: broken links {broken}"
