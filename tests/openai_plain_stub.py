"""A plain OpenAI-compatible completions server for tests (plumbing stub), bound to 127.0.0.1 only.

It implements only what the OpenAI completions API documents (`GET /v1/models`; `POST /v1/completions` with a
prompt of token ids, `max_tokens`, `logprobs` up to 5 keyed by token text, `echo`) and none of the markers
evalkit's discovery reads as a dialect (`/props`, `/version`, `/tokenize`), so evalkit treats it as a plain
server. The numbers come from an in-process llama.cpp model (`full_logprobs`); what is tested is evalkit's
side: the probe, the request plan within the server's limit, and reading the documented answer fields.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

MAX_LOGPROBS = 5  # the documented limit of `logprobs`


class PlainStub:
    def __init__(self, engine: Any, model_id: str = "plain-model") -> None:
        self.engine, self.model_id = engine, model_id
        self.lock = threading.Lock()  # one llama.cpp context: one request at a time
        self.requests: list[tuple[dict[str, Any], int]] = []  # (body, HTTP status answered)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": stub.model_id, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                code, answer = stub.complete(body)
                stub.requests.append((body, code))
                self._send(code, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "PlainStub":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def complete(self, body: dict[str, Any]) -> tuple[int, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400, {"error": {"message": "this stub takes a prompt of token ids"}}
        k = body.get("logprobs")
        if k is not None and not 0 <= int(k) <= MAX_LOGPROBS:
            return 400, {"error": {"message": f"logprobs must be between 0 and {MAX_LOGPROBS}"}}
        if body.get("stream"):
            return 400, {"error": {"message": "this stub does not stream"}}
        with self.lock:
            rows = np.concatenate([r for _, r in self.engine.full_logprobs(prompt)], axis=0)
        # rows[j] predicts prompt[j + 1]; the last row the first generated token (greedy).
        new = int(np.argmax(rows[len(prompt) - 1]))
        text = self.engine.detokenize([new])
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length"}
        if k is not None:
            def top(row: np.ndarray) -> dict[str, float]:
                idx = np.argsort(row)[::-1][: max(int(k), 1)]
                return {self.engine.detokenize([int(t)]): float(row[t]) for t in idx}

            seq = (list(prompt) if body.get("echo") else []) + [new]
            lps: list[float | None] = []
            tops: list[dict[str, float] | None] = []
            start = len(prompt) if not body.get("echo") else 0
            for pos in range(start, len(prompt) + 1):
                if pos == 0:
                    lps.append(None)
                    tops.append(None)
                    continue
                row = rows[pos - 1]
                tok = prompt[pos] if pos < len(prompt) else new
                lps.append(float(row[tok]))
                tops.append(top(row))
            choice["logprobs"] = {"tokens": [self.engine.detokenize([t]) for t in seq], "token_logprobs": lps,
                                  "top_logprobs": tops, "text_offset": list(range(len(seq)))}
        return 200, {"id": "cmpl-stub", "object": "text_completion", "model": self.model_id, "choices": [choice],
                     "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}}
