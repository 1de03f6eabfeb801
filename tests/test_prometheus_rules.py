"""Alert rules: promtool-valid, unit-tested, only catalogue metrics, runbook anchors that exist."""

import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import REPO
from telemetry.catalogue import CATALOGUE
from telemetry.health.table import runbook_markdown

RULES = REPO / "deploy" / "prometheus" / "grpo-rules.yml"


@pytest.fixture
def promtool():
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed (.ci/run installs Debian's prometheus)")
        pytest.skip("promtool not installed")
    return path


def test_rules_parse(promtool):
    p = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_rule_unit_tests(promtool):
    p = subprocess.run([promtool, "test", "rules", "tests/grpo-rules.test.yml"], cwd=RULES.parent,
                       capture_output=True, text=True)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_rules_use_only_catalogue_metrics_and_existing_runbook_anchors():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    known = {n for m in CATALOGUE for n in m.prometheus_names()} | recorded
    used = {name for r in rules for name in re.findall(r"\bgrpo[_:][a-z0-9_:]+", r["expr"])}
    assert used <= known, f"not in the catalogue: {used - known}"
    anchors = set(re.findall(r"^## (\S+)$", (REPO / "docs" / "runbook.md").read_text(), re.M))
    for r in rules:
        if "alert" in r:
            assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
            anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
            assert "{{" in anchor or anchor in anchors, f"{r['alert']}: no runbook section {anchor!r}"


def test_runbook_is_generated_from_the_table():
    assert (REPO / "docs" / "runbook.md").read_text() == runbook_markdown(), \
        "run: python -m telemetry.health.table > docs/runbook.md"
