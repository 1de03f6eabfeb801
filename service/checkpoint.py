"""Atomic checkpoints: written into a temporary folder, sealed by a manifest, then renamed.

A folder named `step-NNNNNNNN` exists only once it is complete, so a crash (even SIGKILL in the
middle of a write) leaves at worst a `.tmp-*` folder, which resume reports and skips.
Layout: adapter/ (a loadable peft adapter), trainer.pt (optimizer, scheduler, loop state),
manifest.json (step, file sizes and sha256, written last).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*"), reverse=True) + [root]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(ckpt_dir: Path, step: int, model, optimizer, scheduler, loop_state: dict, keep: int) -> Checkpoint:
    """Save and return the checkpoint; refuses (CheckpointError) if any trainable weight is non-finite."""
    bad = [n for n, p in model.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"not saving step {step}: non-finite values in {len(bad)} trainable tensors, e.g. {bad[0]}")
    final = ckpt_dir / f"step-{step:08d}"
    tmp = ckpt_dir / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp / "adapter")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "loop": loop_state},
                   tmp / "trainer.pt")
        files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / "manifest.json").write_text(json.dumps({"step": step, "files": files}, indent=1))
        _fsync_tree(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (a full disk) gives its space back
        # A full disk in the writers' own words: torch's short write, safetensors' wrapped OS error.
        if isinstance(e, RuntimeError) and "unexpected pos" in str(e):
            raise OSError(errno.ENOSPC, f"writing {tmp / 'trainer.pt'} failed ({e})") from None
        if isinstance(e, SafetensorError) and any(f"os error {n})" in str(e) for n in (errno.ENOSPC, errno.EDQUOT)):
            raise OSError(errno.ENOSPC, f"writing {tmp / 'adapter'} failed ({e})") from None
        raise
    if final.exists():  # a re-run of the same step after a resume: the new one replaces it
        shutil.rmtree(final)
    tmp.rename(final)
    _prune(ckpt_dir, keep)
    return Checkpoint(final, step)


def mark_last_healthy(ckpt: Checkpoint) -> Path:
    """Make `last-healthy/` (atomically, replacing the previous one) the rollback target. Hard links, not
    copies: a sealed checkpoint's files are never rewritten, so this costs no I/O, and pruning the
    original later leaves the linked files in place."""
    dst = ckpt.path.parent / "last-healthy"
    tmp = ckpt.path.parent / f".tmp-last-healthy-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt.path, tmp, copy_function=os.link)
    old = ckpt.path.parent / f".tmp-old-last-healthy-{os.getpid()}"
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)
    return dst


def _prune(ckpt_dir: Path, keep: int) -> None:
    complete = sorted(p for p in ckpt_dir.glob("step-*") if (p / "manifest.json").is_file())
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def verify(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    manifest = path / "manifest.json"
    if not manifest.is_file():
        return "no manifest (torn write)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable manifest ({e})"
    for name, meta in files.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
            return f"{name} is missing or does not match the manifest"
    return None


def latest(ckpt_dir: Path) -> Checkpoint | None:
    """Newest intact checkpoint. Torn or corrupt ones are reported and skipped, never fatal."""
    if not ckpt_dir.is_dir():
        return None
    for tmp in ckpt_dir.glob(".tmp-*"):
        log.warning("skipping torn checkpoint %s (interrupted write); removing it", tmp.name)
        shutil.rmtree(tmp, ignore_errors=True)
    for path in sorted(ckpt_dir.glob("step-*"), reverse=True):
        problem = verify(path)
        if problem is None:
            return Checkpoint(path, int(path.name.removeprefix("step-")))
        log.warning("skipping checkpoint %s: %s", path.name, problem)
    return None


def load(ckpt: Checkpoint, model, optimizer, scheduler) -> dict:
    """Restore adapter, optimizer and scheduler in place; return the loop state."""
    weights = load_file(ckpt.path / "adapter" / "adapter_model.safetensors", device=str(model.device))
    result = set_peft_model_state_dict(model, weights)
    if getattr(result, "unexpected_keys", None):
        raise CheckpointError(f"{ckpt.path}: adapter does not fit this model (unexpected keys {result.unexpected_keys[:3]})")
    state = torch.load(ckpt.path / "trainer.pt", map_location=model.device, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["loop"]
