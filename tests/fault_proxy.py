"""A fault-injecting HTTP proxy in front of a real server, bound to 127.0.0.1 only (tests and benchmarks).

Each request is forwarded to the upstream server, except at chosen requests, where the proxy
- answers 429 (rate limited) or 500 without asking upstream,
- "drop": closes the connection without an answer, or
- "cut": forwards the request (the server does the work) and cuts the answer's stream part-way, the case
  where a careless client counts a request twice or keeps half an answer.
Faults are chosen by a seeded generator at `rate` (or at explicit request numbers), so a run is reproducible.
Hand-written on aiohttp's server (no proxy library injects faults mid-stream).
"""
from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

import httpx
from aiohttp import web

FAULTS = ("429", "500", "drop", "cut")


@dataclass
class FaultProxy:
    upstream: str  # e.g. http://127.0.0.1:8080
    rate: float = 0.2
    seed: int = 0
    at: dict[int, str] | None = None  # request number (0-based) -> fault, instead of `rate`
    skip_paths: tuple[str, ...] = ("/health",)
    counts: Counter = field(default_factory=Counter)
    log: list[tuple[int, str, str]] = field(default_factory=list)  # (request number, path, fault or "ok")

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._n = 0
        self._lock = threading.Lock()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _choose(self, path: str) -> tuple[int, str]:
        with self._lock:
            n = self._n
            self._n += 1
            if path in self.skip_paths:
                fault = "ok"
            elif self.at is not None:
                fault = self.at.get(n, "ok")
            else:
                fault = self._rng.choice(FAULTS) if self._rng.random() < self.rate else "ok"
            self.counts[fault] += 1
            self.log.append((n, path, fault))
            return n, fault

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        _, fault = self._choose(request.path)
        if fault in ("429", "500"):
            return web.json_response({"error": {"message": f"fault proxy: injected {fault}", "code": int(fault)}},
                                     status=int(fault))
        if fault == "drop":
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPInternalServerError()  # never sent: the connection is gone
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(timeout=None) as client:
            async with client.stream(request.method, self.upstream + request.path_qs, content=body, headers=headers) as up:
                resp = web.StreamResponse(status=up.status_code, headers={
                    k: v for k, v in up.headers.items() if k.lower() in ("content-type", "cache-control")})
                await resp.prepare(request)
                sent = 0
                async for chunk in up.aiter_raw():
                    await resp.write(chunk)
                    sent += len(chunk)
                    if fault == "cut" and sent > 64:  # part of the answer, then the connection dies
                        if request.transport is not None:
                            request.transport.close()
                        return resp
                if fault == "cut" and request.transport is not None:  # a short answer: cut before its end
                    request.transport.close()
                    return resp
                await resp.write_eof()
                return resp

    def start(self) -> "FaultProxy":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
