"""Hostile inputs to `grpo-sentinel diagnose` and `grpo-sentinel rules`, through the real CLI: each
case gets its documented exit code (2 for unreadable input or a bad argument, 0 when the log can be
read), never a Python traceback, a message naming the file or field and what to do, and no file
written that was not asked for. Hypothesis throws random garbage at the ingester and detectors."""

import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.ingest import IngestError, load
from grpo_sentinel.telemetry.health.report import to_json
from helpers import cli


def good_csv(n: int = 40) -> str:
    return "step,reward,kl,loss\n" + "".join(f"{i},0.5,0.01,0.001\n" for i in range(1, n + 1))


def trl(history) -> str:
    return json.dumps({"log_history": history})


VALID = [{"step": s, "reward": 0.5, "kl": 0.01, "loss": 0.0} for s in range(1, 31)]


def run_json(**scales) -> str:
    """A run.json as telemetry writes it (runfiles.write_run_info), its scales changed as given."""
    good = {"max_reward": 1.0, "ln_vocab": 2.7, "max_new_tokens": 6, "group_size": 8, "prompts_per_step": 8, "window": 7}
    return json.dumps({"run_id": "run", "model": "demo", "loss_type": "grpo", "scales": {**good, **scales}})

# name: (files to create {relative path: text or bytes}, diagnose/rules arguments ({d} = the tmp dir),
#        exit code, text stderr must contain, files expected afterwards besides the inputs)
CASES = {
    "trl log_history with garbage entries": (
        {
            "trainer_state.json": trl(
                [
                    1,
                    "x",
                    None,
                    [2],
                    {"step": "abc"},
                    {"reward": 1},
                    {"step": 3.5, "reward": "high"},
                    {"step": 4, "kl": {"a": 1}, "loss": None, "reward": True},
                ]
                + VALID
            )
        },
        ["diagnose", "{d}/trainer_state.json"],
        0,
        "",
        set(),
    ),
    "trl log_history with no usable entry": (
        {"trainer_state.json": trl([1, "x", {"step": "abc"}, {"reward": 2}])},
        ["diagnose", "{d}/trainer_state.json"],
        2,
        "trainer_state.json: log_history has no entry with a numeric 'step'",
        set(),
    ),
    "trl log_history not a list": (
        {"trainer_state.json": json.dumps({"log_history": 5})},
        ["diagnose", "{d}/trainer_state.json"],
        2,
        "no 'log_history' list",
        set(),
    ),
    "trl not json": (
        {"trainer_state.json": "{not json"},
        ["diagnose", "{d}/trainer_state.json"],
        2,
        "not valid JSON",
        set(),
    ),
    "run directory with a torn run.json": (
        {"run/steps.csv": good_csv(), "run/run.json": '{"run_id": "r", "scales": {'},
        ["diagnose", "{d}/run"],
        2,
        "run/run.json: not a run.json as telemetry writes it (the file: Invalid JSON",
        set(),
    ),
    "run directory with a wrongly typed run.json field": (
        {"run/steps.csv": good_csv(), "run/run.json": run_json(group_size="eight", window=1)},
        ["diagnose", "{d}/run"],
        2,
        "scales.group_size: Input should be a valid integer, unable to parse string as an "
        "integer; scales.window: Input should be greater than or equal to 2",
        set(),
    ),
    "run directory whose run.json is a list": (
        {"run/steps.csv": good_csv(), "run/run.json": "[1, 2]"},
        ["diagnose", "{d}/run"],
        2,
        "run.json: not a run.json as telemetry writes it (the file: Input should be an object)",
        set(),
    ),
    # config.yaml is the service's file: diagnose never reads it, whatever it holds.
    "run directory from before run.json, with a broken config.yaml": (
        {"run/steps.csv": good_csv(), "run/config.yaml": "grpo: [unclosed\n"},
        ["diagnose", "{d}/run"],
        0,
        "",
        set(),
    ),
    "window -3": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--window", "-3"],
        2,
        "--window: must be >= 2",
        set(),
    ),
    "window 0": ({"s.csv": good_csv()}, ["diagnose", "{d}/s.csv", "--window", "0"], 2, "--window: must be >= 2", set()),
    "window not a number": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--window", "5x"],
        2,
        "not a whole number",
        set(),
    ),
    "vocab size 0": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--vocab-size", "0"],
        2,
        "--vocab-size: must be >= 2",
        set(),
    ),
    "vocab size 1": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--vocab-size", "1"],
        2,
        "--vocab-size: must be >= 2",
        set(),
    ),
    "eval n 0": ({"s.csv": good_csv()}, ["diagnose", "{d}/s.csv", "--eval-n", "0"], 2, "--eval-n: must be >= 1", set()),
    "report into a missing directory": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--report", "{d}/nowhere/r.md"],
        2,
        "the directory {d}/nowhere does not exist",
        set(),
    ),
    "report is a directory": (
        {"s.csv": good_csv(), "out/.keep": ""},
        ["diagnose", "{d}/s.csv", "--report", "{d}/out"],
        2,
        "is a directory; give a file name",
        set(),
    ),
    "plot into a directory": (
        {"s.csv": good_csv(), "plots/.keep": ""},
        ["diagnose", "{d}/s.csv", "--plot", "{d}/plots"],
        2,
        "--plot {d}/plots: is a directory; give a file name, e.g. {d}/plots/run.png",
        set(),
    ),
    "plot without .png": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--plot", "{d}/curves"],
        2,
        "give a .png file name (e.g. {d}/curves.png)",
        set(),
    ),
    "a bad plot path writes no report either": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--report", "{d}/r.md", "--plot", "{d}/x.jpg"],
        2,
        "give a .png file name",
        set(),
    ),
    "header-only CSV": (
        {"s.csv": "step,reward,kl,loss\n"},
        ["diagnose", "{d}/s.csv"],
        2,
        "the header is there but no step rows follow",
        set(),
    ),
    "NaN everywhere": (
        {"s.csv": "step,reward,kl,loss,sample_acc\n" + "".join(f"{i},nan,nan,nan,nan\n" for i in range(1, 31))},
        ["diagnose", "{d}/s.csv"],
        0,
        "",
        set(),
    ),
    "every cell empty": (
        {"s.csv": "step,reward,kl,loss\n" + "".join(f"{i},,,\n" for i in range(1, 31))},
        ["diagnose", "{d}/s.csv"],
        2,
        "every value is empty or not a number",
        set(),
    ),
    "empty file": ({"s.csv": ""}, ["diagnose", "{d}/s.csv"], 2, "empty file", set()),
    "binary file": (
        {"s.csv": b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe"},
        ["diagnose", "{d}/s.csv"],
        2,
        "not a text file",
        set(),
    ),
    "no such file": ({}, ["diagnose", "{d}/missing.csv"], 2, "missing.csv: no such file", set()),
    "a step that is not a number": (
        {"s.csv": "step,reward,kl,loss\n1,0.5,0.01,0\nten,0.5,0.01,0\n"},
        ["diagnose", "{d}/s.csv"],
        2,
        "s.csv:3: step 'ten' is not a number",
        set(),
    ),
    "jsonl of garbage": (
        {"m.jsonl": 'nope\n[1,2]\n"x"\n'},
        ["diagnose", "{d}/m.jsonl"],
        2,
        "no JSON object lines",
        set(),
    ),
    "report and plot as asked": (
        {"s.csv": good_csv()},
        ["diagnose", "{d}/s.csv", "--report", "{d}/r.md", "--plot", "{d}/p.png"],
        0,
        "",
        {"r.md", "p.png"},
    ),
    "rules: a negative KL bound": (
        {},
        ["rules", "--set", "kl_bound=-1"],
        2,
        "kl_bound='-1': kl_bound must be > 0",
        set(),
    ),
    "rules: a zero maximum reward": ({}, ["rules", "--set", "max_reward=0"], 2, "max_reward must be > 0", set()),
    "rules: a fraction above 1": ({}, ["rules", "--set", "zero_signal=2"], 2, "zero_signal is a fraction", set()),
    "rules: an infinite threshold": (
        {},
        ["rules", "--set", "kl_bound=inf"],
        2,
        "kl_bound='inf' is not a number",
        set(),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input(tmp_path, case):
    files, args, code, says, written = CASES[case]
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    before = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    p = subprocess.run(cli(*(a.format(d=tmp_path) for a in args)), capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    assert says.format(d=tmp_path) in p.stderr, p.stderr
    if code == 2:
        assert p.stdout == "", p.stdout[:500]
    after = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    assert after - before == written, after - before


def test_nan_everywhere_is_the_nonfinite_verdict_and_no_percentage_note(tmp_path):
    (tmp_path / "s.csv").write_text("step,reward,kl,loss,sample_acc\n" + "".join(f"{i},nan,nan,nan,nan\n" for i in range(1, 31)))
    out = json.loads(subprocess.run(cli("diagnose", str(tmp_path / "s.csv"), "--json"), capture_output=True, text=True).stdout)
    assert {(c["id"], c["severity"]) for c in out["conditions"]} == {("nonfinite", "warning"), ("nonfinite", "critical")}
    assert not any("percentage" in n for n in out["notes"])


# Hypothesis: random cells and entries never crash the ingester or the detectors, and the JSON
# report stays strict JSON (no NaN).

cell = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
entry = st.one_of(cell, st.dictionaries(st.sampled_from(["step", "reward", "kl", "loss", "entropy", "eval_accuracy",
                                                         "rewards/format_reward/mean", "frac_reward_zero_std",
                                                         "completions/mean_length", "x"]), cell, max_size=8))


def _check(path) -> None:
    try:
        log = load(path)
    except IngestError:
        return
    diag = diagnose(log)
    json.dumps(to_json(diag, log, __import__("grpo_sentinel.telemetry.health.detectors", fromlist=["x"]).Thresholds()),
               allow_nan=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(entry, max_size=40))
def test_random_log_history_entries(tmp_path, history):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}, default=str))
    _check(tmp_path / "trainer_state.json")


text_cell = st.one_of(st.just(""), st.sampled_from(["nan", "inf", "-inf", "NaN", "x", "1e999", "-0", "0.5", "1", "100"]),
                      st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda x: f"{x:g}"),
                      st.text(alphabet="0123456789.-eE+ab", max_size=6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(-5, 400), text_cell, text_cell, text_cell, text_cell, text_cell), max_size=60))
def test_random_csv_cells(tmp_path, rows):
    lines = ["step,reward,kl,loss,sample_acc,response_len"] + [",".join(map(str, r)) for r in rows]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    _check(tmp_path / "s.csv")
