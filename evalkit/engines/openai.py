"""Engine `openai`: a deployment behind an OpenAI-compatible server (`vllm serve`, `llama-server`, any other).

Either `base_url` names a running server, or `server` names a program evalkit starts itself for the
deployment's weights (`evalkit.engines.launcher`: a free 127.0.0.1 port, the log in the run directory, stopped
when the unit ends, never left running).

What the server can do is asked, not assumed (`evalkit.engines.openai_discovery.discover`): its models, which
API it speaks (llama.cpp's own `/completion` with token ids out; vLLM's `/v1/completions` with
`prompt_logprobs`, `logprob_token_ids` and `return_token_ids`; a plain OpenAI API), `/tokenize`, the top-k it
allows (`max_logprobs`) and its chat template. A suite needing what the server lacks is skipped at plan time
with the server's reason. Each API is one class in `evalkit.engines.openai_dialects` (`LlamaServer`,
`VllmServer`, `PlainOpenAI`): this module asks the dialect, never which one it is.

Same tokens in as in-process: when the deployment names its weights (`model:`), prompts are tokenized here
with the very code of the in-process engine for those weights (llama.cpp's for a GGUF, the HF tokenizer for a
checkpoint, chat template included) and sent as token ids; a sample is checked against the server's own
tokenization (`/apply-template` + `/tokenize`, or vLLM's `/tokenize` with messages) and the agreement is in the
engine description. Without weights the server tokenizes (and the cache key is what the server reports).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import queue
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores
from evalkit.engines.openai_dialects import Collect, ServerTokens, dialect_for
from evalkit.engines.openai_discovery import LAUNCHED_CAPS, MAX_TOP_K as LAUNCHED_TOP_K, ServerFacts, discover
from evalkit.engines.served_http import RetryPolicy, ServedRequestError, ServerClient
from evalkit.engines.spec import Capability, EngineSpec, UnitResources
from evalkit.engines.tokenizer import TokenizerOnly
from evalkit.errors import ConfigError

if TYPE_CHECKING:
    from evalkit.engines.launcher import ServerProcess

DEFAULT_URL = "http://127.0.0.1:8000/v1"
NEXT_TOKEN_K = 64  # top-k first asked of an answer position (a multiple-choice letter is nearly always in it)


class OpenAIOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = Field(default=None, pattern=r"^https?://")  # e.g. http://127.0.0.1:8080/v1
    served_model: str | None = None  # None: the server's first (llama-server, vLLM: only) model
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # the variable's NAME
    max_concurrency: int = Field(default=16, ge=1)  # requests in flight at once
    # Log-prob requests (perplexity's prompt log-probs, MMLU's answer position) in flight at once. None: the
    # dialect's (llama-server: 1, as in-process llama.cpp scores one sequence at a time: its slots batch
    # concurrent requests together, which changes the numbers; vLLM and others: max_concurrency).
    scoring_concurrency: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=600.0, gt=0)  # one request (a whole streamed generation)
    retries: int = Field(default=4, ge=0)  # further attempts after a transient failure (429, 5xx, dropped)
    # The launcher (with base_url null): which program serves the deployment's weights, and how.
    launch: Literal["llama-server", "vllm"] | None = None
    launch_args: list[str] = Field(default_factory=list)  # appended to the launcher's command line
    n_ctx: int = Field(default=4096, ge=16)  # context per sequence of a launched server
    parallel: int = Field(default=1, ge=1)  # llama-server --parallel (slots); vLLM batches continuously
    launch_threads: int | None = Field(default=None, ge=1)  # llama-server --threads (None: the free cores)
    flash_attn: bool | Literal["auto"] = False  # llama-server -fa (off, as the in-process llama.cpp engine's default)
    n_batch: int = Field(default=512, ge=1)  # llama-server -b and -ub (the in-process engine's n_batch)
    launch_timeout_s: float = Field(default=600.0, gt=0)
    cache_prompt: bool = False  # llama-server's prompt-prefix reuse (can change results: off, as in-process)
    chat_template: Literal["auto", "none"] = "auto"
    tokenizer_check: int = Field(default=8, ge=0)  # prompts checked against the server's own tokenization

    @model_validator(mode="before")
    @classmethod
    def _default_url(cls, data: Any) -> Any:
        # Options left out entirely: a server on this machine at vLLM's default port.
        if isinstance(data, dict) and data.get("base_url") is None and data.get("launch") is None:
            return {**data, "base_url": DEFAULT_URL}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> "OpenAIOptions":
        if (self.base_url is None) == (self.launch is None):
            raise ValueError("set exactly one of base_url (a running server) and launch (llama-server or vllm, "
                             "started by evalkit for the deployment's weights)")
        return self


def api_key(options: OpenAIOptions, where: str) -> str | None:
    """The API key from the environment variable the options name; a missing variable is the user's error."""
    if options.api_key_env is None:
        return None
    value = os.environ.get(options.api_key_env)
    if not value:
        raise ConfigError(where, f"api_key_env names {options.api_key_env}, which is not set in the environment")
    return value


