"""The installed package declares the dependency ranges whose ends were tested.

.ci/lowest.txt lists the lowest versions of torch, transformers and peft (.ci/run installs exactly those
in a second venv and runs a subset of the suite there); .ci/newest.txt the newest the whole suite ran
with. Each range the package's metadata declares must start at the lowest, admit the newest and stop
below an untested major; and the environment running the tests must be one of the two ends (a
newer release that pip starts resolving is said as a skip, so it is noticed instead of claimed as tested).
"""

import importlib.metadata as md
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)

CI = Path(__file__).resolve().parents[1] / ".ci"
PACKAGES = ["torch", "transformers", "peft"]


def pinned(name: str) -> dict[str, Version]:
    """A constraints file's `package==version` lines."""
    lines = (line.split("#")[0].strip() for line in (CI / name).read_text().splitlines())
    reqs = [Requirement(line) for line in lines if line]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs), name
    return {r.name: Version(next(iter(r.specifier)).version) for r in reqs}


LOWEST, NEWEST = pinned("lowest.txt"), pinned("newest.txt")


def declared(package: str):
    """The specifier grpo-sentinel's installed metadata puts on `package` (outside any extra)."""
    (req,) = [r for r in map(Requirement, md.requires("grpo-sentinel")) if r.name == package and not r.marker]
    return req.specifier


@pytest.mark.parametrize("package", PACKAGES)
def test_range_starts_at_the_lowest_tested_version_and_admits_the_newest(package):
    spec = declared(package)
    lower = [s for s in spec if s.operator == ">="]
    upper = [s for s in spec if s.operator == "<"]
    assert [Version(s.version) for s in lower] == [LOWEST[package]], (
        f"{package}: pyproject.toml says {spec}, .ci/lowest.txt tests {LOWEST[package]}: make them the same version")
    assert len(upper) == 1 and len(spec) == 2, f"{package}: {spec} should be '>=lowest,<next major'"
    assert LOWEST[package] <= NEWEST[package] and NEWEST[package] in spec, (package, spec, NEWEST[package])


@pytest.mark.parametrize("package", PACKAGES)
def test_this_environment_is_a_tested_end(package):
    installed = Version(Version(md.version(package)).public)  # 2.13.0+cpu is 2.13.0's CPU build
    if installed > NEWEST[package]:  # a release newer than the record: said, not a failure of ours
        pytest.skip(f"{package} {installed} is newer than .ci/newest.txt's {NEWEST[package]}: if the suite passes "
                    "with it, record it there")
    assert installed in (LOWEST[package], NEWEST[package]), (
        f"{package} {installed} is installed; the tested ends are {LOWEST[package]} (.ci/lowest.txt) and "
        f"{NEWEST[package]} (.ci/newest.txt). If this run passes with it, record it in .ci/newest.txt")
