"""Links to Langfuse pages, built locally: pure URL building, no keys and no network (the SDK's
`get_trace_url()` asks the server for the project and raises when it is down). The record, the sink's
log lines, `diagnose` and the daemon's run view all link traces through this one module.

The URL scheme is the Langfuse web app's (v4): `{base}/project/{project}/traces/{trace id}` and
`{base}/project/{project}/sessions/{session id}`; a run's session is its run id.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass


@dataclass(frozen=True)
class Links:
    """Langfuse pages of one project; without a project id only trace ids can be named (empty links)."""

    base_url: str
    project_id: str | None

    def trace(self, tid: str) -> str:
        return f"{self.base_url}/project/{self.project_id}/traces/{tid}" if self.project_id else ""

    def session(self, run_id: str) -> str:
        return (f"{self.base_url}/project/{self.project_id}/sessions/{urllib.parse.quote(run_id, safe='')}"
                if self.project_id else "")


def links(project_id: str | None = None, base_url: str | None = None) -> Links | None:
    """The links of `project_id` (default: LANGFUSE_PROJECT_ID) at `base_url` (default: LANGFUSE_BASE_URL or
    LANGFUSE_HOST, as the SDK reads them); None when no base URL is known."""
    base = base_url or os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST")
    return Links(base.rstrip("/"), project_id or os.environ.get("LANGFUSE_PROJECT_ID")) if base else None