# -- tokens ------------------------------------------------------------------------------------------


def local_tokenizer(model_path: str | None, options: OpenAIOptions) -> TokenizerOnly | None:
    """The in-process engine's own tokenization for these weights (a GGUF: llama.cpp's; a checkpoint: the HF
    tokenizer, as vLLM); None without weights."""
    if not model_path:
        return None
    if Path(model_path).is_dir():
        from evalkit.engines.tokenizer import VllmTokenizer

        return VllmTokenizer(model_path, options)
    from evalkit.engines.llamacpp import llamacpp_tokenizer

    return llamacpp_tokenizer(model_path, options)


class OpenAIEngine(Engine):
    name = "openai"

    def __init__(self, model_path: str | None, options: OpenAIOptions, deployment: str | None = None) -> None:
        self.options = options
        self.model_path = str(model_path) if model_path else None
        # The worker names its deployment (the launched server's alias and log file are called after it).
        self.deployment = deployment or os.environ.get("EVALKIT_DEPLOYMENT") or "openai"
        deployment = self.deployment
        self.server: ServerProcess | None = None  # a server evalkit launched
        start = time.perf_counter()
        key = api_key(options, f"deployment {deployment}")
        base_url = options.base_url
        self._launch: dict[str, Any] | None = None
        if options.launch is not None:
            base_url = self._start_server()
        assert base_url is not None
        self._retry = RetryPolicy(attempts=options.retries + 1)
        self.client = ServerClient(base_url, key, options.timeout_s, self._retry, options.max_concurrency)
        try:
            # A running server's limits are probed once per run: the run's plan-time discovery (handed to its
            # workers), else asked here (a launched server, a worker the plan's facts did not reach).
            planned = None if self.server is not None else planned_facts(options)
            self.facts = planned or discover(self.client, options.served_model or (deployment if self.server else None),
                                             f"deployment {deployment}")
            self._tok = local_tokenizer(self.model_path, options)
        except BaseException:
            self.close()
            raise
        self.dialect = dialect_for(self.client, self.facts, options.cache_prompt)
        self._server_tok = ServerTokens(self.dialect, options.chat_template)
        self._load_s = time.perf_counter() - start
        self._token_check: dict[str, Any] = {"checked": 0, "agree": 0, "mismatches": []}
        self._requests = 0
        self._failed = 0
        self._refetched = 0  # llama-server generations whose ids its stream left out (asked again unstreamed)

    def _start_server(self) -> str:
        from evalkit.engines.launcher import ServerSettings, check_program, plan_launch, start_server

        opts = self.options
        assert opts.launch is not None
        if not self.model_path:
            raise ConfigError(f"deployment {self.deployment}", f"launch: {opts.launch} needs the deployment's weights (model:)")
        check_program(opts.launch)
        settings = ServerSettings(n_ctx=opts.n_ctx, parallel=opts.parallel, threads=opts.launch_threads,
                                  flash_attn=opts.flash_attn, n_batch=opts.n_batch)
        plan = plan_launch(opts.launch, self.model_path, settings, extra=list(opts.launch_args), served_model=self.deployment)
        server = self.server = start_server(plan, self.deployment, opts.launch_timeout_s)
        return server.root_url + "/v1"

    # -- tokens -------------------------------------------------------------------------------------

    @property
    def _tokens(self) -> Any:
        return self._tok if self._tok is not None else self._server_tok

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self._tokens.tokenize(text, add_bos)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._tokens.detokenize(token_ids)

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        ids = self._tokens.prompt_token_ids(request)
        if self._tok is not None and request.prompt_token_ids is None and self._token_check["checked"] < self.options.tokenizer_check:
            self._check_tokens(request, ids)
        return ids

    def prompt_format(self, request: GenRequest) -> str:
        return self._tokens.prompt_format(request)

    def _check_tokens(self, request: GenRequest, ids: list[int]) -> None:
        """Compare evalkit's tokens for a prompt with the server's own tokenization of it (when it has one)."""
        if Capability.TOKENIZER not in self.facts.capabilities:
            return
        try:
            chat = request.chat and self._tokens.prompt_format(request) == "chat"
            theirs = self._server_tok.chat_ids(request.prompt) if chat else self._server_tok.tokenize(request.prompt, True)
        except (ServedRequestError, KeyError, TypeError) as e:
            self._token_check.setdefault("errors", []).append(str(e)[:200])
            return
        self._token_check["checked"] += 1
        if theirs == ids:
            self._token_check["agree"] += 1
        elif len(self._token_check["mismatches"]) < 3:
            at = next((i for i, (a, b) in enumerate(zip(ids, theirs)) if a != b), min(len(ids), len(theirs)))
            self._token_check["mismatches"].append({"key": request.key, "at": at, "evalkit": ids[max(0, at - 2): at + 3],
                                                    "server": theirs[max(0, at - 2): at + 3]})

    # -- generation ----------------------------------------------------------------------------------

    def _room(self, ids: list[int]) -> int | None:
        """Tokens left in one sequence's context after the prompt (None: the server did not say its context)."""
        return None if not self.facts.n_ctx else int(self.facts.n_ctx) - len(ids)

    def _generation_body(self, ids: list[int], req: GenRequest, sampling: SamplingParams) -> tuple[str, dict[str, Any]]:
        max_tokens = req.max_tokens or sampling.max_tokens
        room = self._room(ids)
        if room is not None:  # as the in-process engines: generation stops where the context is full
            max_tokens = min(max_tokens, room)
        return self.dialect.generation_request(ids, req, sampling, max_tokens)

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        """Every request streamed at once (at most max_concurrency in flight); results as they finish.

        ttft_s / total_s are measured from this call (all requests arrive together, as for in-process
        engines). A request that fails after its retries yields nothing; once the others finished,
        ServedRequestError names how many failed (their items stay pending for --resume)."""
        arrival = time.perf_counter()
        prepared = []
        for req in requests:
            ids = self.prompt_token_ids(req)
            prepared.append((req, ids, self.prompt_format(req)))
        out: "queue.Queue[tuple[GenRequest, list[int], str, Any]]" = queue.Queue()
        sem_holder: dict[str, asyncio.Semaphore] = {}

        async def one(req: GenRequest, ids: list[int], fmt: str) -> None:
            sem = sem_holder.setdefault("s", asyncio.Semaphore(self.options.max_concurrency))
            path, body = self._generation_body(ids, req, sampling)
            try:
                async with sem:
                    got: Any = await self.client.stream(path, body, lambda: Collect(self.dialect, arrival))
            except Exception as e:  # after retries: reported once the others are done
                got = e
            out.put((req, ids, fmt, got))

        async def run_all() -> None:
            await asyncio.gather(*(one(r, i, f) for r, i, f in pending))

        def fits(ids: list[int]) -> bool:
            room = self._room(ids)
            return bool(ids) and (room is None or room > 0)

        pending = [(r, i, f) for r, i, f in prepared if fits(i)]
        for req, ids, fmt in prepared:
            if not fits(ids):  # the finish reasons the in-process engines give
                yield GenResult(req.key, ids, "", [], fmt, "prompt_too_long" if ids else "empty_prompt", None,
                                time.perf_counter() - arrival)
        if not pending:
            return
        future = self.client.submit(run_all)
        failures: list[str] = []
        incomplete: list[tuple[GenRequest, list[int], str, Collect]] = []
        for _ in range(len(pending)):
            req, ids, fmt, got = out.get()
            self._requests += 1
            if isinstance(got, BaseException):
                self._failed += 1
                failures.append(f"{req.key}: {got}")
            elif got.ids_incomplete:
                incomplete.append((req, ids, fmt, got))
            else:
                yield self._result(req, ids, fmt, got, arrival)
        future.result()
        # Ids the stream left out: the same request once more without streaming (same tokens and seed; only its
        # ids are kept, the timings are the stream's), after every stream ended so no timing is disturbed.
        for req, ids, fmt, got in incomplete:
            path, body = self._generation_body(ids, req, sampling)
            try:
                whole = self.client.call("POST", path, {**body, "stream": False})
            except ServedRequestError as e:
                self._failed += 1
                failures.append(f"{req.key}: {e}")
                continue
            self._refetched += 1
            self.dialect.unstreamed(got, whole)
            yield self._result(req, ids, fmt, got, arrival)
        if failures:
            raise ServedRequestError(f"deployment {self.deployment}",
                                     f"{len(failures)} of {len(pending)} request(s) failed after retries; "
                                     f"their items stay pending for --resume (first: {failures[0]})")

    def _result(self, req: GenRequest, ids: list[int], fmt: str, c: Collect, arrival: float) -> GenResult:
        tokens = list(c.tokens)
        if c.finish == "stop" and tokens and not isinstance(c.stop_reason, str) and (
                self.dialect.streams_stop_token or self._is_end(tokens[-1])):
            tokens.pop()  # the end-of-generation token: never kept by the in-process engines
        text = "".join(c.text)
        if not tokens and text and self.dialect.text_only and self._tok is not None:
            tokens = self._tok.tokenize(text, add_bos=False)  # a plain server sends text only
        end = c.end or time.perf_counter()
        return GenResult(key=req.key, prompt_token_ids=ids, output_text=text, output_token_ids=tokens,
                         prompt_format=fmt, finish_reason=c.finish,
                         ttft_s=None if c.first is None else c.first - arrival, total_s=end - arrival)

    def _is_end(self, token: int) -> bool:
        """Whether `token` ends a generation in the deployment's vocabulary (none known without weights)."""
        if self._eog is None:
            self._eog = self._tok.end_of_generation_ids() if self._tok is not None else frozenset()
        return token in self._eog

    _eog: frozenset[int] | None = None

    # -- likelihoods (as each dialect gives them) -----------------------------------------------------------------

    def scoring_concurrency(self) -> int:
        """Log-prob requests in flight at once (options.scoring_concurrency, else the dialect's, else
        max_concurrency)."""
        return self.options.scoring_concurrency or self.dialect.scoring_concurrency or self.options.max_concurrency

    def _post_many(self, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """POST every log-prob request (path, body), at most scoring_concurrency() at once; answers in order."""
        async def run() -> list[Any]:
            sem = asyncio.Semaphore(self.scoring_concurrency())

            async def one(path: str, body: dict[str, Any]) -> Any:
                async with sem:
                    return await self.client.acall("POST", path, body)

            return list(await asyncio.gather(*(one(p, b) for p, b in requests), return_exceptions=True))

        answers = self.client.submit(run).result()
        failed = [a for a in answers if isinstance(a, BaseException)]
        self._requests += len(requests)
        self._failed += len(failed)
        if failed:
            raise ServedRequestError(f"deployment {self.deployment}", f"{len(failed)} of {len(requests)} scoring "
                                     f"request(s) failed after retries (first: {failed[0]})")
        return answers

    def _need(self, cap: Capability) -> None:
        if cap not in self.facts.capabilities:
            raise ServedRequestError(f"deployment {self.deployment}", self.facts.reasons.get(cap, f"server cannot give {cap.value}"))

    def top_k_limit(self) -> int:
        """The most top-k log-probs per position this server gives by token id (its max_logprobs, read by
        discovery; 0 where its top-k lists are keyed by token text)."""
        if not self.dialect.top_k_by_id:
            return 0
        return int(self.facts.max_logprobs) if self.facts.max_logprobs is not None else 0

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        """Teacher-forced log-probabilities, one request per sequence, as the dialect asks for prompt log-probs
        (vLLM's `prompt_logprobs`, the OpenAI API's `echo`); top-k never above the server's limit."""
        self._need(Capability.PROMPT_LOGPROBS)
        if top_k > self.top_k_limit():
            raise ServedRequestError(f"deployment {self.deployment}",
                                     f"top-k {top_k} exceeds what the server gives ({self.top_k_limit()}: its max_logprobs)")
        seqs = [list(map(int, s)) for s in sequences]
        results = []
        for seq, answer in zip(seqs, self._post_many([self.dialect.score_request(s, top_k) for s in seqs])):
            try:
                logprobs, top = self.dialect.read_scores(seq, answer, top_k)
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise ServedRequestError(f"deployment {self.deployment}", f"unreadable prompt log-probs ({e!r})") from None
            results.append(TokenScores(token_ids=seq, logprobs=logprobs, top=top))
        return results

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        """Log-probs at `candidates` of the next token: vLLM reads them at the ids (`logprob_token_ids`: the
        whole-vocabulary log-softmax, as in-process); llama-server and a plain server return the answer
        position's top-k, first NEXT_TOKEN_K, then once more at the server's limit for a prompt whose top-k
        left a candidate out (llama-server's limit is the vocabulary: every candidate is then there). NaN: a
        candidate outside the most the server gives (the caller scores the choices another way)."""
        self._need(Capability.NEXT_TOKEN_LOGPROBS)
        cands = [int(c) for c in candidates]
        texts = [] if self.dialect.reads_at_ids else [self.detokenize([c]) for c in cands]
        limit = self.facts.max_logprobs
        k = NEXT_TOKEN_K if limit is None else min(NEXT_TOKEN_K, int(limit))
        ids = [list(map(int, p)) for p in prompts]

        def ask(which: list[int], k: int) -> list[list[float]]:
            answers = self._post_many([self.dialect.next_token_request(ids[i], cands, k) for i in which])
            try:
                return [self.dialect.read_next_token(a, cands, texts) for a in answers]
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise ServedRequestError(f"deployment {self.deployment}", f"unreadable next-token log-probs ({e!r})") from None

        out = ask(list(range(len(ids))), k)
        again = [i for i, lps in enumerate(out) if any(math.isnan(x) for x in lps)]
        if again and not self.dialect.reads_at_ids and limit is not None and int(limit) > k:
            for i, lps in zip(again, ask(again, int(limit))):
                out[i] = lps
        return out

    def next_token_method(self) -> str:
        """How `next_token_logprobs` reads the candidates: "one-pass" (at their ids, from the whole
        distribution), "answer-top-k" (from the answer position's returned top-k) or "none" (it cannot)."""
        if Capability.NEXT_TOKEN_LOGPROBS not in self.facts.capabilities:
            return "none"
        return "one-pass" if self.dialect.reads_at_ids else "answer-top-k"

    # -- description ---------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        tok = self._tok
        add_bos, bos = tok.bos() if tok is not None else (False, None)
        vocab = tok.vocab_size() if tok is not None else self.facts.vocab_size
        template = None
        if self._tokens.prompt_format(GenRequest("probe", "", chat=True)) == "chat":
            template = "local weights' chat template" if tok is not None else "server's chat template"
        extra: dict[str, Any] = {
            "server": self.facts.describe(),
            "base_url": self.client.base_url,
            "tokens_from": "evalkit (the in-process engine's tokenizer for these weights), sent as token ids"
            if tok is not None else "the server's /tokenize",
            "weights_verified": tok is not None,
            "system_info": f"{self.dialect.name} {self.facts.version}",  # the cache key's backend part
            "sampling_reproducibility": "served: depends on the server's batching (llama-server --parallel > 1 and "
            "vLLM batch requests together; a request's numbers can change with what runs beside it)",
            "token_check": dict(self._token_check),
            "scoring_concurrency": self.scoring_concurrency(),  # log-prob requests in flight at once
            # What the cache key says the model is when no weights are named (cache.model_identity hashes it).
            "model_identity": {"model": self.facts.model_id, "server": self.facts.identity, "version": self.facts.version},
        }
        extra.update(self._numerics_stated())
        if self.server is not None:
            extra["launched"] = self.server.describe()
        return EngineInfo(engine=self.name, engine_version=self.facts.version or "unknown",
                          model_path=self.model_path or self.facts.model_id, add_bos=add_bos, bos_token_id=bos,
                          chat_template=template, vocab_size=int(vocab or 0),
                          n_ctx=int(self.facts.n_ctx or self.options.n_ctx), load_s=self._load_s, extra=extra,
                          top_k_limit=self.top_k_limit(), next_token_method=self.next_token_method())

    def _numerics_stated(self) -> dict[str, Any]:
        """The settings that change greedy outputs, as far as they are known: for a llama-server evalkit launched, the
        flash attention its load log says ran (else the -fa it was given); for any other, what the server does
        not expose, named with its default (ServerDialect.unstated_numerics)."""
        stated: dict[str, Any] = dict(self.dialect.unstated_numerics)
        if self.server is not None and "flash_attn" in stated:
            from evalkit.engines.llamacpp import parse_flash_attn

            log = self.server.log_path
            ran = parse_flash_attn(log.read_text(errors="replace")) if log is not None and log.is_file() else None
            stated["flash_attn"] = ran if ran is not None else self.options.flash_attn
        return stated

    def run_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"requests": self._requests, "failed_requests": self._failed,
                                 "ids_refetched_unstreamed": self._refetched,
                                 "retried_attempts": self._retry.retried, "token_check": dict(self._token_check)}
        if self.server is not None:
            stats["server_peak_rss_mb"] = self.server.high_water_rss() / 2**20
        return stats

    def server_peak_rss(self) -> int | None:
        return self.server.high_water_rss() if self.server is not None else None

    def close(self) -> None:
        try:
            if getattr(self, "client", None) is not None:
                self.client.close()
            tok = getattr(self, "_tok", None)
            if tok is not None:
                tok.close()
        finally:
            if self.server is not None:
                self.server.stop()


