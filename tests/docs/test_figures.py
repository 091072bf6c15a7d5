"""The README's and bench/README.md's figures are current figures, each with the command and the
commit that produced it; the history of how they came about belongs in git (issue 38, item 13)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PERFORMANCE = README.split("## Performance\n", 1)[1].split("\n## ", 1)[0]
BENCH = (REPO / "bench" / "README.md").read_text()
HISTORY = re.compile(
    r"\bsessions? \d+|\(session\b|\bthis (?:commit|session|pass|round)\b|\bround \d+|\bbefore (?:this|the)\b"
    r"|\blast commit\b|\bprevious (?:run|figures|pass)\b|\bnow (?:runs|takes|costs)\b",
    re.I,
)
# bench/README.md tells no story of its own work either: no sessions, passes or before/after figures
BENCH_HISTORY = re.compile(
    HISTORY.pattern + r"|\bsessions?\b|\b(?:first|second|third|last|performance) pass\b"
    r"|\(before\b|\bbefore:|\bbefore ->|\bwas \d|\bfrom \d[\d.,]* \w* ?to \d",
    re.I,
)
COMMAND = re.compile(r"`(?:python bench/\w+\.py|\./build/c-bench/bench/bench_core)\b")
COMMIT = re.compile(r"\b(?:commit|added in) [0-9a-f]{7}\b")
FIGURE = re.compile(r"(?<![\w.])\d[\d,.]*\s?(?:ns|us|µs|ms|s|MiB|msgs?/s|keys/s|rows/s)\b")


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


def _bench_prose() -> str:
    return re.sub(r"```.*?```", "", BENCH, flags=re.S)


def _bench_sections() -> list[tuple[str, str]]:
    """(heading, body) of every ## and ### section of bench/README.md, code blocks left out."""
    parts = re.split(r"^(#{2,3} .*)$", _bench_prose(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_bench_readme_tells_no_history() -> None:
    found = [m.group(0) for m in BENCH_HISTORY.finditer(_bench_prose())]
    assert not found, found


def test_every_bench_figures_section_opens_with_its_command_and_commit() -> None:
    figures = [(h, body) for h, body in _bench_sections() if h.startswith("### Figures")]
    assert len(figures) >= 10
    for heading, body in figures:
        opening = body.strip().split("\n\n", 1)[0]
        assert COMMAND.search(opening), f"{heading}: no command in {opening[:80]}..."
        assert COMMIT.search(opening), f"{heading}: no commit in {opening[:80]}..."


def test_bench_readme_measured_tables_are_in_figures_sections() -> None:
    for heading, body in _bench_sections():
        if heading.startswith("### Figures"):
            continue
        rows = [line for line in body.splitlines() if line.startswith("|") and FIGURE.search(line)]
        assert not rows, f"{heading}: figures outside a Figures section: {rows[:2]}"


def test_bench_readme_every_benchmark_names_its_command() -> None:
    sections = re.split(r"^(## .*)$", BENCH, flags=re.M)
    assert len(sections) >= 2 * 10
    for heading, body in zip(sections[1::2], sections[2::2], strict=True):
        assert re.search(r"python bench/\w+\.py|\./build/c-bench/bench/bench_core", body), heading
    stateful = BENCH.split("## Stateful jobs (issue 34)\n", 1)[1]
    assert "`python bench/e2e.py" in stateful and "`python bench/commit_pause.py" in stateful
