"""A fake Confluent Schema Registry for tests: the two REST endpoints the worker uses, as Confluent
documents them (no registry server can be installed from the package index here: Confluent's is Java,
Karapace is not published there).

- POST /subjects/{subject}: look a schema up. 200 {"subject", "id", "version", "schema"}; 404 with
  error_code 40401 (no such subject) or 40403 (schema not in the subject).
- POST /subjects/{subject}/versions: register. 200 {"id"}; the same schema keeps its id, in any
  subject; 409 (error_code 409) when the subject is marked incompatible.

Requests must carry the registry's content type and a JSON Schema (`schemaType: JSON`); anything else
is 415/422, so a client that speaks the API wrongly fails the test.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass
class RegistryState:
    schemas: dict[str, int] = field(default_factory=dict)  # schema text -> global id
    subjects: dict[str, list[int]] = field(default_factory=dict)  # subject -> ids by version
    incompatible: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (endpoint, subject)
    authorization: list[str | None] = field(default_factory=list)


class FakeRegistry:
    def __init__(self) -> None:
        self.state = RegistryState()
        state = self.state

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                state.authorization.append(self.headers.get("Authorization"))
                if self.headers.get("Content-Type") != CONTENT_TYPE:
                    return self._send(415, {"error_code": 415, "message": "unsupported media type"})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if body.get("schemaType") != "JSON" or not isinstance(body.get("schema"), str):
                    return self._send(422, {"error_code": 42201, "message": "invalid schema"})
                parts = self.path.split("/")
                if len(parts) == 3 and parts[1] == "subjects":
                    return self._lookup(unquote(parts[2]), body["schema"])
                if len(parts) == 4 and parts[1] == "subjects" and parts[3] == "versions":
                    return self._register(unquote(parts[2]), body["schema"])
                return self._send(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

            def _lookup(self, subject: str, schema: str) -> None:
                state.requests.append(("lookup", subject))
                if subject not in state.subjects:
                    missing = {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                    return self._send(404, missing)
                schema_id = state.schemas.get(schema)
                versions = state.subjects[subject]
                if schema_id not in versions:
                    return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                version = versions.index(schema_id) + 1
                found = {"subject": subject, "id": schema_id, "version": version, "schema": schema}
                return self._send(200, found)

            def _register(self, subject: str, schema: str) -> None:
                state.requests.append(("register", subject))
                if subject in state.incompatible:
                    message = "Schema being registered is incompatible with an earlier schema"
                    return self._send(409, {"error_code": 409, "message": message})
                schema_id = state.schemas.setdefault(schema, len(state.schemas) + 1)
                versions = state.subjects.setdefault(subject, [])
                if schema_id not in versions:
                    versions.append(schema_id)
                return self._send(200, {"id": schema_id})

            def _send(self, status: int, answer: dict[str, object]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> FakeRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
