"""HTTP to an OpenAI-compatible server: JSON calls and server-sent-event streams, with bounded retries.

Retries come from tenacity (exponential backoff with jitter) around httpx calls. What is retried: connection
errors, timeouts, a stream cut before its end, HTTP 429 and 5xx. What is not: any other 4xx (the request is
wrong; retrying cannot help). A streamed request that fails part-way is retried from the start and only the
attempt that finishes is returned, so a request is never counted twice; one that still fails after the last
attempt raises `ServedRequestError`, and the caller leaves its item pending (a record is written only for a
finished request).

The API key (read by the caller from the environment variable the config names) lives only in the
Authorization header of this client; error messages never include headers.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Coroutine, TypeVar

import httpx
from tenacity import AsyncRetrying, RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

# tenacity 9.2 renamed the first wait's `initial` to `multiplier` and warns on every retrying object built with it.
_FIRST_WAIT = "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter).parameters else "initial"

T = TypeVar("T")

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class ServedRequestError(RuntimeError):
    """A request that failed for good (after every retry, or at once for a request the server refused)."""

    def __init__(self, what: str, problem: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(f"{what}: {problem}")
        self.status = status
        self.transient = transient


class _Transient(Exception):
    """An HTTP answer worth retrying (429, 5xx) or a stream that ended before its last event."""

    def __init__(self, problem: str, status: int | None = None) -> None:
        super().__init__(problem)
        self.status = status


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (_Transient, httpx.TransportError))


def _problem(e: BaseException | None) -> str:
    if isinstance(e, httpx.TransportError):
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return str(e)


def _server_message(resp: httpx.Response) -> str:
    """The server's own error line (vLLM and llama-server answer {"error": {"message": ...}} or {"message": ...})."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


@dataclass
class RetryPolicy:
    attempts: int = 5  # tries per request, the first included
    initial_s: float = 0.2
    max_s: float = 5.0
    retried: int = field(default=0, compare=False)  # attempts that failed and were tried again (run_stats)

    def _kwargs(self) -> dict[str, Any]:
        def count(_: Any) -> None:
            self.retried += 1

        return dict(stop=stop_after_attempt(self.attempts), wait=wait_exponential_jitter(max=self.max_s, **{_FIRST_WAIT: self.initial_s}),
                    retry=retry_if_exception(_retryable), reraise=False, before_sleep=count)