# -- the spec ----------------------------------------------------------------------------------------


def _load(model_path: str | None, options: OpenAIOptions) -> OpenAIEngine:
    return OpenAIEngine(model_path, options)


def _tokenizer(model_path: str | None, options: OpenAIOptions) -> Engine:
    tok = local_tokenizer(model_path, options)
    if tok is None:  # without weights the server tokenizes: the engine itself (a served model loads nothing)
        return OpenAIEngine(model_path, options)
    return tok


_PLANNED: dict[str, ServerFacts] = {}  # plan-time discovery, once per server and process
# The plan's discovery, handed to the run's workers (the driver's child processes inherit it): JSON
# {"pid": the driver's, "servers": {server key: facts}}. A server's limits are read once per run (discovery's
# probe of more than a server allows is refused once, not once per process). Only a direct child of the
# process that discovered reads it (this run's workers; a run started from a shell that inherited the variable
# plans afresh); a worker it does not reach (another node) asks the server itself.
PLANNED_ENV = "EVALKIT_SERVED_FACTS"
_ENV_MAX = 100_000  # Linux refuses to start a process with one environment string over 128 KiB: not handed on


def _server_key(options: OpenAIOptions) -> str:
    return json.dumps([options.base_url, options.served_model, options.api_key_env])


def _handed() -> dict[str, Any]:
    try:
        got = json.loads(os.environ.get(PLANNED_ENV) or "{}")
    except ValueError:
        return {}
    return got if isinstance(got, dict) and isinstance(got.get("servers"), dict) else {}


