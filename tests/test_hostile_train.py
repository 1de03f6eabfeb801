"""`grpo-sentinel train` as a hostile new user drives it: every bad input ends in its documented exit
code, one message that names the file or field and what to do, no traceback, and nothing written
that was not there before. Input refused before any training runs through the CLI's main() in this
process (helpers.in_process: a subprocess would add only its start-up); the installed script, the run
lock, a full disk and signals at every phase run as real processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_sentinel.service.config import ConfigError, validate
from grpo_sentinel.service.data import DataError, read_jsonl
from helpers import cli, in_process, wait_for

FAST = ["--set", "telemetry.prometheus=false", "--set", "data.eval_size=20"]


def train(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600):
    """The installed `grpo-sentinel` script as a process of its own (which, unlike -m, does not put the
    working directory on the import path)."""
    cmd = [str(Path(sys.executable).parent / "grpo-sentinel"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def refused(p, code: int, *phrases: str) -> None:
    assert p.returncode == code, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    for phrase in phrases:
        assert phrase in p.stderr, (phrase, p.stderr[-3000:])


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def rows(n: int, repeat: int = 1) -> list[dict]:
    return [{"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1)} for a in range(n)] * repeat


def local_model(tmp_path: Path, demo_dir: Path, weights: bool = True) -> Path:
    """A copy of the demo model as an ordinary model directory (so any JSONL dataset can go with it)."""
    dst = tmp_path / "model"
    shutil.copytree(demo_dir, dst)
    if not weights:
        for f in dst.glob("*.safetensors"):
            f.unlink()
    return dst


# -- bad input: exit 2 before any model loads, nothing left behind ------------------------------

def _device(tmp, demo):
    return ["--set", "model.device=banana"], ["model.device", "auto"]


def _cuda(tmp, demo):
    return ["--set", "model.device=cuda"], ["model.device=cuda: this machine has no CUDA device", "model.device=cpu"]


def _targets(tmp, demo):
    return ["--set", "model.lora.target_modules=[nope_proj]"], ["model.lora.target_modules: ['nope_proj'] match no module",
                                                                  "q_proj"]


def _template_field(tmp, demo):
    return ["--set", "data.prompt_template={prompt} {x}"], ["data.prompt_template", "'x'"]


def _template_brace(tmp, demo):
    return ["--set", "data.prompt_template=Q {prompt} {"], ["data.prompt_template", "literal brace"]


def _reward_syntax(tmp, demo):
    (tmp / "badsyntax.py").write_text("def f(c, a, p):\n    return 1 +\n")
    return ["--set", "rewards=[{name: 'badsyntax:f'}]"], ["syntax error in", "badsyntax.py:2"]


def _reward_raises_at_import(tmp, demo):
    (tmp / "raising.py").write_text("raise RuntimeError('no GPU grader here')\ndef f(c, a, p):\n    return 1\n")
    return ["--set", "rewards=[{name: 'raising:f'}]"], ["importing raising raised RuntimeError: no GPU grader here"]


def _reward_in_cwd(tmp, demo):
    (tmp / "mine.py").write_text("def f(c, a, p):\n    return 1.0\n")
    return ["--set", "rewards=[{name: 'mine:f'}]", "__script__"], ["not on the import path", "PYTHONPATH=."]


def _out_is_a_file(tmp, demo):
    (tmp / "afile").write_text("x")
    return ["--out", str(tmp / "afile")], ["cannot create the run directory", "--out"]


def _no_weights(tmp, demo):
    m = local_model(tmp, demo, weights=False)
    d = jsonl(tmp / "d.jsonl", rows(60))
    return ["--set", f"model.path={m}", "--set", f"data.path={d}"], ["has a config.json but no weights"]


def _data_is_a_dir(tmp, demo):
    (tmp / "data").mkdir()
    return ["--set", f"model.path={demo}", "--set", f"data.path={tmp / 'data'}"], ["is a directory"]


def _data_not_utf8(tmp, demo):
    (tmp / "d.jsonl").write_bytes(b'{"prompt": "\xff\xfe", "answer": "1"}\n')
    return ["--set", f"model.path={demo}", "--set", f"data.path={tmp / 'd.jsonl'}"], [f"{tmp / 'd.jsonl'}: not UTF-8"]


def _config_binary(tmp, demo):
    (tmp / "c.yaml").write_bytes(bytes(range(256)))
    return ["--config", str(tmp / "c.yaml")], [f"config file '{tmp / 'c.yaml'}'"]


def _null_row(tmp, demo):
    d = jsonl(tmp / "d.jsonl", [*rows(30), {"prompt": None, "answer": None}])
    return ["--set", f"model.path={demo}", "--set", f"data.path={d}"], [f"{d}:31: 'prompt' must be a non-empty string"]


def _empty_answer(tmp, demo):
    d = jsonl(tmp / "d.jsonl", [*rows(30), {"prompt": "1+1=", "answer": ""}])
    return ["--set", f"model.path={demo}", "--set", f"data.path={d}"], [f"{d}:31: 'answer' must be"]


def _duplicates_leave_too_few(tmp, demo):
    d = jsonl(tmp / "d.jsonl", rows(50, repeat=20))  # 1000 rows, 50 distinct prompts
    return ["--set", f"model.path={demo}", "--set", f"data.path={d}", "--set", "data.eval_size=100"], \
        ["50 distinct prompts cannot give a held-out subset of 100"]


def _long_prompt(tmp, demo):
    m = local_model(tmp, demo)
    d = jsonl(tmp / "d.jsonl", [*rows(40), {"prompt": "1+" * 1001 + "1=", "answer": "1002"}])
    return ["--set", f"model.path={m}", "--set", f"data.path={d}"], \
        [f"{d}:41: prompt of", "longer than data.max_prompt_tokens=26", "data.long_prompts=truncate"]


BAD = [_device, _cuda, _targets, _template_field, _template_brace, _reward_syntax, _reward_raises_at_import, _reward_in_cwd,
       _out_is_a_file, _no_weights, _data_is_a_dir, _data_not_utf8, _config_binary, _null_row, _empty_answer,
       _duplicates_leave_too_few, _long_prompt]


@pytest.mark.parametrize("case", BAD, ids=[c.__name__.strip("_") for c in BAD])
def test_bad_input_is_refused_with_a_message_and_leaves_nothing_behind(case, tmp_path, demo_dir):
    args, phrases = case(tmp_path, demo_dir)
    script = "__script__" in args
    args = [a for a in args if a != "__script__"]
    out = tmp_path / "runs"
    before = tree(tmp_path)
    run = train if script else in_process
    p = run("train", "--out", str(out), "--set", "run.run_id=r", "--steps", "2", *FAST, *args, cwd=tmp_path,
            env={"PYTHONPATH": "" if script else str(tmp_path)})
    refused(p, 2, *phrases)
    assert not (out / "r").exists()  # a failed start leaves no half-made run directory behind
    assert tree(tmp_path) == before
    assert len(p.stderr.strip().splitlines()) <= 3, p.stderr  # one message, not a log dump


def test_an_otlp_protocol_it_cannot_speak_is_bad_input(tmp_path, demo_dir):
    out = tmp_path / "runs"
    p = in_process("train", "--out", str(out), "--set", "run.run_id=r", "--steps", "2", *FAST,
                   env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    refused(p, 2, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': use 'grpc' or 'http/protobuf'")
    assert not (out / "r").exists()


@pytest.mark.slow
def test_a_cut_prompt_is_counted_when_truncation_is_asked_for(tmp_path, demo_dir):
    m = local_model(tmp_path, demo_dir)
    d = jsonl(tmp_path / "d.jsonl", [*rows(40), {"prompt": "1+" * 1001 + "1=", "answer": "1002"}])
    p = train("train", "--out", str(tmp_path), "--set", "run.run_id=r", "--steps", "1", *FAST, "--set", f"model.path={m}",
              "--set", f"data.path={d}", "--set", "data.long_prompts=truncate")
    assert p.returncode == 0, p.stderr[-3000:]
    notes = json.loads((tmp_path / "r" / "summary.json").read_text())["data_notes"]
    assert any("longer than 26 tokens were cut to their last 26" in n for n in notes)


def test_duplicate_rows_never_leak_the_held_out_prompts_into_training(tmp_path):
    from grpo_sentinel.service.config import DataSettings
    from grpo_sentinel.service.data import load_datasets

    d = jsonl(tmp_path / "d.jsonl", rows(200, repeat=20))
    data = load_datasets(DataSettings(path=str(d), eval_size=100), seed=0)
    assert not {e.prompt for e in data.train} & {e.prompt for e in data.heldout}
    assert len(data.heldout) == 100 and len(data.train) == 100
    assert any("3800 rows repeat an earlier prompt" in n for n in data.notes)
    # A separate held-out file that overlaps the training file: the overlap leaves training, and is said.
    held = jsonl(tmp_path / "h.jsonl", rows(10))
    data = load_datasets(DataSettings(path=str(d), eval_path=str(held), eval_size=10), seed=0)
    assert not {e.prompt for e in data.train} & {e.prompt for e in data.heldout}
    assert any("10 held-out prompts are also in" in n for n in data.notes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from(["prompt", "answer", "x"]),
                                          st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(),
                                                    st.lists(st.integers()))),
                          st.text(), st.integers()), min_size=1, max_size=5))
def test_any_jsonl_row_is_read_or_refused_with_its_line(tmp_path_factory, items):
    path = tmp_path_factory.mktemp("j") / "d.jsonl"
    path.write_text("".join((json.dumps(i) if not isinstance(i, str) else i.replace("\n", " ")) + "\n" for i in items),
                    encoding="utf-8")
    try:
        out = read_jsonl(path)
    except DataError as e:
        assert str(path) in str(e)
    else:
        assert all(isinstance(x.prompt, str) and x.prompt.strip() and isinstance(x.answer, str) and x.answer.strip()
                   for x in out)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "data", "grpo", "optim", "run", "health", "traces", "rewards", "nope"]),
                       st.one_of(st.none(), st.integers(), st.text(), st.lists(st.text()),
                                 st.dictionaries(st.text(max_size=12), st.one_of(st.none(), st.integers(), st.floats(),
                                                                                 st.text(), st.booleans())))))
def test_any_config_mapping_validates_or_lists_its_problems(raw):
    try:
        validate(raw)
    except ConfigError as e:
        assert str(e).startswith("invalid config")


# -- resume: refuse what rewrites the record, record what may change -----------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_dir) -> Path:
    out = tmp_path_factory.mktemp("runs")
    p = train("train", "--out", str(out), "--set", "run.run_id=r", "--steps", "4", "--set", "run.checkpoint_every=2",
              "--set", "run.sample_every=2", *FAST)
    assert p.returncode == 0, p.stderr[-3000:]
    return out / "r"


@pytest.mark.parametrize("change, field", [("run.seed=7", "run.seed"), ("rewards=[{name: format}]", "rewards"),
                                           ("model.lora.r=4", "model.lora.r"), ("grpo.beta=0.1", "grpo.beta")])
def test_a_resume_that_would_rewrite_the_record_is_refused_touching_nothing(finished, change, field):
    before = tree(finished)
    p = in_process("train", "--resume", str(finished), "--set", change, "--steps", "6")
    refused(p, 2, field, "Start a new run")
    assert tree(finished) == before


@pytest.mark.slow
def test_a_resume_may_extend_the_run_and_the_change_is_an_event(tmp_path, finished):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    p = train("train", "--resume", str(run), "--steps", "6", "--set", "telemetry.prometheus=false")
    assert p.returncode == 0, p.stderr[-3000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    changed = [e for e in events if e["event"] == "config_changed"]
    assert changed and changed[-1]["changes"]["run.steps"] == [4, 6]
    assert [int(r.split(",")[0]) for r in (run / "steps.csv").read_text().splitlines()[1:]] == [1, 2, 3, 4, 5, 6]


def test_a_damaged_record_is_reported_and_refused_touching_nothing(tmp_path, finished):
    for damage, phrase in ((lambda r: (r / "steps.csv").unlink(), "no steps.csv"),
                           (lambda r: (r / "summary.json").write_text("{truncated"), "summary.json is corrupt")):
        run = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        shutil.copytree(finished, run)
        damage(run)
        before = tree(run)
        p = in_process("train", "--resume", str(run), "--steps", "6")
        refused(p, 2, phrase)
        assert tree(run) == before


def test_one_run_directory_is_trained_by_one_process(tmp_path, finished):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    first = subprocess.Popen(cli("train", "--resume", str(run), "--steps", "400", "--set", "telemetry.prometheus=false"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def holder() -> int | None:  # one read: the holder rewrites the file, so two reads can see two states
        try:
            return json.loads((run / ".lock").read_text()).get("pid")
        except (OSError, ValueError):
            return None

    assert wait_for(lambda: holder() == first.pid, 120)
    second = in_process("train", "--resume", str(run), "--steps", "400")
    refused(second, 2, f"is being trained by pid {first.pid}")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 75


# -- a full disk ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_stays(tmp_path, demo_dir):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        p = train("train", "--out", str(disk), "--set", "run.run_id=r", "--steps", "40", "--set", "run.checkpoint_every=1",
                  "--set", "run.keep_checkpoints=100", "--set", "run.sample_every=100", *FAST)
        refused(p, 74, f"no space left in {disk / 'r'}", "free space, then --resume")
        summary = json.loads((disk / "r" / "summary.json").read_text())
        assert summary["status"] == "failed" and "no space left" in summary["reason"]
        from grpo_sentinel.service import checkpoint

        newest = checkpoint.latest(disk / "r" / "checkpoints")
        assert newest is not None and newest.step == summary["step"] >= 1  # complete, verified, and the resume point
        assert not list((disk / "r" / "checkpoints").glob(".tmp-*"))  # the failed write gave its space back
    finally:
        subprocess.run(["umount", str(disk)])


@pytest.mark.slow
def test_a_disk_already_full_at_start_up_is_74_and_keeps_nothing(tmp_path, demo_dir):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:  # two 4 KiB pages: the run directory's first files do not fit
        p = train("train", "--out", str(disk), "--set", "run.run_id=r", "--steps", "2", *FAST)
        refused(p, 74, "No space left on device", "free space, then run the same command again")
        assert not (disk / "r").exists()
    finally:
        subprocess.run(["umount", str(disk)])


# -- signals at every phase: a documented exit code, one line, a summary --------------------------

@pytest.mark.parametrize("sig, phase", [(signal.SIGTERM, "loading"), (signal.SIGINT, "loading"),
                                        (signal.SIGTERM, "twice in the loop")])
@pytest.mark.slow
def test_a_signal_at_any_moment_ends_in_75_a_message_and_a_summary(tmp_path, demo_dir, sig, phase):
    proc = subprocess.Popen(cli("train", "--out", str(tmp_path), "--set", "run.run_id=r", "--steps", "300", *FAST),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _signal_and_check(proc, tmp_path, sig, phase)
    finally:
        proc.kill()  # a failed check must not leave a 300-step run behind


def _signal_and_check(proc, tmp_path, sig, phase):
    before = []  # stderr read before communicate()
    if phase == "loading":
        assert wait_for(lambda: (tmp_path / "r" / "config.yaml").exists() or proc.poll() is not None, 120, 0.001)
        proc.send_signal(sig)
    else:
        assert wait_for(lambda: (tmp_path / "r" / "steps.csv").exists() and
                        len((tmp_path / "r" / "steps.csv").read_text().splitlines()) > 3, 300, 0.01)
        proc.send_signal(sig)
        # The second only once the first is handled: two that arrive while the main thread is inside one long torch
        # call are one signal to Python (its handler runs once per signal tripped), as happened 50 ms apart in CI.
        while (line := proc.stderr.readline()) and "send it again to stop at once" not in line:
            before.append(line)
        before.append(line)
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    err = "".join(before) + err
    assert proc.returncode == 75, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "stopped at once" in last and last.startswith("grpo-sentinel:")
    if (tmp_path / "r").exists():
        assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "preempted"
    else:
        assert "nothing was kept" in last  # interrupted before training began: nothing half-made remains


# -- rewards that hang ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_reward_that_hangs_times_out_and_never_holds_up_a_sigterm(tmp_path, demo_dir):
    (tmp_path / "slow.py").write_text("import pathlib, time\ndef f(c, a, p):\n"
                                      f"    pathlib.Path({str(tmp_path / 'called')!r}).touch()\n"
                                      "    time.sleep(30)\n    return 1.0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run(cli("train", "--out", str(tmp_path), "--set", "run.run_id=t", "--steps", "1", *FAST,
                           "--set", "rewards=[{name: 'correct'}, {name: 'slow:f'}]", "--set", "grpo.reward_timeout_s=0.2",
                           "--set", "grpo.reward_workers=64", "--set", "grpo.invalid_reward=fallback"),
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "took longer than grpo.reward_timeout_s=0.2s" in p.stderr
    row = (tmp_path / "t" / "steps.csv").read_text().splitlines()
    assert dict(zip(row[0].split(","), row[1].split(",")))["invalid_rewards"] == "64"
    proc = subprocess.Popen(cli("train", "--out", str(tmp_path), "--set", "run.run_id=s", "--steps", "5", *FAST,
                                "--set", "rewards=[{name: 'slow:f'}]"), env=env, stderr=subprocess.PIPE, text=True)
    (tmp_path / "called").unlink()
    # Inside step 1, waiting on a reward that sleeps 30 s (its timeout: 60 s).
    assert wait_for(lambda: (tmp_path / "called").exists() or proc.poll() is not None, 300, 0.01)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    assert time.monotonic() - t0 < 15
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["status"] == "preempted"


def test_cli_rejects_bad_config_before_loading_any_model(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("grpo:\n  beta: -1\n")
    p = in_process("train", "--config", str(path), "--out", str(tmp_path))
    assert p.returncode == 2
    assert "grpo.beta: Input should be greater than or equal to 0 (got -1)" in p.stderr
    assert not any(tmp_path.glob("*/config.yaml"))  # no run directory was started


def test_cli_rejects_a_dataset_row_without_answer(tmp_path, demo_dir):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n")
    p = in_process("train", "--out", str(tmp_path), "--set", f"model.path={demo_dir}", "--set", f"data.path={data}",
                   "--set", "telemetry.prometheus=false")
    assert p.returncode == 2
    assert f"{data}:2: row has no 'answer' field" in p.stderr
