"""A served stub judge for plumbing tests: a vLLM-dialect OpenAI server on 127.0.0.1 that answers each judge
prompt from a fixed table (a function of the answers it is shown), never a model.

Tokens are Unicode code points (its /tokenize and /detokenize say so), so the judge prompt evalkit sends comes
back to the stub as text. The model id it lists names the table: a different table is a different served
model, so the result cache never hands one table's answers to another.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

# The stub's table: (mode "pointwise" | "pairwise", the answer(s) shown: [answer] or [A, B]) -> the reply text.
Table = Callable[[str, list[str]], str]

_POINT = re.compile(r"# Answer to grade\n(.*?)\n\n# Your reply", re.S)
_PAIR = re.compile(r"# Answer A\n(.*?)\n\n# Answer B\n(.*?)\n\n# Your reply", re.S)


class StubJudge:
    def __init__(self, table: Table, model_id: str) -> None:
        self.table, self.model_id, self.calls = table, model_id, 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, payload: object) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"data": [{"id": stub.model_id, "max_model_len": 1 << 20}]})
                elif self.path == "/version":
                    self._send(200, {"version": "0.0-stub"})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/tokenize":
                    text = body["messages"][-1]["content"] if "messages" in body else body.get("prompt", "")
                    self._send(200, {"tokens": [ord(c) for c in text]})
                elif self.path == "/detokenize":
                    self._send(200, {"prompt": "".join(chr(t) for t in body["tokens"])})
                elif self.path == "/v1/completions":
                    if "prompt_logprobs" in body or "logprob_token_ids" in body:
                        self._send(400, {"error": "the stub gives no log-probs"})
                        return
                    stub.calls += 1
                    reply = stub.answer("".join(chr(t) for t in body["prompt"]))
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    ids = [ord(c) for c in reply] + [0]  # vLLM streams the stop token's id; the engine drops it
                    chunk = {"choices": [{"text": reply, "token_ids": ids, "finish_reason": "stop"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
                else:
                    self._send(404, {"error": "not found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, prompt: str) -> str:
        pair = _PAIR.search(prompt)
        if pair is not None:
            return self.table("pairwise", [pair.group(1), pair.group(2)])
        point = _POINT.search(prompt)
        return self.table("pointwise", [point.group(1) if point else ""])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "StubJudge":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
