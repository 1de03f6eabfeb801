"""A local stand-in for a Langfuse server, implementing its documented ingestion contract (no
Langfuse server can run here: it needs Docker and a recent ClickHouse):

- `POST /api/public/otel/v1/traces`: OTLP/HTTP protobuf (`ExportTraceServiceRequest`, gzip),
  Basic auth with public:secret key; decoded with the real OTLP protobuf classes;
- `POST /api/public/scores`: a JSON list of scores, Basic auth; 202 `{"message": "Accepted"}`.

Wrong keys get 401. Everything received is kept, decoded, for the tests to read.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


class FakeLangfuse:
    def __init__(self, public_key: str = "pk-lf-test", secret_key: str = "sk-lf-test"):
        self.auth = "Basic " + base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
        self.spans: list[dict] = []
        self.scores: list[dict] = []
        self.requests: list[dict] = []  # every request: path, headers, raw body (for secret checks)
        self.rejected = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.headers.get("Authorization") != server.auth:
                    server.rejected += 1
                    return self._answer(401, b'{"message": "Invalid credentials"}', "application/json")
                if self.path == "/api/public/otel/v1/traces":
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    req = ExportTraceServiceRequest.FromString(body)
                    for rs in req.resource_spans:
                        for ss in rs.scope_spans:
                            for sp in ss.spans:
                                server.spans.append({
                                    "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                                    "parent_id": sp.parent_span_id.hex(), "name": sp.name,
                                    "attributes": {a.key: _value(a.value) for a in sp.attributes}})
                    return self._answer(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")
                if self.path == "/api/public/scores":
                    server.scores += json.loads(body)
                    return self._answer(202, b'{"message": "Accepted"}', "application/json")
                self._answer(404, b"{}", "application/json")

            def _answer(self, code: int, body: bytes, ctype: str):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def traces(self) -> dict[str, list[dict]]:
        """trace id -> its spans."""
        out: dict[str, list[dict]] = {}
        for s in self.spans:
            out.setdefault(s["trace_id"], []).append(s)
        return out

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
