"""A bounded fuzz of the daemon's HTTP API from its own OpenAPI document (schemathesis): valid and
invalid bodies, parameters and headers for every operation. Not one answer may be a server error.

In-process (ASGI) against the real app and supervisor on a temporary state directory; the
supervisor's worker is not started, so accepted runs queue and nothing trains.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from grpo_sentinel.service.daemon.app import create_app
from grpo_sentinel.service.daemon.supervisor import Supervisor

pytestmark = pytest.mark.slow  # the second tier (README, Tests)

EXAMPLES = 100  # per operation: ~1,000 requests, about half a minute on 2 cores


def test_no_request_gets_a_server_error(tmp_path):
    supervisor = Supervisor(tmp_path / "state")
    supervisor.runs_dir.mkdir(parents=True)
    # The test client sends `Host: testserver`; a tokenless daemon answers only the names it is given.
    app = create_app(supervisor, token=None, hosts=("testserver",))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def call(case):
            response = case.call()
            statuses.setdefault(operation.label, set()).add(response.status_code)
            documented = operation.label == "GET /readyz" and response.status_code == 503  # the worker is off
            assert response.status_code < 500 or documented, (case.method, case.path, case.body, response.text[:500])

        call()
    submit = statuses["POST /v1/runs"]
    assert 201 in submit and 422 in submit, submit  # the fuzz reached both sides of validation
    assert len(statuses) == sum(len(methods) for methods in app.openapi()["paths"].values())  # every operation
