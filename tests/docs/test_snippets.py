"""Every runnable snippet of README.md and docs/*.md runs as written and prints what its page
says it prints (issue 38).

A snippet is a fenced ``python``, ``bash`` or ``sh`` block, or a ``text`` block that shows
``$ `` commands. This check runs each one it can:

- a ``python`` block that defines ``test_*`` functions is a pytest module: it must pass;
- any other ``python`` block runs as a script in an empty directory, and prints exactly the
  lines its ``print(...)  # expected`` comments give, in order (nothing when it has none).

Every other snippet says in the page, on the line just before its fence, why this check does not
run it, in an HTML comment (invisible once rendered):

- ``<!-- snippet: not run (REASON) -->``: it cannot run here (it needs Kafka or a job file of
  your own, it installs packages, it is meant to run for minutes, it is a fragment of a program);
- ``<!-- snippet: run by tests/PATH.py -->``: another test runs it as written and compares its
  output (that test must exist and read the page).

An unmarked snippet this check cannot run fails it: a new snippet is either runnable or marked.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
MARKER = re.compile(r"<!-- snippet: (?:not run \((?P<reason>.+)\)|run by (?P<test>tests/[\w/.-]+\.py)) -->")
PRINT_WITH_EXPECTATION = re.compile(r"^print\(.*\)\s+#\s+(?P<expected>.+)$")
SNIPPET_LANGS = {"python", "bash", "sh", "console"}


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    marker: str  # the marker comment before the fence, or ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def is_pytest_module(self) -> bool:
        return re.search(r"^def test_\w+", self.body, re.M) is not None


def _snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            lang, body = m["lang"], m["body"]
            shows_commands = lang == "text" and re.search(r"^\$ ", body, re.M) is not None
            if lang not in SNIPPET_LANGS and not shows_commands:
                continue  # a config file, a shown output, a diagram: nothing to run
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = before.strip() if before.strip().startswith("<!-- snippet:") else ""
            found.append(Snippet(page, text[: m.start()].count("\n") + 1, lang, body, marker))
    return found


SNIPPETS = _snippets()
RUNNABLE = [s for s in SNIPPETS if not s.marker and s.lang == "python"]
MARKED = [s for s in SNIPPETS if s.marker]


def test_the_pages_have_snippets_this_check_runs() -> None:
    assert len(RUNNABLE) >= 8, [s.where for s in RUNNABLE]
    assert any(s.is_pytest_module for s in RUNNABLE)


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if not s.marker], ids=lambda s: s.where)
def test_a_snippet_this_check_cannot_run_is_marked(snippet: Snippet) -> None:
    assert snippet.lang == "python", (
        f"{snippet.where}: a {snippet.lang} snippet needs a marker on the line before its fence: "
        "<!-- snippet: not run (REASON) --> or <!-- snippet: run by tests/PATH.py -->"
    )


@pytest.mark.parametrize("snippet", MARKED, ids=lambda s: s.where)
def test_a_marker_says_why_or_names_a_test_that_reads_the_page(snippet: Snippet) -> None:
    m = MARKER.fullmatch(snippet.marker)
    assert m, f"{snippet.where}: unknown marker {snippet.marker!r}"
    if m["test"]:
        test = REPO / m["test"]
        assert test.is_file(), f"{snippet.where}: {m['test']} does not exist"
        page = snippet.page.relative_to(REPO)
        assert page.name in test.read_text(), f"{m['test']} does not read {page}"


@pytest.mark.parametrize("snippet", RUNNABLE, ids=lambda s: s.where)
def test_a_snippet_runs_as_written_and_prints_what_its_page_says(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.is_pytest_module:
        module = tmp_path / "test_snippet.py"
        module.write_text(snippet.body)
        tests = re.findall(r"^def (test_\w+)", snippet.body, re.M)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{snippet.where}\n{done.stdout}{done.stderr}"
        assert f"{len(tests)} passed" in done.stdout, done.stdout
        return
    expected = [
        m["expected"] for line in snippet.body.splitlines() if (m := PRINT_WITH_EXPECTATION.match(line))
    ]
    done = subprocess.run(
        [sys.executable, "-c", snippet.body], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{snippet.where}\n{done.stderr}"
    printed = done.stdout.splitlines()
    assert printed == expected, f"{snippet.where} printed {printed}; the page says {expected}"
