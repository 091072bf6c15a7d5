"""The README's install and test commands work from a checkout (issue 38, item 10): extras are
installed as ``.[extra]`` (``tailrace[extra]`` names a package on an index, not the checkout),
several in one command; the suite's duration is stated and a quick subset is given."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
EXTRAS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
PIP_EXTRAS = re.compile(r"pip install '([^'\[]*)\[([^\]]*)\]'")


def test_every_extra_is_installed_from_the_checkout() -> None:
    found = PIP_EXTRAS.findall(README)
    assert found
    for target, extras in found:
        assert target == ".", f"pip install '{target}[{extras}]' does not install the checkout"
        assert set(extras.split(",")) <= EXTRAS, extras


def test_several_extras_are_installed_in_one_command() -> None:
    assert any(len(extras.split(",")) > 1 for _, extras in PIP_EXTRAS.findall(README))


def test_the_suite_s_duration_and_a_quick_subset_are_given() -> None:
    assert re.search(r"about \d+ minutes", README.split("bash scripts/test.sh")[0])
    smoke = re.search(r"python -m pytest [^\n`]*", README)
    assert smoke, "no quick pytest command"
    paths = [a for a in shlex.split(smoke.group()) if a.startswith("tests/")]
    assert paths and all((REPO / p).exists() for p in paths), paths
