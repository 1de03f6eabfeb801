"""Datasets (JSONL of prompt/answer rows), the fixed held-out split, and verifiers."""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_sentinel.service.config import DEMO, DataSettings


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file and row."""


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


@dataclass(frozen=True)
class Datasets:
    train: list[Example]
    heldout: list[Example]  # fixed for the whole run: sample_acc is only comparable on the same subset


def load_datasets(cfg: DataSettings, seed: int) -> Datasets:
    if cfg.path == DEMO:
        from grpo_sentinel.service.demo import addition_examples

        # Held-out problems come from the tenth the demo's warm-up never saw.
        seen, unseen = addition_examples(unseen=False), addition_examples(unseen=True)
        rows, eligible = seen + unseen, range(len(seen), len(seen) + len(unseen))
    else:
        rows = read_jsonl(Path(cfg.path))
        eligible = range(len(rows))
    rows = [Example(cfg.prompt_template.format(prompt=r.prompt), r.answer) for r in rows]
    if cfg.eval_path is not None:
        heldout = [Example(cfg.prompt_template.format(prompt=r.prompt), r.answer) for r in read_jsonl(Path(cfg.eval_path))]
        return Datasets(train=rows, heldout=heldout[: cfg.eval_size])
    if len(eligible) < cfg.eval_size or len(rows) <= cfg.eval_size:
        raise DataError(f"{cfg.path}: {len(rows)} rows cannot give a held-out subset of {cfg.eval_size} and a training set")
    held = set(random.Random(seed).sample(list(eligible), cfg.eval_size))
    return Datasets(
        train=[r for i, r in enumerate(rows) if i not in held],
        heldout=[rows[i] for i in sorted(held)],
    )


def read_jsonl(path: Path) -> list[Example]:
    out = []
    with path.open() as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{n}: expected an object with 'prompt' and 'answer'")
            missing = [k for k in ("prompt", "answer") if k not in row]
            if missing:
                raise DataError(f"{path}:{n}: row has no {' and no '.join(repr(k) for k in missing)} field")
            out.append(Example(str(row["prompt"]), str(row["answer"])))
    if not out:
        raise DataError(f"{path}: no rows")
    return out


class BatchSampler:
    """Deterministic prompt order: epoch e is a shuffle seeded by (seed, e). The cursor alone is resumable state."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._epoch, self._order = -1, []

    def batch(self, cursor: int, size: int) -> list[int]:
        return [self._index(cursor + k) for k in range(size)]

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, self.n)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, list(range(self.n))
            random.Random(f"{self.seed}/{epoch}").shuffle(self._order)
        return self._order[offset]


# ---------------------------------------------------------------------------------------------
# Verifiers: extract(completion) -> the candidate answer or None; match(candidate, answer) -> bool

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _as_number(s: str) -> float | None:
    try:
        x = float(s.replace(",", "").strip())
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None  # unbalanced: treat as no answer


@dataclass(frozen=True)
class Verifier:
    name: str

    def extract(self, completion: str) -> str | None:
        text = completion.strip()
        if self.name == "exact":
            return text or None
        if self.name == "numeric":
            found = _NUMBER.findall(text)
            return found[-1] if found else None
        return _last_boxed(text)

    def is_correct(self, completion: str, answer: str) -> bool:
        got = self.extract(completion)
        if got is None:
            return False
        if self.name == "exact":
            return got == answer.strip()
        a, b = _as_number(got), _as_number(answer)
        if a is not None and b is not None:
            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        return got == answer.strip()
