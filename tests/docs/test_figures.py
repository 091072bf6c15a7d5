"""The README's figures are current figures, each with the command and the commit that produced
it; the history of how they came about belongs in git (issue 38, item 13)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PERFORMANCE = README.split("## Performance\n", 1)[1].split("\n## ", 1)[0]
HISTORY = re.compile(
    r"\bsessions? \d+|\(session\b|\bthis (?:commit|session|pass|round)\b|\bround \d+|\bbefore (?:this|the)\b"
    r"|\blast commit\b|\bprevious (?:run|figures|pass)\b|\bnow (?:runs|takes|costs)\b",
    re.I,
)


def _paragraphs() -> list[str]:
    return [p for p in PERFORMANCE.split("\n\n") if re.search(r"\d", p)]


def test_the_performance_section_tells_no_history() -> None:
    found = HISTORY.findall(PERFORMANCE)
    assert not found, found


def test_every_figure_comes_with_its_command_and_commit() -> None:
    paragraphs = _paragraphs()
    assert len(paragraphs) >= 5
    for p in paragraphs[1:]:  # the first says how to read the rest
        assert re.search(r"`python bench/\w+\.py", p), f"no command: {p[:80]}..."
        assert re.search(r"\bcommit [0-9a-f]{7}\b", p), f"no commit: {p[:80]}..."
