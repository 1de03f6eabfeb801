import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    """The warmed-up demo model (built once per cache, ~90 s on 2 cores)."""
    from service.demo import demo_model_dir

    return demo_model_dir()


def cli(*args: str) -> list[str]:
    """Command line of the installed entry point, as a user runs it."""
    return [sys.executable, "-m", "service.cli", *args]
