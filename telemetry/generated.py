"""Every generated file of the repository and the function that writes it, in one list:
`grpo-sentinel generate` writes them, `grpo-sentinel generate --check` names each one that differs
from its generator (tests/test_generated.py runs it). Never edit one of these files by hand.

The service adds its own (docs/openapi.json, from the daemon's FastAPI app) when it calls `main`:
`telemetry/` never imports `service/`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

COMMAND = "grpo-sentinel generate"


@dataclass(frozen=True)
class Generated:
    path: str  # relative to the repository root
    text: Callable[[], str]  # the file's whole content
    generator: str  # the module that holds `text`, for the reader of --check's message


def telemetry_files() -> list[Generated]:
    """The files the telemetry half generates. Imported here: the dashboards need the `dashboards` extra."""
    from grpo_sentinel.telemetry import catalogue, dashboard
    from grpo_sentinel.telemetry.health import rules, rules_grafana, rules_helm, runbook

    health, board = "telemetry/health", "telemetry/dashboard.py"
    return [
        Generated("deploy/prometheus/grpo-rules.yml", rules.render, f"{health}/rules.py"),
        Generated("deploy/grafana/grpo-alert-rules.yaml", rules_grafana.render, f"{health}/rules_grafana.py"),
        Generated("deploy/helm/grpo-sentinel/templates/_rules.tpl", rules_helm.template, f"{health}/rules_helm.py"),
        Generated("grafana/dashboards/grpo-health.json", partial(dashboard.render, "health"), board),
        Generated("grafana/dashboards/grpo-service.json", partial(dashboard.render, "service"), board),
        Generated("docs/runbook.md", runbook.markdown, f"{health}/runbook.py"),
        Generated("docs/reference/health-table.md", runbook.health_table, f"{health}/runbook.py"),
        Generated("docs/metrics.md", catalogue.markdown, "telemetry/catalogue.py"),
    ]


def stale(root: Path, files: Iterable[Generated]) -> list[tuple[Generated, str]]:
    """(file, its generated text) for every file that is missing under `root` or differs from it."""
    out = []
    for f in files:
        text, path = f.text(), root / f.path
        if not path.is_file() or path.read_text() != text:
            out.append((f, text))
    return out


def checkout() -> Path:
    """The repository this package runs from (an editable install, or the source tree on sys.path)."""
    return Path(__file__).resolve().parents[1]


def main(files: list[Generated], check: bool, root: Path | None = None) -> int:
    """Write every stale file (or with `check`, only name them): 0 when all were current, 1 when `check`
    found one stale, 2 when `root` is no checkout."""
    root = checkout() if root is None else root
    if not (root / "pyproject.toml").is_file():
        print(f"grpo-sentinel: {root} is not a grpo-sentinel checkout (no pyproject.toml); run it in one, or "
              "give --root", file=sys.stderr)
        return 2
    found = stale(root, files)
    for f, text in found:
        if check:
            print(f"{f.path} is not what {f.generator} generates: run `{COMMAND}`", file=sys.stderr)
        else:
            (root / f.path).parent.mkdir(parents=True, exist_ok=True)
            (root / f.path).write_text(text)
            print(f"wrote {f.path}")
    if check and found:
        return 1
    if not found:
        print(f"all {len(files)} generated files are current")
    return 0
