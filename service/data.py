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
    source: str = ""  # "file:line" of the row, for errors that point at it


def is_unseen(a: int, b: int) -> bool:
    """The demo's held-out tenth: its warm-up never sees these problems."""
    return (a * 7 + b * 13) % 10 == 0  # a fixed, well-spread tenth of all (a, b)


def addition_examples(unseen: bool | None = None) -> list[Example]:
    """All problems 'a+b=' with 0 <= a, b < 100; `unseen` selects the warm-up-free tenth or the rest."""
    return [
        Example(f"{a}+{b}=", str(a + b))
        for a in range(100)
        for b in range(100)
        if unseen is None or is_unseen(a, b) == unseen
    ]


@dataclass(frozen=True)
class Datasets:
    train: list[Example]
    heldout: list[Example]  # fixed for the whole run, and disjoint from train by prompt
    notes: tuple[str, ...] = ()  # what was done to the data to get there (said at start, kept in summary.json)


def load_datasets(cfg: DataSettings, seed: int) -> Datasets:
    notes: list[str] = []
    if cfg.path == DEMO:
        # Held-out problems come from the tenth the demo's warm-up never saw (no prompt repeats).
        seen, unseen = addition_examples(unseen=False), addition_examples(unseen=True)
        rows, eligible = seen + unseen, range(len(seen), len(seen) + len(unseen))
    else:
        rows = _unique(read_jsonl(Path(cfg.path), cfg.prompt_template), cfg.path, notes)
        eligible = range(len(rows))
    if cfg.eval_path is not None:
        heldout = _unique(read_jsonl(Path(cfg.eval_path), cfg.prompt_template), cfg.eval_path, notes)[: cfg.eval_size]
        held = {e.prompt for e in heldout}
        overlap = sum(r.prompt in held for r in rows)
        if overlap:  # a prompt in both would make sample_acc measure training prompts
            notes.append(f"{cfg.eval_path}: {overlap} held-out prompts are also in {cfg.path}; they were removed "
                         "from training")
            rows = [r for r in rows if r.prompt not in held]
        if not rows:
            raise DataError(f"{cfg.path}: no training prompt is left that is not also held out in {cfg.eval_path}")
        return Datasets(train=rows, heldout=heldout, notes=tuple(notes))
    if len(eligible) < cfg.eval_size or len(rows) <= cfg.eval_size:
        raise DataError(f"{cfg.path}: {len(rows)} distinct prompts cannot give a held-out subset of {cfg.eval_size} "
                        "and a training set: lower data.eval_size or give a separate data.eval_path")
    held_rows = set(random.Random(seed).sample(list(eligible), cfg.eval_size))
    return Datasets(
        train=[r for i, r in enumerate(rows) if i not in held_rows],
        heldout=[rows[i] for i in sorted(held_rows)],
        notes=tuple(notes),
    )


def _unique(rows: list[Example], path: str, notes: list[str]) -> list[Example]:
    """The first row of each prompt: the held-out split is drawn by row, so a repeated prompt could
    otherwise sit on both sides of it."""
    seen: dict[str, Example] = {}
    conflicting = 0
    for r in rows:
        if r.prompt in seen:
            conflicting += seen[r.prompt].answer != r.answer
        else:
            seen[r.prompt] = r
    dropped = len(rows) - len(seen)
    if dropped:
        notes.append(f"{path}: {dropped} rows repeat an earlier prompt and were dropped ({len(seen)} distinct prompts"
                     + (f"; {conflicting} of them with another answer: the first row's answer is kept)" if conflicting else ")"))
    return list(seen.values())


def read_jsonl(path: Path, template: str = "{prompt}") -> list[Example]:
    """Rows {"prompt": text, "answer": text or number}; every problem is a DataError naming file:line."""
    out = []
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: expected an object with 'prompt' and 'answer'")
                missing = [k for k in ("prompt", "answer") if k not in row]
                if missing:
                    raise DataError(f"{where}: row has no {' and no '.join(repr(k) for k in missing)} field")
                prompt, answer = row["prompt"], row["answer"]
                if not isinstance(prompt, str) or not prompt.strip():
                    raise DataError(f"{where}: 'prompt' must be a non-empty string, not {prompt!r}")
                if isinstance(answer, (int, float)) and not isinstance(answer, bool):
                    answer = str(answer)  # a numeric answer is unambiguous
                if not isinstance(answer, str) or not answer.strip():
                    raise DataError(f"{where}: 'answer' must be a non-empty string or a number, not {answer!r}")
                out.append(Example(template.format(prompt=prompt), answer, where))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); a JSONL dataset must be UTF-8") from None
    if not out:
        raise DataError(f"{path}: no rows")
    return out


def fit_prompts(data: Datasets, tokenizer, limit: int, mode: str) -> Datasets:
    """Every prompt within `limit` tokens: a longer one is a DataError naming its row (mode 'error'),
    or keeps its last `limit` tokens (mode 'truncate': the end of a prompt holds the question and
    the template's answer cue), said in the notes. Unbounded prompts cost unbounded memory and time."""
    notes, parts = list(data.notes), {}
    for name, rows in (("train", data.train), ("heldout", data.heldout)):
        ids = tokenizer([r.prompt for r in rows], add_special_tokens=False)["input_ids"]
        long = [i for i, t in enumerate(ids) if len(t) > limit]
        if long and mode == "error":
            r = rows[long[0]]
            raise DataError(f"{r.source or 'the demo'}: prompt of {len(ids[long[0]])} tokens is longer than "
                            f"data.max_prompt_tokens={limit} ({len(long)} such {name} rows): shorten it, raise the "
                            "limit, or set data.long_prompts=truncate")
        cut = {i: tokenizer.decode(ids[i][-limit:]) for i in long}
        parts[name] = [Example(cut[i], r.answer, r.source) if i in cut else r for i, r in enumerate(rows)]
        if long:
            notes.append(f"{len(long)} {name} prompts longer than {limit} tokens were cut to their last {limit}")
    return Datasets(parts["train"], parts["heldout"], tuple(notes))


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
