"""An OpenAI-compatible server in a thread that answers like tests.fakes.echo_script: the reflector's lesson is
the trace's task, word for word, the curator ADDs every lesson, the merger keeps every proposal. A stand-in for
a model that obeys what a trace says (the simulator does not read trace text), for the poisoning tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

from combee.llm import Role
from tests.fakes import echo_script

__all__ = ["EchoServer"]

_ROLE_BY_BLOCK = (("<trace>\n", Role.REFLECTOR), ("<reflections>\n", Role.CURATOR), ("<proposals>\n", Role.MERGER))


def _answer(body: dict[str, Any], cite: bool = False) -> str:
    messages = [SimpleNamespace(role=m["role"], content=m["content"]) for m in body["messages"]]
    user = "\n".join(m.content for m in messages if m.role == "user")
    role = next((r for tag, r in _ROLE_BY_BLOCK if tag in user), Role.GENERATOR)
    text = echo_script(SimpleNamespace(role=role, messages=messages))  # type: ignore[arg-type]
    if cite and role == Role.CURATOR:  # each ADD names the reflection it echoes, as the prompt asks
        block = user.split("<reflections>\n", 1)[1].split("\n</reflections>", 1)[0]
        refs = [json.loads(line)["ref"] for line in block.splitlines() if line.strip()]
        ops = json.loads(text)["operations"]
        text = json.dumps({"operations": [{**op, "from": [ref]} for op, ref in zip(ops, refs, strict=False)]})
    return text


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "echo", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        text = _answer(body, getattr(self.server, "cite", False))
        self._send(200, {
            "id": "echo-1", "object": "chat.completion", "created": 0, "model": body.get("model", "echo"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        })  # fmt: skip


class EchoServer:
    """Start with :meth:`start`, stop with :meth:`stop`; ``base_url`` ends in ``/v1``."""

    def __init__(self, cite: bool = False) -> None:
        """``cite``: curators name, in "from", the reflection each ADD comes from (echo_script does not)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.cite = cite  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> EchoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
