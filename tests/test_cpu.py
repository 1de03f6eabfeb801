"""Training processes share their cores (service/cpu.py): each takes cores // (processes on them) threads,
a dead process's claim is cleaned away, a fixed count wins. Other processes' claims are files locked by
another open file description, which flock treats as another holder even in this process."""

import fcntl
import json
import os

import pytest
import torch

from grpo_sentinel.service.cpu import CpuShare

pytestmark = pytest.mark.unit


def claim(folder, name: str, cores, alive: bool = True):
    """Another process's registration: its file, held locked while it lives."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"cores": sorted(cores)}))
    if not alive:
        return None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_processes_on_the_same_cores_share_them_and_a_dead_claim_is_cleaned(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    before = torch.get_num_threads()
    with CpuShare("auto", tmp_path) as share:
        assert share.threads == 4 and (tmp_path / f"{os.getpid()}.json").is_file()  # alone: every core it may use
        other = claim(tmp_path, "101", {2, 3})
        claim(tmp_path, "102", {0, 1}, alive=False)  # its process died: the lock went with it
        claim(tmp_path, "103", {8, 9})  # other cores: not sharing ours
        assert share.adjust(force=True) == 2 and torch.get_num_threads() == 2  # 4 cores // 2 processes
        assert not (tmp_path / "102.json").exists()
        os.close(other)  # the other process ends
        assert share.adjust() == 2  # looked at most once a second ...
        assert share.adjust(force=True) == 4  # ... and then it takes the cores back
    assert torch.get_num_threads() == before and not (tmp_path / f"{os.getpid()}.json").exists()


def test_a_fixed_count_wins_and_still_registers(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    other = claim(tmp_path, "101", {0, 1})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with CpuShare("auto", tmp_path) as share:
        assert share.threads == 2 and (tmp_path / f"{os.getpid()}.json").is_file()
    monkeypatch.delenv("OMP_NUM_THREADS")
    with CpuShare(1, tmp_path) as share:
        assert share.threads == 1
    with CpuShare("auto", tmp_path) as share:
        assert share.threads == 1  # shared with the live claim
    os.close(other)


def test_no_registry_is_a_warning_not_a_failure(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "file").write_text("")
    with CpuShare("auto", tmp_path / "file" / "cpu") as share:  # cannot be a directory
        assert share.threads == len(os.sched_getaffinity(0))
    assert "cannot register" in caplog.text
