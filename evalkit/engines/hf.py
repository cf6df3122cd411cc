"""Hugging Face transformers engine (`AutoModelForCausalLM`, in-process, CPU or GPU): the exact reference.

What it is for: a deployment evaluated with the plainest possible numerics (float32 by default, no
kernels beyond torch's), whose full next-token distribution is available at every position, so the
KL-divergence of a quantized deployment against it is exact rather than a top-k bound. It is also the
backend lm-evaluation-harness uses by default.

It loads a Hugging Face checkpoint directory, typically evalkit's `hf` variant of a GGUF
(`model: {source: pkg:..., variant: hf}`), whose tokenizer was made to tokenize exactly as llama.cpp does
(evalkit/variants.py). Tokenization is the tokenizer-only stand-in's (`VllmTokenizer`: the checkpoint's
HF tokenizer, BOS read from behaviour, the chat template's generation prompt), so token ids are the
same for this engine, its stand-in, vLLM on the same checkpoint and llama.cpp on the source GGUF.

Numerics (why each choice):
- One sequence per forward pass, no padding: padding and batch shape change rounding; a reference
  should not depend on which requests happened to share a batch.
- Log-probabilities are float32: logits cast up whatever the dtype, the log-softmax normaliser in float64.
- Logits are computed from the decoder's last hidden states in blocks of rows through the output
  embedding (plus the model's final logit soft-capping, when its config has one), so a 262k-token
  vocabulary never needs an n_ctx x vocab matrix at once.
- Generation is our own loop over a KV cache (greedy argmax, or temperature + top-p sampling with a
  fresh `torch.Generator` seeded per request), so the checkpoint's `generation_config` defaults (e.g.
  Gemma's top_k=64) cannot leak in. Requests that arrive together decode as one batch (up to
  `max_batch_size`): prompts left-padded into a static KV cache, a 4-D attention mask written by us (so
  transformers builds none: no host sync inside a step), and on a CUDA device each decode step replayed
  as a CUDA graph (one launch instead of ~50 kernels per layer from Python), its forward compiled by
  torch.compile (inductor fuses those kernels into a few per layer: at batch 1 a small model's step costs
  a couple of microseconds per kernel, not its bytes; see `evalkit.engines.hf_decode.DecodeForward`). Padding and batch shape
  change rounding (a request's log-probs stay equal to its unbatched ones within the dtype's tolerance:
  tests/test_hf_batched.py), so a request whose neighbours change may flip a near-tie; `max_batch_size: 1` decodes one request at a time.
  Models whose sliding window is shorter than max_length keep the one-request loop (a window needs a
  mask per layer type).
- torch itself and transformers are imported only when a model loads.
"""
from __future__ import annotations

import time
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores, generate_in_turn
from evalkit.engines import hf_rules
from evalkit.engines.spec import Capability, DoctorRow, EngineSpec, UnitResources
from evalkit.engines.hf_decode import BatchStepper, DecodeForward, first_line, pick
from evalkit.engines.hf_memory import ROW_BLOCK, kv_precision, predict_hf
from evalkit.engines.tokenizer import HfTokens, VllmTokenizer
from evalkit.errors import EngineUnavailableError, ModelFileError
from evalkit.hardware import HardwareUse, Precision, describe_devices, detect_accelerators

if TYPE_CHECKING:
    import torch

FP8_VARIANT = hf_rules.NATIVE_FP8_VARIANT  # "fp8": the native-FP8 variant
# Token texts that end a turn in common chat templates; llama.cpp counts them as end-of-generation too.
_END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")


class HfOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # "auto" (cuda:0 when torch sees a GPU, else cpu), "cpu", "cuda", "cuda:1", ...
    max_length: int = Field(default=4096, ge=2)  # context: prompt + generated tokens, and scoring length
    n_threads: int | None = Field(default=None, ge=1)  # torch CPU threads (None: torch's default)
    attn_implementation: Literal["eager", "sdpa"] = "eager"  # eager: plain matmul+softmax, the reference
    chat_template: Literal["auto", "none"] = "auto"
    max_batch_size: int = Field(default=16, ge=1)  # requests decoded together (1: one at a time)
    cuda_graphs: bool = True  # replay each decode step as a CUDA graph on a CUDA device
    # torch.compile the decode step's forward (auto: on a CUDA device, where the step is bound by its kernel count;
    # never the scoring paths). Like max_batch_size it changes generated tokens' rounding, not what is measured,
    # so it is not one of the cache key's numerics options.
    torch_compile: Literal["auto", "on", "off"] = "auto"
    # KV-cache precision: "full" keeps K and V in `dtype`. transformers' quantized cache (QuantizedCache,
    # cache_implementation="quantized") needs a backend package: optimum-quanto or hqq.
    kv_cache: Literal["full", "quanto", "hqq"] = "full"

    @field_validator("kv_cache")
    @classmethod
    def _quantized_cache_backend(cls, v: str) -> str:
        if v != "full":
            from importlib.util import find_spec

            package, module = {"quanto": ("optimum-quanto", "optimum.quanto"), "hqq": ("hqq", "hqq")}[v]
            try:
                found = find_spec(module) is not None
            except ModuleNotFoundError:  # `optimum` itself absent
                found = False
            if not found:
                raise ValueError(f"kv_cache {v!r} (transformers' QuantizedCache) needs the {package} package, which is not installed")
            raise ValueError(f"kv_cache {v!r}: the hf engine decodes through a StaticCache and has no quantized-cache path yet")
        return v


def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _device(options: HfOptions) -> str:
    if options.device != "auto":
        return options.device
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


