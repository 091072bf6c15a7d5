"""The wheels scripts/test.sh built install in a fresh venv on each Python and work from outside
the checkout; they carry a manylinux tag, the LICENSE and the one version; the sdist is complete.

scripts/test.sh builds the sdist, a wheel from it per Python and repairs each with auditwheel,
then points TAILRACE_WHEELHOUSE at them (and TAILRACE_EXPECT_PYTHONS at the Pythons it built
for). Without those variables (a plain `pytest` in a dev checkout) these tests are skipped: they
need the artefacts of a release build, which take a minute per Python to make.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = os.environ.get("TAILRACE_WHEELHOUSE")
SDIST_DIR = os.environ.get("TAILRACE_SDIST_DIR")
EXPECT = os.environ.get("TAILRACE_EXPECT_PYTHONS", "").split()
PLATFORM = os.environ.get("TAILRACE_MANYLINUX", "manylinux_2_17_x86_64")  # what scripts/test.sh asked for

pytestmark = pytest.mark.skipif(
    not WHEELHOUSE, reason="no TAILRACE_WHEELHOUSE: run scripts/test.sh to build the release wheels"
)

# the one place the version lives (pyproject reads it with scikit-build-core's regex provider)
SOURCE_VERSION = re.search(
    r'^__version__ = "([^"]+)"', (ROOT / "pysrc/tailrace/__init__.py").read_text(), re.M
)
assert SOURCE_VERSION is not None
VERSION = SOURCE_VERSION[1]

SMOKE = """
import sys, tailrace, tailrace._core
assert "{checkout}" not in tailrace.__file__, tailrace.__file__
class Double(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("mem.out", envelope.message * 2)

for engine in ("c", "python"):
    mem = tailrace.MemorySystem("mem").add_stream("in", [[1, 2, 3], [4]])
    result = tailrace.Container(Double, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert result.processed == 4, (engine, result)
    assert sorted(mem.messages("out")) == [2, 4, 6, 8], engine
print(tailrace.__version__, "%d.%d" % sys.version_info[:2])
"""


def wheels() -> list[Path]:
    assert WHEELHOUSE is not None
    return sorted(Path(WHEELHOUSE).glob("tailrace-*.whl"))


def python_for(tag: str) -> str:
    """An interpreter for a cpXY wheel tag: this one, on PATH, or under pyenv."""
    major, minor = int(tag[2]), int(tag[3:])
    if sys.version_info[:2] == (major, minor):
        return sys.executable
    version = f"{major}.{minor}"
    candidates = [f"python{version}"]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}*/bin/python{version}"))
    for candidate in candidates:
        try:
            done = subprocess.run([candidate, "-c", "import venv"], capture_output=True, timeout=30)
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    pytest.fail(f"no Python {version} interpreter for the {tag} wheel (PATH, {pyenv}/versions)")


def test_a_wheel_for_every_python_the_build_targets() -> None:
    built = {re.search(r"-cp(\d)(\d+)-", w.name)[0].strip("-") for w in wheels()}  # type: ignore[index]
    assert built, f"no wheels in {WHEELHOUSE}"
    for version in EXPECT:
        assert "cp" + version.replace(".", "") in built, f"no wheel for Python {version} in {WHEELHOUSE}"


@pytest.mark.parametrize("wheel", wheels() if WHEELHOUSE else [], ids=lambda w: w.name)
def test_wheel_is_manylinux_licensed_and_carries_the_one_version(wheel: Path) -> None:
    name, version, *_rest, platform = wheel.stem.split("-")
    assert (name, version) == ("tailrace", VERSION)
    # auditwheel writes both spellings for glibc 2.17: manylinux2014_x86_64.manylinux_2_17_x86_64
    tags = platform.split(".")
    assert any(re.fullmatch(r"manylinux_2_\d+_\w+", t) for t in tags), f"{wheel.name} is not manylinux"
    assert PLATFORM in tags, f"{wheel.name} is not tagged {PLATFORM}"
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        dist_info = f"tailrace-{VERSION}.dist-info"
        assert any(n.startswith(dist_info) and n.endswith("LICENSE") for n in names), names
        metadata = whl.read(f"{dist_info}/METADATA").decode()
        assert f"\nVersion: {VERSION}\n" in metadata
        assert "tailrace/py.typed" in names and "tailrace/_core.pyi" in names
        assert any(re.fullmatch(r"tailrace/_core\.cpython-\d+-x86_64-linux-gnu\.so", n) for n in names)


@pytest.mark.parametrize("wheel", wheels() if WHEELHOUSE else [], ids=lambda w: w.name)
def test_wheel_installs_in_a_fresh_venv_and_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    tag = re.search(r"-(cp\d+)-", wheel.name)[1]  # type: ignore[index]
    venv = tmp_path / "venv"
    subprocess.run([python_for(tag), "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr
    run = subprocess.run(
        [python, "-I", "-c", SMOKE.format(checkout=ROOT)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [VERSION, f"{tag[2]}.{tag[3:]}"]
    cli = subprocess.run(
        [str(venv / "bin" / "tailrace"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0 and "run" in cli.stdout, cli.stderr


def test_sdist_holds_the_sources_the_license_and_the_version() -> None:
    assert SDIST_DIR is not None, "scripts/test.sh sets TAILRACE_SDIST_DIR with TAILRACE_WHEELHOUSE"
    (sdist,) = Path(SDIST_DIR).glob("tailrace-*.tar.gz")
    assert sdist.name == f"tailrace-{VERSION}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"tailrace-{VERSION}/PKG-INFO")
        assert pkg_info is not None
        assert f"\nVersion: {VERSION}\n" in pkg_info.read().decode()
    for needed in ("LICENSE", "pyproject.toml", "CMakeLists.txt", "csrc/CMakeLists.txt"):
        assert needed in names, f"{needed} missing from {sdist.name}"
    tracked = subprocess.run(["git", "ls-files", "csrc", "pysrc"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:  # a git checkout: every tracked source is in the sdist
        missing = sorted(set(tracked.stdout.split()) - names)
        assert not missing, f"{sdist.name} lacks {missing}"
    assert not any(n.startswith((".venv", "build/")) for n in names)
