"""Fetch the real-log corpus that benchmarks/bench_wild.py scores: each log its SOURCE names, at the commit it
names, from GitHub's raw file host, checked against the SOURCE's sha256, into `--logs DIR/<folder>/<log>`.

The logs are other people's data and are not committed here (benchmarks/bench_wild.py says why); this puts
them where the benchmark and tests/test_ingest_wild.py look. A log already there with the right digest is
kept; one with another digest is replaced. A file is written only whole and verified (a temporary name,
renamed), so an interrupted fetch leaves nothing half-written behind. Exit status 1 if any log could not be
fetched or verified, each with its reason.

    python benchmarks/fetch_wild.py [--logs ../shared/wild] [--corpus benchmarks/wild]
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import yaml
from bench_wild import CORPUS, LOGS, find_log, sha256

RAW = "https://raw.githubusercontent.com"


def source_path(path: str) -> str:
    """SOURCE's `path`, without the note a few carry after it ("... (branch experiments)"): the commit names
    the file whatever branch holds it."""
    return re.sub(r"\s+\(branch [^)]*\)$", "", path.strip())


def fetch_one(folder: Path, logs: Path, base: str, timeout: float) -> tuple[str, str]:
    """(status, detail): status one of kept, fetched, failed."""
    meta = yaml.safe_load((folder / "SOURCE").read_text(encoding="utf-8"))
    want = meta.get("sha256")
    if not want:
        return "failed", f"{folder}/SOURCE names no sha256: add the digest of the file its authors' words are about"
    here = find_log(folder, meta["log"], logs)  # the file bench_wild would score
    if here is not None and sha256(here.read_bytes()) == want:
        return "kept", str(here)
    target = logs / folder.name / meta["log"]
    url = f"{base}/{meta['repository']}/{meta['commit']}/{quote(source_path(meta['path']))}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as e:
        return "failed", f"{url}: HTTP {e.code} (is the repository still public, the commit still there?)"
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        return "failed", f"{url}: {getattr(e, 'reason', e)} (no network here? fetch it by hand into {target})"
    if sha256(data) != want:
        return "failed", f"{url}: sha256 {sha256(data)[:16]}... is not SOURCE's {want[:16]}...: not the log scored here"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return "fetched", f"{target} ({len(data):,} bytes)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=Path, default=LOGS, help="where to put the logs, one folder each")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="the folders of SOURCE files")
    ap.add_argument("--base-url", default=RAW, help="the raw file host (a mirror, or a local server in tests)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    args = ap.parse_args(argv)
    folders = sorted(p for p in args.corpus.iterdir() if (p / "SOURCE").is_file())
    counts = {"kept": 0, "fetched": 0, "failed": 0}
    for i, folder in enumerate(folders, 1):
        status, detail = fetch_one(folder, args.logs, args.base_url.rstrip("/"), args.timeout)
        counts[status] += 1
        print(f"[{i}/{len(folders)}] {folder.name}: {status}: {detail}", flush=True)
    print(f"{len(folders)} logs: {counts['kept']} already here, {counts['fetched']} fetched, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
