"""Reading a run never validates a launch: a finished run whose dataset was moved away and whose reward
module no longer imports (importing it now would leave a marker file and raise) still reads through
every reader of a record: RunDir.read_config, `diagnose` (the command, and its ingester), and the
daemon's GET /v1/runs/{id} and /report (the real app, in-process). Only a launch imports user code."""

import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from grpo_sentinel.service.config import load_config
from grpo_sentinel.service.daemon.app import create_app
from grpo_sentinel.service.daemon.supervisor import Supervisor
from grpo_sentinel.service.launch import check_launch
from grpo_sentinel.service.runs import RunDir
from grpo_sentinel.service.trainer import Trainer
from grpo_sentinel.telemetry.health.ingest import load
from helpers import cli, new_run

MODULE = "reader_check_reward"


@pytest.fixture
def moved_run(tmp_path, demo_dir, monkeypatch):
    """A completed 2-step run in a daemon's state directory, trained on its own dataset with a
    module:function reward; then the dataset is moved and the module replaced by one that marks its import."""
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{MODULE}.py").write_text("def right(completion, answer, prompt):\n    return float(completion.strip() == answer)\n")
    monkeypatch.syspath_prepend(str(code))
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(10, 30) for b in range(10, 20)))
    cfg = load_config(None, [f"model.path={demo_dir}", f"data.path={data}", "data.eval_size=16",
                             f"rewards=[{{name: '{MODULE}:right'}}]", "grpo.prompts_per_step=4", "grpo.group_size=4",
                             "run.sample_every=2", "telemetry.prometheus=false", "traces.enabled=false"],
                      **{"run.steps": 2})
    check_launch(cfg)  # a launch imports the reward and finds the data
    runs = tmp_path / "state" / "runs"
    result = Trainer(cfg, new_run(runs, cfg, "r")).run_to_end()
    assert result.status == "completed"
    data.rename(tmp_path / "moved.jsonl")
    marker = tmp_path / "imported"
    (code / f"{MODULE}.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('imported by a reader')\n")
    sys.modules.pop(MODULE, None)
    return {"run": runs / "r", "state": tmp_path / "state", "code": code, "marker": marker}


def test_a_moved_dataset_and_a_broken_reward_module_spoil_no_reader(moved_run):
    run, marker = moved_run["run"], moved_run["marker"]
    cfg = RunDir(run).read_config()
    assert cfg.rewards[0].name == f"{MODULE}:right" and cfg.data.path.endswith("add.jsonl")
    log = load(run)
    assert len(log) == 2 and log.group_size == 4 and log.completions_per_step == 16
    p = subprocess.run(cli("diagnose", str(run), "--json"), capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(moved_run["code"]), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "summary" in json.loads(p.stdout), p.stderr[-2000:]
    supervisor = Supervisor(moved_run["state"])
    supervisor.start()
    try:
        api = TestClient(create_app(supervisor, token=None))
        got = api.get("/v1/runs/r")
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["status"] == "completed" and body["metrics"]["step"] == 2 and body["baseline"]["n"] == 16
        report = api.get("/v1/runs/r/report")
        assert report.status_code == 200 and report.text.startswith("#"), report.text[:300]
    finally:
        supervisor.shutdown()
    assert not marker.exists(), "a reader imported the run's reward module"
    with pytest.raises(ValueError, match="this run cannot start"):  # what a launch says now, by contrast
        check_launch(RunDir(run).read_config())
    assert marker.exists()  # the launch check did import it: the marker can catch an import
