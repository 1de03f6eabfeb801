"""benchmarks/fetch_wild.py over real HTTP on loopback: a server laid out as GitHub's raw file host
(/<owner>/<repo>/<commit>/<path>), SOURCE files as the corpus writes them."""

import hashlib
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import fetch_wild  # noqa: E402  (benchmarks/ is not a package)

LOG = b'{"log_history": [{"step": 1, "reward": 0.5}]}\n'


def source(folder: Path, log: str, path: str, sha: str) -> None:
    folder.mkdir(parents=True)
    (folder / "SOURCE").write_text(f"log: '{log}'\nrepository: someone/runs\npath: '{path}'\n"
                                   f"commit: {'ab' * 20}\nsha256: {sha}\nexpect: none\n")


@pytest.fixture
def raw_host(tmp_path):
    """A raw file host on 127.0.0.1 serving tmp_path/host; yields (base URL, the paths requested)."""
    root = tmp_path / "host" / "someone" / "runs" / ("ab" * 20)
    (root / "nb").mkdir(parents=True)
    (root / "nb" / "Qwen2.5_(3B)-GRPO.ipynb").write_bytes(LOG)
    (root / "other.json").write_bytes(b"a later version of the file\n")
    requested = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requested.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(tmp_path / "host")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", requested
    server.shutdown()


def test_fetches_verifies_and_keeps(tmp_path, raw_host, capsys):
    base, requested = raw_host
    corpus, logs = tmp_path / "corpus", tmp_path / "logs"
    digest = hashlib.sha256(LOG).hexdigest()
    # A name with parentheses, and the branch note a few SOURCE paths carry: quoted, and the note dropped.
    source(corpus / "a-notebook", "Qwen2.5_(3B)-GRPO.ipynb", "nb/Qwen2.5_(3B)-GRPO.ipynb (branch experiments)", digest)
    source(corpus / "b-changed", "other.json", "other.json", digest)  # the host has another version
    source(corpus / "c-gone", "gone.json", "gone.json", digest)  # 404
    args = ["--corpus", str(corpus), "--logs", str(logs), "--base-url", base, "--timeout", "5"]

    assert fetch_wild.main(args) == 1
    out = capsys.readouterr().out
    assert (logs / "a-notebook" / "Qwen2.5_(3B)-GRPO.ipynb").read_bytes() == LOG
    assert "[2/3] b-changed: failed" in out and "is not SOURCE's" in out
    assert "[3/3] c-gone: failed" in out and "HTTP 404" in out
    assert not (logs / "b-changed").exists() and not (logs / "c-gone").exists()  # nothing half-written or wrong
    assert "3 logs: 0 already here, 1 fetched, 2 failed" in out
    assert "/someone/runs/" + "ab" * 20 + "/nb/Qwen2.5_%283B%29-GRPO.ipynb" in requested[0]

    # Again: the verified file is kept, not fetched again; a corrupted one is replaced.
    requested.clear()
    fetch_wild.main(args)
    assert "a-notebook: kept" in capsys.readouterr().out and not any("Qwen" in p for p in requested)
    (logs / "a-notebook" / "Qwen2.5_(3B)-GRPO.ipynb").write_bytes(b"truncated")
    fetch_wild.main(args)
    assert "a-notebook: fetched" in capsys.readouterr().out
    assert (logs / "a-notebook" / "Qwen2.5_(3B)-GRPO.ipynb").read_bytes() == LOG


def test_every_source_names_its_digest():
    corpus = Path(fetch_wild.CORPUS)
    sources = sorted(corpus.glob("*/SOURCE"))
    assert len(sources) >= 27
    import yaml

    missing = [s.parent.name for s in sources if len(str(yaml.safe_load(s.read_text()).get("sha256", ""))) != 64]
    assert not missing