def planned_facts(options: OpenAIOptions) -> ServerFacts | None:
    """What this run's plan-time discovery learned about the server `options` name: in this process, or handed
    to this worker by the run's driver (its parent). None: not discovered (the engine asks the server)."""
    key = _server_key(options)
    if key in _PLANNED:
        return _PLANNED[key]
    handed = _handed()
    if handed.get("pid") != os.getppid() or key not in handed["servers"]:
        return None
    try:
        facts = ServerFacts.from_json(handed["servers"][key])
    except (KeyError, TypeError, ValueError):  # unreadable: the engine asks the server
        return None
    _PLANNED[key] = facts
    return facts


def _plan_facts(deployment: Any) -> ServerFacts:
    """Plan-time discovery: once per server and run (a worker reads its driver's)."""
    options: OpenAIOptions = deployment.options
    where = f"deployment {deployment.name}"
    key = _server_key(options)
    if planned_facts(options) is None:
        # A few quick attempts: a 429 or a dropped connection at plan time is no reason to refuse the run.
        client = ServerClient(options.base_url or "", api_key(options, where), min(options.timeout_s, 30.0),
                              RetryPolicy(attempts=min(options.retries + 1, 3), max_s=1.0))
        try:
            facts = discover(client, options.served_model, where)
        finally:
            client.close()
        facts.probed_at = "plan"
        _PLANNED[key] = facts
        handed = _handed()
        servers = handed.get("servers", {}) if handed.get("pid") == os.getpid() else {}
        value = json.dumps({"pid": os.getpid(), "servers": {**servers, key: facts.to_json()}})
        if len(value) < _ENV_MAX:
            os.environ[PLANNED_ENV] = value
    return _PLANNED[key]