class ServerClient:
    """One server: synchronous JSON calls for discovery and scoring, async streams for generation.

    The async side runs on an event loop in a daemon thread of its own, so a caller consuming results (writing
    records) never stalls the streams being timed.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 retry: RetryPolicy | None = None, max_connections: int = 16) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url  # llama-server's own API
        self.retry = retry or RetryPolicy()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._headers = headers
        self._sync = httpx.Client(headers=headers, timeout=self._timeout, limits=self._limits)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        """`/v1/...` paths hang off base_url; others (`/health`, `/tokenize`, `/props`) off the server root."""
        return self.base_url + path[3:] if path.startswith("/v1/") else self.root + path

    # -- synchronous calls ---------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, retry: bool = True) -> Any:
        """One JSON request; the decoded answer. Raises ServedRequestError (after retries when `retry`)."""
        def once() -> Any:
            resp = self._sync.request(method, self.url(path), json=body)
            return self._decode(resp, f"{method} {path}")

        if not retry:
            try:
                return once()
            except (_Transient, httpx.TransportError) as e:
                raise ServedRequestError(f"{method} {path}", _problem(e), getattr(e, "status", None), True) from None
        try:
            for attempt in Retrying(**self.retry._kwargs()):
                with attempt:
                    return once()
        except RetryError as e:
            raise self._gave_up(f"{method} {path}", e) from None
        raise AssertionError("unreachable")

    def _gave_up(self, what: str, e: RetryError) -> ServedRequestError:
        """The error once every attempt failed: the last attempt's problem, said to be transient."""
        last = e.last_attempt.exception()
        return ServedRequestError(what, f"{_problem(last)} (after {self.retry.attempts} attempts)",
                                  getattr(last, "status", None), True)

    @staticmethod
    def _decode(resp: httpx.Response, what: str) -> Any:
        if resp.status_code in RETRY_STATUS:
            raise _Transient(f"HTTP {resp.status_code}: {_server_message(resp)}", resp.status_code)
        if resp.status_code >= 400:
            raise ServedRequestError(what, f"HTTP {resp.status_code}: {_server_message(resp)}", resp.status_code)
        try:
            return resp.json()
        except ValueError:
            raise _Transient(f"answer is not JSON: {resp.text[:120]!r}") from None

    # -- streams (async, on the client's own loop) ---------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="evalkit-served-http", daemon=True)
            self._thread.start()
            self._loop = loop

            async def make() -> httpx.AsyncClient:
                return httpx.AsyncClient(headers=self._headers, timeout=self._timeout, limits=self._limits)

            self._async = asyncio.run_coroutine_threadsafe(make(), loop).result()
        return self._loop

    def submit(self, coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> "concurrent.futures.Future[T]":
        """Run `coro_fn()` on the client's loop; a concurrent.futures.Future of its result."""
        loop = self._ensure_loop()
        return asyncio.run_coroutine_threadsafe(coro_fn(), loop)

    async def acall(self, method: str, path: str, body: Any = None) -> Any:
        """`call` on the client's loop (many at once: scoring requests)."""
        assert self._async is not None
        try:
            async for attempt in AsyncRetrying(**self.retry._kwargs()):
                with attempt:
                    resp = await self._async.request(method, self.url(path), json=body)
                    return self._decode(resp, f"{method} {path}")
        except RetryError as e:
            raise self._gave_up(f"{method} {path}", e) from None
        raise AssertionError("unreachable")

    async def stream(self, path: str, body: dict[str, Any], consume: Callable[[], "StreamConsumer"]) -> Any:
        """POST a streaming request and feed each event to a fresh consumer per attempt; retried as a whole
        (a consumer from a failed attempt is dropped). Returns the finishing consumer's `result()`."""
        assert self._async is not None
        try:
            async for attempt in AsyncRetrying(**self.retry._kwargs()):
                with attempt:
                    sink = consume()
                    async with self._async.stream("POST", self.url(path), json=body) as resp:
                        if resp.status_code >= 400:
                            await resp.aread()
                            self._decode(resp, f"POST {path}")  # raises
                        async for data in _sse_data(resp.aiter_lines()):
                            if sink.feed(data):
                                break
                    if not sink.done:
                        raise _Transient("the stream ended before its last event")
                    return sink.result()
        except RetryError as e:
            raise self._gave_up(f"POST {path}", e) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._sync.close()
        if self._loop is not None:
            loop, client = self._loop, self._async
            if client is not None:
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
                except Exception:  # closing a client whose loop is gone: nothing left to free
                    pass
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._loop = None


class StreamConsumer:
    """What one streamed request collects; `feed` returns True at the last event (`done` is then True)."""

    done: bool = False

    def feed(self, data: Any) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def result(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[Any]:
    """The JSON payload of each `data:` line of a server-sent-event stream (`[DONE]` ends it; comments and
    blank lines are skipped). An `error:` line or an error payload is raised as the server's message."""
    async for line in lines:
        if not line or line.startswith(":"):
            continue
        if line.startswith("error:"):
            raise _Transient(f"server error in stream: {line[6:].strip()[:300]}")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            yield "[DONE]"
            return
        try:
            data = json.loads(payload)
        except ValueError:
            raise _Transient(f"undecodable stream event: {payload[:120]!r}") from None
        if isinstance(data, dict) and "error" in data and not data.get("choices"):
            err = data["error"]
            raise _Transient(f"server error in stream: {err.get('message', err) if isinstance(err, dict) else err}")
        yield data
