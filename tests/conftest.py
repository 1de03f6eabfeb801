"""The fixtures every test file can ask for; plain helpers are in helpers.py."""
import signal
from pathlib import Path

import pytest

from helpers import Daemon, installed, prometheus_server


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    """The warmed-up demo model (built once per cache, ~90 s on 2 cores)."""
    from grpo_sentinel.service.demo import demo_model_dir

    return demo_model_dir()


@pytest.fixture
def promtool() -> str:
    return installed("promtool", "prometheus")


@pytest.fixture
def amtool() -> str:
    return installed("amtool", "prometheus-alertmanager")


@pytest.fixture
def prometheus(tmp_path):
    with prometheus_server(tmp_path) as server:
        yield server


@pytest.fixture
def daemons(tmp_path):
    """daemons(*serve_args, **kw) starts a Daemon (helpers.py); each is SIGKILLed at the end."""
    started = []

    def start(*extra, **kw):
        d = Daemon(tmp_path / "state", *extra, **kw)
        started.append(d)
        return d
    yield start
    for d in started:
        d.stop(signal.SIGKILL)