def check(deployment: Any) -> None:
    """Plan-time: the launcher's program exists, or the server answers, serves the model and takes the key
    (ConfigError, one line, exit 2, before a run directory exists)."""
    options: OpenAIOptions = deployment.options
    if options.launch is not None:
        from evalkit.engines.launcher import check_program

        check_program(options.launch)
        if deployment.model is None:
            raise ConfigError(f"deployment {deployment.name}", f"launch: {options.launch} needs the weights it serves (model:)")
        return
    _plan_facts(deployment)


def deployment_capabilities(deployment: Any) -> tuple[frozenset[Capability], dict[Capability, str]]:
    """What this deployment's server can do, asked at plan time (a launched one: known from its program)."""
    options: OpenAIOptions = deployment.options
    if options.launch is not None:
        return LAUNCHED_CAPS[options.launch]
    facts = _plan_facts(deployment)
    if Capability.TOKENIZER not in facts.capabilities and deployment.model is not None:
        # A server that does not tokenize: the deployment's weights do, as the in-process engine would.
        return facts.capabilities | {Capability.TOKENIZER}, {c: r for c, r in facts.reasons.items() if c is not Capability.TOKENIZER}
    return facts.capabilities, facts.reasons


def _launch_arg(args: list[str], flag: str) -> str | None:
    """The value a launch argument sets last (`--flag v` or `--flag=v`), as the server's parser reads it."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def served_limits(deployment: Any) -> dict[str, Any]:
    """What the deployment's server allows, read rather than assumed: a running server's discovered limits (vLLM's
    max_logprobs from its refusal of more, max_model_len from /v1/models; llama-server's n_ctx per slot from
    /props), or a launched one's from its command line."""
    options: OpenAIOptions = deployment.options
    if options.launch == "vllm":
        said = _launch_arg(list(options.launch_args), "--max-logprobs")
        return {"top_k": int(said) if said else LAUNCHED_TOP_K, "top_k_from": "--max-logprobs of the launched vLLM server",
                "n_ctx": options.n_ctx, "n_ctx_from": "options.n_ctx (--max-model-len)"}
    if options.launch == "llama-server":
        return {"top_k": 0, "top_k_from": "llama-server gives no prompt log-probs", "n_ctx": options.n_ctx,
                "n_ctx_from": "options.n_ctx (per slot)"}
    facts = _plan_facts(deployment)
    limit = facts.max_logprobs if facts.dialect != "openai" else 0
    if Capability.PROMPT_LOGPROBS not in facts.capabilities:
        limit = 0
    where = {"vllm": "vLLM max_logprobs", "llama.cpp": "llama-server", "openai": "top-k keyed by token text"}[facts.dialect]
    n_ctx_from = {"vllm": "vLLM max_model_len", "llama.cpp": "llama-server n_ctx per slot"}.get(facts.dialect)
    return {"top_k": limit, "top_k_from": where, "n_ctx": facts.n_ctx, "n_ctx_from": n_ctx_from}


