import os
import shutil
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    """The warmed-up demo model (built once per cache, ~90 s on 2 cores)."""
    from grpo_sentinel.service.demo import demo_model_dir

    return demo_model_dir()


def new_run(parent: Path, cfg, name: str = "r"):
    """A fresh, locked run directory for a Trainer, as the CLI makes one."""
    from grpo_sentinel.service.runs import RunDir

    return RunDir.new(parent, name, cfg)


def cli(*args: str) -> list[str]:
    """Command line of the installed entry point, as a user runs it."""
    return [sys.executable, "-m", "grpo_sentinel.service.cli", *args]


def installed(binary: str, package: str) -> str:
    """Path of a real component the tests run against: in CI its absence fails (.ci/run installs
    it), elsewhere it skips with the command that installs it."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed (.ci/run installs Debian's {package})")
        pytest.skip(f"{binary} not installed: apt-get install {package}")
    return path


@pytest.fixture
def promtool() -> str:
    return installed("promtool", "prometheus")


@pytest.fixture
def amtool() -> str:
    return installed("amtool", "prometheus-alertmanager")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 300.0, every: float = 0.005) -> bool:
    """Poll until predicate() is true; False if `timeout` seconds pass first. Never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def answers(url: str) -> bool:
    """True once a server answers `url` (a started process is not yet a listening one)."""
    try:
        urllib.request.urlopen(url)
        return True
    except OSError:
        return False