class HfEngine(HfTokens, Engine):
    name = "hf"

    def __init__(self, model_path: str, options: HfOptions) -> None:
        import torch
        import transformers

        self.options = options
        self.model_path = str(model_path)
        self._device = _device(options)
        if options.n_threads is not None:
            torch.set_num_threads(options.n_threads)
        start = time.perf_counter()
        # The tokenizer-only stand-in's set-up is the definition of this engine's tokenization too.
        self.tokenize_like(VllmTokenizer(self.model_path, options))
        try:
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=_torch_dtype(options.dtype), attn_implementation=options.attn_implementation
            )
        except (OSError, ValueError) as e:
            raise ModelFileError(self.model_path, f"transformers could not load the model ({first_line(e)})") from None
        try:
            self._model.to(self._device)
        except (RuntimeError, AssertionError) as e:  # e.g. "Torch not compiled with CUDA enabled"
            raise EngineUnavailableError(f"model {self.model_path}", f"device {self._device!r}: {first_line(e)}") from None
        self._model.eval()
        self._fp8 = _native_fp8_variant(self.model_path)
        if self._fp8:
            self._quantize_fp8()
        self._load_s = time.perf_counter() - start
        cfg = self._model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self._softcap = getattr(text_cfg, "final_logit_softcapping", None)
        self._head = self._model.get_output_embeddings()
        self._vocab_size = int(self._head.weight.shape[0])
        self._eog = self._end_of_generation_ids()
        self._pad = int(self._tok.pad_token_id if self._tok.pad_token_id is not None else min(self._eog, default=0))
        self._batched, self._batched_why = _batches(text_cfg, options)
        self._graphs_wanted = options.cuda_graphs and self._device.startswith("cuda")
        compile_it = options.torch_compile == "on" or (options.torch_compile == "auto" and self._device.startswith("cuda"))
        self._forward = DecodeForward(compile_it)
        self._mask_dtype = self._model.dtype
        self._step: BatchStepper | None = None

    def _quantize_fp8(self) -> None:
        """The `fp8` variant: decoder linear layers to W8A8 FP8 (engines/hf_fp8.py), only on FP8 tensor cores."""
        import torch

        from evalkit.engines import hf_fp8

        capability = torch.cuda.get_device_capability(self._device) if self._device.startswith("cuda") else None
        if not hf_fp8.native_fp8(capability):
            where = f"compute capability {capability[0]}.{capability[1]}" if capability else "the CPU"
            raise EngineUnavailableError(
                f"model {self.model_path}", f"the fp8 variant computes in native FP8, which needs FP8 tensor cores "
                f"(compute capability 8.9 or later); this is {where} (the fp8-weight variant measures FP8 rounding in 16-bit)")
        self._fp8_layers = hf_fp8.quantize_linears(self._model)
        torch.cuda.empty_cache()  # the 16-bit weights just freed: memory held is what FP8 needs

    def _weights_read_per_token(self) -> int:
        """Bytes of weights one decode step reads: every parameter and buffer (FP8 weights and their scales
        included), less an untied input embedding, of which a step reads one row per sequence."""
        tensors = {id(t): t for t in [*self._model.parameters(), *self._model.buffers()]}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        emb = self._model.get_input_embeddings().weight
        if self._head is None or emb is not self._head.weight:
            total -= emb.numel() * emb.element_size()
        return int(total)

    def _end_of_generation_ids(self) -> frozenset[int]:
        """EOS from the tokenizer and generation config, plus end-of-turn tokens the vocabulary has."""
        ids: set[int] = set()
        gen_eos = getattr(getattr(self._model, "generation_config", None), "eos_token_id", None)
        for v in (gen_eos, self._tok.eos_token_id):
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        vocab = self._tok.get_vocab()
        ids.update(vocab[t] for t in _END_OF_TURN if t in vocab)
        return frozenset(ids)

    # -- forward passes ---------------------------------------------------------------------------

    def _check_length(self, n: int) -> None:
        if n > self.options.max_length:
            raise ValueError(f"sequence of {n} tokens exceeds max_length={self.options.max_length}")
        if n == 0:
            raise ValueError("cannot run an empty token sequence")

    def _hidden(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """The decoder's final (normalised) hidden states (1, n, d) for one sequence, no cache: what the
        CausalLM forward feeds its output embedding."""
        import torch

        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            return self._model.base_model(input_ids=ids, use_cache=False).last_hidden_state

    def _logprob_rows(self, hidden: "torch.Tensor", rows: range) -> Iterator[tuple[int, "torch.Tensor"]]:
        """Log-softmax (float32 rows, float64 normaliser) of the logits at hidden-state rows `rows`, in blocks:
        (first row, (m, vocab))."""
        import torch

        with torch.inference_mode():
            for a in range(rows.start, rows.stop, ROW_BLOCK):
                b = min(rows.stop, a + ROW_BLOCK)
                logits = self._head(hidden[0, a:b]).float()
                if self._softcap:
                    logits = torch.tanh(logits / self._softcap) * self._softcap
                # The normaliser in float64: a float32 logsumexp over 262k entries is off by ~3e-5, which
                # would bias an exact KL-divergence against this reference by as much.
                lse = torch.logsumexp(logits.double(), dim=-1, keepdim=True)
                yield a, (logits.double() - lse).float()

    def _next_logits(self, ids: "torch.Tensor", past: Any) -> tuple["torch.Tensor", Any]:
        import torch

        with torch.inference_mode():
            out = self._model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float(), out.past_key_values  # the forward soft-caps its logits itself

    # -- generation -------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        """Requests that arrive together decode in batches of max_batch_size (see the module doc); timings
        from the call's start (all requests arrive together, each batch waits for the one before)."""
        if not self._batched:
            return self._generate_in_turn(requests, sampling)
        return self._generate_batched(requests, sampling)

    def _generate_in_turn(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        import torch

        def sample(tokens: list[int]) -> Iterator[int]:
            gen = torch.Generator(device=self._device)
            gen.manual_seed(sampling.seed)  # per request: earlier requests cannot change this one
            ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
            past: Any = None
            while True:
                logits, past = self._next_logits(ids, past)
                tok = pick(logits, sampling, gen)
                yield tok
                ids = torch.tensor([[tok]], dtype=torch.long, device=self._device)

        return generate_in_turn(self, requests, sampling, self.options.max_length, sample, self._eog.__contains__)

    def _generate_batched(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        arrival = time.perf_counter()
        todo: list[tuple[GenRequest, list[int], int]] = []  # request, prompt ids, tokens it may generate
        for req in requests:
            tokens = self.prompt_token_ids(req)
            room = self.options.max_length - len(tokens)
            if not tokens or room <= 0:
                yield self._result(req, tokens, [], "empty_prompt" if not tokens else "prompt_too_long", None, arrival)
                continue
            todo.append((req, tokens, min(req.max_tokens or sampling.max_tokens, room)))
        size = self.options.max_batch_size
        for a in range(0, len(todo), size):
            yield from self._decode_batch(todo[a : a + size], sampling, arrival)

    def _result(self, req: GenRequest, tokens: list[int], out: list[int], finish: str, ttft: float | None,
                arrival: float, end: float | None = None) -> GenResult:
        return GenResult(
            key=req.key, prompt_token_ids=tokens, output_text=self.detokenize(out), output_token_ids=out,
            prompt_format=self.prompt_format(req), finish_reason=finish, ttft_s=ttft,
            total_s=(end if end is not None else time.perf_counter()) - arrival,
        )

    def _decode_batch(self, batch: list[tuple[GenRequest, list[int], int]], sampling: SamplingParams, arrival: float,
                      on_logits: Any = None) -> Iterator[GenResult]:
        """One batch: prefill the left-padded prompts, then one decode step per token until every request is
        done. `on_logits(step, logits)` (tests) sees each step's float32 logits (batch, vocab)."""
        import torch

        dev, n = self._device, len(batch)
        width = max(len(t) for _, t, _ in batch)
        slots = min(self.options.max_length, -(-(width + max(m for _, _, m in batch)) // 128) * 128)
        step = self._stepper(n, slots)
        ids = torch.full((n, width), self._pad, dtype=torch.long)
        for i, (_, t, _) in enumerate(batch):
            ids[i, width - len(t):] = torch.tensor(t)
        pads = torch.tensor([width - len(t) for _, t, _ in batch])
        logits = step.prefill(ids.to(dev), pads.to(dev), width)
        greedy = sampling.temperature <= 0
        ahead = dev.startswith("cuda")  # kernels queue: the host can run one step ahead of its reading
        gens = [] if greedy else [torch.Generator(device=dev).manual_seed(sampling.seed) for _ in batch]  # one per request
        outs: list[list[int]] = [[] for _ in batch]
        ttft: list[float | None] = [None] * n
        finish = ["length"] * n
        ends: list[float | None] = [None] * n
        live = set(range(n))
        k = 0
        while True:
            if on_logits is not None:
                on_logits(k, logits.float())
            if greedy:
                picks = step.picks()  # the step's argmax, on the device already: one small read per token
            else:
                rows = logits.float()
                picks = [pick(rows[i], sampling, gens[i]) for i in range(n)]
                step.feed(picks)
            now = time.perf_counter()  # these tokens are known now (a first step that compiles comes after)
            # On a GPU the next step (it would write slot width + k) is queued before this one's tokens are looked
            # at, so it computes while the host does the bookkeeping; a batch ends with one step nobody reads.
            more = width + k < slots
            if more and ahead:
                logits = step.step()
            for i in sorted(live):
                req, _, limit = batch[i]
                if ttft[i] is None:
                    ttft[i] = now - arrival
                tok = int(picks[i])
                if not req.ignore_eos and tok in self._eog:
                    finish[i], ends[i] = "stop", now
                    live.discard(i)
                    continue
                outs[i].append(tok)
                if len(outs[i]) >= limit:
                    ends[i] = now
                    live.discard(i)
            k += 1
            # Finished rows keep decoding a token nobody reads (a static batch shape; cheaper than re-capturing).
            if not live or not more:
                break
            if not ahead:
                logits = step.step()
        for i, (req, tokens, _) in enumerate(batch):
            yield self._result(req, tokens, outs[i], finish[i], ttft[i], arrival, ends[i])

    def _stepper(self, n: int, slots: int) -> "BatchStepper":
        """The decode machinery for a batch of n rows and a cache of `slots` tokens: reused while the shape
        stays (a captured CUDA graph and its static cache), replaced otherwise (the old one freed first, so
        memory held tracks the batch in flight)."""
        if self._step is not None and self._step.shape == (n, slots):
            return self._step
        self._step = None
        if self._device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        self._step = BatchStepper(self._model, n, slots, self._device, self._graphs_wanted, self._mask_dtype,
                                   self._forward)
        return self._step

    # -- likelihoods ------------------------------------------------------------------------------

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        import torch

        results = []
        for seq in map(list, sequences):
            self._check_length(len(seq))
            logprobs: list[float | None] = [None] * len(seq)
            top: list[list[tuple[int, float]]] | None = [[] for _ in seq] if top_k else None
            hidden = self._hidden(seq)
            targets = torch.tensor(seq, dtype=torch.long, device=self._device)
            for a, lp in self._logprob_rows(hidden, range(0, len(seq) - 1)):
                m = lp.shape[0]  # row a + j predicts token a + j + 1
                got = lp.gather(1, targets[a + 1 : a + 1 + m, None])[:, 0].tolist()
                logprobs[a + 1 : a + 1 + m] = got
                if top is not None:
                    vals, idx = lp.topk(min(top_k, lp.shape[1]), dim=-1)
                    for j, (v, i) in enumerate(zip(vals.tolist(), idx.tolist())):
                        top[a + 1 + j] = list(zip(i, v))
            results.append(TokenScores(token_ids=seq, logprobs=logprobs, top=top))
        return results

    def score_span(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
        """Only the rows first-1 .. n-2 are turned into logits (the default would do every position)."""
        import torch

        seq = list(token_ids)
        self._check_length(len(seq))
        targets = torch.tensor(seq, dtype=torch.long, device=self._device)
        nll: list[float] = []
        top: list[list[list[float]]] = []
        for a, lp in self._logprob_rows(self._hidden(seq), range(first - 1, len(seq) - 1)):
            nll += (-lp.gather(1, targets[a + 1 : a + 1 + lp.shape[0], None])[:, 0]).tolist()
            if top_k:
                vals, idx = lp.topk(min(top_k, lp.shape[1]), dim=-1)
                top += [[[int(t), float(v)] for t, v in zip(i, vs)] for i, vs in zip(idx.tolist(), vals.tolist())]
            else:
                top += [[] for _ in range(lp.shape[0])]
        return nll, top

    def token_distributions(self, token_ids: Sequence[int], first: int) -> Iterator[tuple[int, np.ndarray]]:
        seq = list(token_ids)
        self._check_length(len(seq))
        if not 1 <= first <= len(seq):
            raise ValueError(f"first={first} must be in 1..{len(seq)}")
        for a, lp in self._logprob_rows(self._hidden(seq), range(first - 1, len(seq) - 1)):
            yield a + 1, lp.cpu().numpy()

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        cand = [int(c) for c in candidates]
        for c in cand:
            if not 0 <= c < self._vocab_size:
                raise ValueError(f"candidate token id {c} is outside the vocabulary (0..{self._vocab_size - 1})")
        out = []
        for prompt in map(list, prompts):
            self._check_length(len(prompt))
            hidden = self._hidden(prompt)
            _, lp = next(self._logprob_rows(hidden, range(len(prompt) - 1, len(prompt))))
            out.append([float(x) for x in lp[0, cand].tolist()])
        return out

    # -- description ------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        import hashlib

        import torch

        extra: dict[str, Any] = {
            "dtype": self.options.dtype,
            "device": self._device if self._device == "cpu" else f"{self._device} ({torch.cuda.get_device_name(self._device)})",
            "torch_version": torch.__version__,
            "attn_implementation": self.options.attn_implementation,
            "n_threads": torch.get_num_threads(),
            "architecture": type(self._model).__name__,
            "final_logit_softcapping": self._softcap,
            "end_of_generation_ids": sorted(self._eog),
            "weights_bytes": self._weights_read_per_token(),
            "fp8": (f"native W8A8: {self._fp8_layers} linear layers FP8 E4M3 (per-channel weight scales, per-token dynamic "
                    "activation scales, torch._scaled_mm)") if self._fp8 else None,
            "generation": self._batched_why if not self._batched else (
                f"batched, up to {self.options.max_batch_size} requests per batch, static KV cache"
                + (", decode forward compiled (torch.compile, inductor)" if self._forward.compiled is not None else "")
                + (", CUDA graph per decode step" if self._graphs_wanted else "")),
            "cuda_graphs": None if self._step is None else self._step.graphed,
            **self._compile_stats(),
            "sampling_reproducibility": REPRODUCIBILITY if self._batched and self.options.max_batch_size > 1 else REPRODUCIBILITY_ALONE,
        }
        if self._step is not None and self._step.graph_error:
            extra["cuda_graph_error"] = self._step.graph_error
        if self._chat_template is not None:
            extra["chat_template_sha256"] = hashlib.sha256(self._chat_template.encode()).hexdigest()
        return EngineInfo(
            engine=self.name,
            # torch's version is part of it: its kernels make the numbers (the cache keys on this string).
            engine_version=f"{version('transformers')}+torch{torch.__version__}",
            model_path=self.model_path,
            add_bos=self._add_bos,
            bos_token_id=self._bos,
            chat_template="hf:tokenizer.chat_template" if self._use_chat else None,
            vocab_size=self._vocab_size,
            n_ctx=self.options.max_length,
            load_s=self._load_s,
            extra=extra,
        )

    def run_stats(self) -> dict[str, Any]:
        """Whether the decode steps of this run were compiled and CUDA-graph replays (known only once a batch has
        decoded), so the engine description written after the run says so."""
        stats = self._compile_stats() if self._step is not None else {}
        if self._step is not None and self._graphs_wanted:
            stats |= {"cuda_graphs": self._step.graphed, "cuda_graph_error": self._step.graph_error}
        return stats

    def _compile_stats(self) -> dict[str, Any]:
        """Whether the decode steps ran compiled, and the time their first calls took (compiles included)."""
        f = self._forward
        if f.compiled is None:
            return {}
        return {"decode_compiled": f.active, "decode_compile_error": f.error, "decode_first_calls_s": round(f.first_calls_s, 2)}

    def close(self) -> None:
        import gc

        self._step = None
        self._model = None
        gc.collect()


REPRODUCIBILITY = (
    "seeded per request (a torch.Generator per request); requests decoded in one batch share matrix shapes, "
    "so a request's log-probs can differ in the last bits with its neighbours (within the dtype's tolerance) "
    "and a near-tie may flip; max_batch_size: 1 makes a request's tokens independent of the others"
)
REPRODUCIBILITY_ALONE = "bit-identical: one request at a time, seeded per request, whatever ran before"


def _native_fp8_variant(model_path: str) -> bool:
    """Whether `model_path` is evalkit's `fp8` variant (its provenance file says so; read here, not through
    evalkit.variants, which sits above the engines)."""
    import json
    from pathlib import Path

    try:
        record = json.loads((Path(model_path) / "evalkit_variant.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("variant") == FP8_VARIANT


def _batches(text_cfg: Any, options: HfOptions) -> tuple[bool, str]:
    """Whether this model decodes in batches, and why not when it does not."""
    window = getattr(text_cfg, "sliding_window", None)
    types = set(getattr(text_cfg, "layer_types", None) or [])
    windowed = bool(types - {"full_attention"}) if types else bool(window and getattr(text_cfg, "use_sliding_window", True))
    if windowed and window and window < options.max_length:
        return False, f"one request at a time: sliding window {window} < max_length {options.max_length}"
    return True, ""




# -- the spec -------------------------------------------------------------------------------------


class HfTokenizer(VllmTokenizer):
    """The tokenizer-only stand-in: the checkpoint's HF tokenizer, set up as the engine sets up its own."""

    name = "hf"



def _precision(requested: str | None, capability: tuple[int, int] | None) -> Precision:
    if requested is not None:
        return Precision("unavailable", f"the hf engine loads a checkpoint as it is; it has no quantization {requested!r}")
    return Precision("not-requested", "no quantization: weights and compute in the configured torch dtype")


def _hardware(deployment: Any) -> HardwareUse:
    options = deployment.options
    accs = detect_accelerators()
    used = accs[:1] if accs and options.device != "cpu" else []
    capability = used[0].capability if used else None
    if deployment.model.variant == FP8_VARIANT:
        mode, refused, text = hf_rules.outcome(capability, FP8_VARIANT, options.dtype)
        precision = Precision("unavailable" if refused else mode, refused or text)
    else:
        precision = Precision(
            "not-requested", f"transformers computes in {options.dtype} on the {'GPU' if used else 'CPU'}; log-softmax in float32"
        )
    return HardwareUse(describe_devices(used), capability, None, precision, ())


def _doctor() -> list[DoctorRow]:
    from importlib.metadata import PackageNotFoundError

    def installed(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    torch = installed("torch")
    return [DoctorRow("torch", torch, "CPU-only build" if (torch or "").endswith("+cpu") else ""),
            DoctorRow("transformers", installed("transformers"), "the hf engine; needed by prepare (hf, fp8-weight)")]


def _resources(options: Any) -> UnitResources:
    gpu = options.device != "cpu" and bool(detect_accelerators())
    return UnitResources(num_cpus=float(options.n_threads or 1), num_gpus=1.0 if gpu else 0.0)


SPEC = EngineSpec(
    name="hf",
    options_model=HfOptions,
    model_kind="hf",
    loader=HfEngine,
    tokenizer_loader=HfTokenizer,
    # n_threads is kept: torch's CPU kernels may split reductions across threads, changing the rounding.
    numerics_options=("dtype", "device", "max_length", "attn_implementation", "n_threads"),
    memory_model=predict_hf,
    describe_hardware=_hardware,
    precision=_precision,
    plan_precision=hf_rules.plan_precision,
    install_hint="pip install 'evalkit[prepare]' (transformers, torch)",
    capabilities=frozenset(Capability),
    resources=_resources,
    package=("transformers",),
    libraries=("torch",),
    context_option="max_length",
    dtype_option="dtype",
    label="transformers",
    doctor=_doctor,
    warm_imports=("torch", "transformers", "transformers.modeling_utils"),
    threads_option="n_threads",
    kv_precision=kv_precision,
    info_numerics=("attn_implementation", "dtype"),
)