def endpoint(options: OpenAIOptions) -> dict[str, Any]:
    """Where the model is served, for the manifest (never the API key: only the variable's name)."""
    if options.launch is not None:
        from evalkit.engines.launcher import program_version

        return {"launcher": options.launch, "version": program_version(options.launch), "host": "127.0.0.1",
                "n_ctx": options.n_ctx, "parallel": options.parallel, "launch_args": list(options.launch_args)}
    return {"base_url": options.base_url, "served_model": options.served_model, "api_key_env": options.api_key_env}


def _memory(name: str, arch: Any, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Any,
            workload: Any = None) -> Any:
    """A launched server's memory is the in-process engine's for the same weights and context; a remote
    server's is not on this machine."""
    from evalkit.engines import engine_spec

    if options.launch == "llama-server":
        spec = engine_spec("llamacpp")
        opts = spec.options_model(n_ctx=options.n_ctx * options.parallel, n_threads=options.launch_threads)
    elif options.launch == "vllm":
        spec = engine_spec("vllm")
        opts = spec.options_model(max_model_len=options.n_ctx)
    else:  # a server evalkit does not run: its memory is not on this machine
        from evalkit.ledger import SERVER_DEVICES, LedgerRow

        return LedgerRow(name, "openai", precision, weights_from, SERVER_DEVICES, 0, weights_bytes or None, None, None,
                         None, None, None, None, fits=None, max_context=None, memory_context=None, max_concurrency=None,
                         notes="served by a server evalkit does not run: its memory is the server's, unknown here")
    import dataclasses

    row = spec.memory_model(name, arch, weights_bytes, precision, weights_from, opts, hw)
    return dataclasses.replace(row, engine=f"openai ({options.launch})")


