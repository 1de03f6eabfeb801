"""The fixtures every test file can ask for; plain helpers are in helpers.py."""
from pathlib import Path

import pytest

from helpers import installed, prometheus_server


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
