"""`grpo-sentinel serve`: the long-running trainer daemon."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn
import yaml
from pydantic import Field, ValidationError, field_validator

from grpo_sentinel.service.config import ConfigError, load_config
from grpo_sentinel.service.daemon import TOKEN_ENV
from grpo_sentinel.service.daemon.admission import Admission, Limits, with_absolute_paths
from grpo_sentinel.telemetry.settings import Section, error_lines

log = logging.getLogger("grpo_sentinel")


class DaemonSettings(Section):
    listen: str = Field("127.0.0.1:8000", description="HOST:PORT of the API (and /metrics, /healthz, /readyz).")
    state_dir: str = Field("grpo-state", description="Queue and run directories; put it on a persistent volume.")
    grace_s: float = Field(30.0, gt=0, description="SIGTERM to exit: the running run checkpoints within it "
                                                   "(match the pod's terminationGracePeriodSeconds).")
    run_at_start: str | None = Field(None, description="A run config (YAML) queued at the first start (once: a "
                                                       "restart finds it by its run id).")
    reward_modules: list[str] = Field(default_factory=list, description="Python modules (and their submodules) whose "
                                      "functions a submitted run may use as rewards; the built-ins are always allowed.")
    allowed_paths: list[str] = Field(default_factory=lambda: ["."], description="Directories a submitted run's model "
                                     "and data paths must lie under (default: the directory the daemon starts in).")
    limits: Limits = Field(default_factory=Limits, description="Upper bounds on a submitted run's size.")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:8000 or 0.0.0.0:8000 (got {v!r})")
        return v

    def admission(self) -> Admission:
        roots = tuple(Path(os.path.realpath(Path(p).expanduser())) for p in self.allowed_paths)
        return Admission(tuple(self.reward_modules), roots, self.limits)

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def settings(args) -> DaemonSettings:
    raw: dict = {}
    if args.config is not None:
        try:
            raw = yaml.safe_load(Path(args.config).read_text()) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ConfigError(f"daemon config {args.config}: cannot read it ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"daemon config {args.config}: expected a mapping of {', '.join(DaemonSettings.model_fields)}")
    for key in ("listen", "state_dir", "grace_s", "run_at_start", "reward_modules", "allowed_paths"):  # flags win
        value = getattr(args, key)
        if value is not None:
            raw[key] = value if key in ("grace_s", "reward_modules") else \
                [str(v) for v in value] if isinstance(value, list) else str(value)
    for item in getattr(args, "limits", None) or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--limit {item!r}: expected NAME=N, e.g. --limit group_size=512")
        raw.setdefault("limits", {})[name.strip()] = value.strip()
    try:
        return DaemonSettings.model_validate(raw)
    except ValidationError as e:
        lines = error_lines(e.errors(), DaemonSettings)
        raise ConfigError("\n".join([f"invalid daemon config ({len(lines)} problem{'s' * (len(lines) > 1)}):",
                                      *(f"  - {line}" for line in lines)])) from None


class _Server(uvicorn.Server):
    """uvicorn re-raises the signal that stopped it once it has shut down (so the process dies of it:
    exit 143). A SIGTERM to the daemon is a graceful stop that must exit 0, so the daemon takes the
    signals itself."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def serve(args) -> int:
    from grpo_sentinel.service.daemon.app import create_app
    from grpo_sentinel.service.daemon.supervisor import Supervisor

    try:
        s = settings(args)
        token = os.environ.get(TOKEN_ENV) or None
        if not s.loopback and token is None:
            raise ConfigError(f"--listen {s.listen} is reachable beyond this host: set {TOKEN_ENV} (the API then "
                              "requires 'Authorization: Bearer <token>'), or listen on 127.0.0.1")
        boot = with_absolute_paths(load_config(s.run_at_start)) if s.run_at_start else None  # the operator's own
    except ConfigError as e:
        print(f"grpo-sentinel serve: {e}", file=sys.stderr)
        return 2
    supervisor = Supervisor(Path(s.state_dir), s.grace_s)
    supervisor.start()
    admission = s.admission()
    if boot is not None:
        # Queued once: a pod restart finds the run by its id and resumes it instead of starting another.
        run_id = boot.run.run_id or "boot-" + hashlib.sha256(boot.to_yaml().encode()).hexdigest()[:8]
        if run_id not in supervisor.run_ids():
            supervisor.submit(boot.model_copy(update={"run": boot.run.model_copy(update={"run_id": run_id})}))
    app = create_app(supervisor, token, admission, hosts=None if token else (s.host,))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        supervisor.shutdown()  # after the server stopped taking requests: the run checkpoints

    app.router.lifespan_context = lifespan
    server = _Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning", lifespan="on",
                                    timeout_graceful_shutdown=2))
    def stop(signum, frame) -> None:
        log.info("received %s: shutting down (the running run, if any, checkpoints first)", signal.Signals(signum).name)
        app.state.stopping.set()  # the event streams end at once instead of holding up the shutdown
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    log.info("grpo-sentinel daemon on http://%s/ (state %s, grace %.0f s)%s", s.listen, s.state_dir, s.grace_s,
             "" if token is None else ", API token required")
    server.run()
    log.info("grpo-sentinel daemon stopped")
    return 0