def _hardware(deployment: Any) -> Any:
    from evalkit.hardware import HardwareUse

    options = deployment.options
    where = f"{options.launch} started by evalkit on this machine's CPU" if options.launch else f"a server at {options.base_url}"
    return HardwareUse(f"served ({where})", None, None, _precision(None, None), ())


def _precision(requested: str | None, capability: tuple[int, int] | None) -> Any:
    from evalkit.hardware import Precision

    return Precision("served", "the server computes with its own precision (its weights and settings decide it)")


def _resources(options: Any) -> UnitResources:
    return UnitResources(num_cpus=float(options.launch_threads or 1) if options.launch else 0.5)


SPEC = EngineSpec(
    name="openai",
    options_model=OpenAIOptions,
    model_kind="served",
    also_loads=("gguf", "hf"),  # the weights a server serves, when the deployment names them
    loader=_load,
    tokenizer_loader=_tokenizer,
    numerics_options=("launch", "launch_args", "n_ctx", "parallel", "cache_prompt", "served_model", "flash_attn", "n_batch",
                      "scoring_concurrency"),
    memory_model=_memory,
    describe_hardware=_hardware,
    precision=_precision,
    install_hint="pip install httpx tenacity (and a server: `make peer` builds llama-server; vllm for `vllm serve`)",
    capabilities=frozenset(Capability) - {Capability.FULL_DISTRIBUTION},
    resources=_resources,
    package=("httpx",),
    libraries=("tenacity",),
    deployment_capabilities=deployment_capabilities,
    served_limits=served_limits,
    check=check,
    endpoint=endpoint,
    context_option="n_ctx",
    concurrency_option="max_concurrency",
    label="OpenAI-compatible server",
)
