"""The documentation's commands work as written. Every fenced shell block of the README and of docs/ says what it
needs on the line before its fence: `<!-- runnable -->` (run here, each page's blocks in order in one bash
session, in a fresh directory holding copies of examples/ and deploy/, grpo-sentinel on PATH, the demo model
cached), or `<!-- needs: gpu | cluster | install | langfuse | prometheus -->` (a GPU, a Kubernetes cluster, a pip
install or a venv, a Langfuse server, a Prometheus of the reader's). The examples in examples/ run too."""

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import REPO

# docs/index.md is the README (generated from it): its blocks are the README's
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if p.name != "index.md")]
FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
MARKER = re.compile(r"^<!-- (runnable|needs: (gpu|cluster|install|langfuse|prometheus)) -->$")


def shell_blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, marker, code) of each fenced shell block; marker '' when the line before says nothing."""
    lines, out, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        if FENCE.match(lines[i].strip()):
            j = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
            marker = MARKER.match(lines[i - 1].strip()) if i else None
            out.append((i + 1, marker.group(1) if marker else "", "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


@pytest.mark.unit
def test_every_shell_block_says_whether_it_runs_here():
    unmarked = [f"{p.relative_to(REPO)}:{n}" for p in PAGES for n, marker, _ in shell_blocks(p) if not marker]
    assert not unmarked, "shell blocks without <!-- runnable --> or <!-- needs: ... -->: " + ", ".join(unmarked)
    assert sum(marker == "runnable" for p in PAGES for _, marker, _ in shell_blocks(p)) >= 5


@pytest.fixture(autouse=True)
def one_at_a_time():
    """The docs' commands train on the default /metrics port, as a reader's do: under `pytest -n 2` two pages at
    once would collide on it. A lock file taken by each of these tests serialises them, whatever the worker."""
    with open(Path(tempfile.gettempdir()) / "grpo-sentinel-docs-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _workspace(tmp_path: Path) -> dict:
    for folder in ("examples", "deploy"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}


RUNNABLE = [p for p in PAGES if any(marker == "runnable" for _, marker, _ in shell_blocks(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_runnable_commands_of_a_page_run(page, tmp_path, demo_dir):
    script = "\n".join(code for _, marker, code in shell_blocks(page) if marker == "runnable")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=_workspace(tmp_path),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (f"{page.relative_to(REPO)}:\n{script}\n--- stdout\n{p.stdout[-3000:]}\n"
                               f"--- stderr\n{p.stderr[-3000:]}")


@pytest.mark.slow
def test_the_daemon_walkthrough_runs(tmp_path, demo_dir):
    p = subprocess.run(["bash", str(REPO / "examples" / "daemon_walkthrough.sh")], cwd=tmp_path,
                       env=_workspace(tmp_path), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "run completed at step 20: first" in p.stdout and "run second: stopped" in p.stdout


@pytest.mark.slow
def test_the_trl_example_runs_and_says_where_its_record_is(tmp_path, demo_dir):
    p = subprocess.run([sys.executable, str(REPO / "examples" / "trl_grpo.py")], cwd=tmp_path,
                       env={**_workspace(tmp_path), "STEPS": "4"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run = next((tmp_path / "runs").iterdir())
    assert f"grpo-sentinel: the run record is in runs/{run.name}" in p.stderr
    assert len((run / "steps.csv").read_text().splitlines()) == 1 + 4
