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
  a couple of microseconds per kernel, not its bytes; see `_DecodeForward`). Padding and batch shape
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
from pydantic import BaseModel, ConfigDict, Field

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores, generate_in_turn
from evalkit.engines import hf_rules
from evalkit.engines.spec import Capability, DoctorRow, EngineSpec, UnitResources
from evalkit.engines.tokenizer import HfTokens, VllmTokenizer
from evalkit.errors import EngineUnavailableError, ModelFileError
from evalkit.hardware import HardwareUse, Precision, describe_devices, detect_accelerators

if TYPE_CHECKING:
    import torch

FP8_VARIANT = hf_rules.NATIVE_FP8_VARIANT  # "fp8": the native-FP8 variant
# What the hf engine holds on a GPU beyond weights, KV cache and activations: the CUDA context, the kernels torch
# and cuBLAS load as the run goes, cuBLAS workspaces, the caching allocator's slack and the CUDA-graph pool.
# Calibrated on an H200 (driver 580, CUDA 13, torch 2.11, transformers 5.17; benchmarks/gpu, issue 21): NVML's
# peak minus weights, KV and activations was 1.9 GB (SmolLM2-135M-shaped, bf16, batch 16) and 2.3 GB
# (Qwen2.5-7B-shaped); the context with one cuBLAS handle alone was 0.77 GB. The earlier 0.5 GB
# (ledger.CUDA_CONTEXT_BYTES) put the measured peak at 2.3x the prediction for the small model.
TORCH_GPU_RUNTIME_BYTES = 2_000_000_000
ROW_BLOCK = 64  # logit rows per block: 64 x 262k float32 = 67 MB
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
        stand_in = VllmTokenizer(self.model_path, options)
        self._tok, self._bos, self._add_bos = stand_in._tok, stand_in._bos, stand_in._add_bos
        self._chat_template, self._use_chat = stand_in._chat_template, stand_in._use_chat
        try:
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=_torch_dtype(options.dtype), attn_implementation=options.attn_implementation
            )
        except (OSError, ValueError) as e:
            raise ModelFileError(self.model_path, f"transformers could not load the model ({_first_line(e)})") from None
        try:
            self._model.to(self._device)
        except (RuntimeError, AssertionError) as e:  # e.g. "Torch not compiled with CUDA enabled"
            raise EngineUnavailableError(f"model {self.model_path}", f"device {self._device!r}: {_first_line(e)}") from None
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
        self._forward = _DecodeForward(compile_it)
        self._mask_dtype = self._model.dtype
        self._step: _BatchStepper | None = None

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
                tok = _pick(logits, sampling, gen)
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
                picks = [_pick(rows[i], sampling, gens[i]) for i in range(n)]
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

    def _stepper(self, n: int, slots: int) -> "_BatchStepper":
        """The decode machinery for a batch of n rows and a cache of `slots` tokens: reused while the shape
        stays (a captured CUDA graph and its static cache), replaced otherwise (the old one freed first, so
        memory held tracks the batch in flight)."""
        if self._step is not None and self._step.shape == (n, slots):
            return self._step
        self._step = None
        if self._device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        self._step = _BatchStepper(self._model, n, slots, self._device, self._graphs_wanted, self._mask_dtype,
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
        self._model = None  # type: ignore[assignment]
        gc.collect()


def _pick(logits: "torch.Tensor", sampling: SamplingParams, gen: "torch.Generator") -> int:
    """Greedy at temperature 0; else softmax(logits / T), restricted to the top-p nucleus, sampled with `gen`."""
    import torch

    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < sampling.top_p  # the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


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


def _decode_forward(model: Any, cache: Any, ids: Any, pos: Any, mask: Any) -> Any:
    """One forward over the cache: each row's last-position logits (rows, vocab), in the model's dtype. A module
    function, so torch.compile traces it once for every stepper (dynamo keys its compiled code on this code)."""
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1]


class _DecodeForward:
    """The decode step's forward for one engine: `torch.compile`d (inductor) when wanted, else `_decode_forward`.

    Why compile: on a GPU, a CUDA graph removes the launches from Python but still runs every kernel of the
    eager forward one after another (~1,500 for a 30-layer Llama: RMSNorm alone is 7 kernels, rotary ~12 per
    layer), and at batch 1 each costs a couple of microseconds whatever its size, so the step is bound by the
    kernel count, not by the bytes it reads. Inductor fuses the elementwise chains into a few kernels per
    layer; the CUDA graph then replays those. One compile per engine (dynamo marks batch and cache length
    dynamic at the shapes it meets next, so a run compiles about three times); if compiling fails the steps run
    the eager forward and `error` says why. The fused kernels round differently from the eager ones (fewer
    intermediate roundings in 16-bit): decode log-probs stay within the dtype's tolerance (tests/test_gpu.py)."""

    def __init__(self, compile_it: bool) -> None:
        self.compiled: Any = None
        if compile_it:
            import torch

            self.compiled = torch.compile(_decode_forward, fullgraph=True)
        self.error: str | None = None
        self.first_calls_s = 0.0  # steps that traced or compiled (a stepper's first), compile time included

    @property
    def active(self) -> bool:
        return self.compiled is not None and self.error is None

    def first_call(self, *args: Any) -> Any:
        """A stepper's first step: compiles (or finds the compiled code) here; eager from now on if that fails.
        A failure leaves no trace on the cache: with fullgraph, nothing runs until compiling has succeeded."""
        if not self.active:
            return _decode_forward(*args)
        start = time.perf_counter()
        try:
            return self.compiled(*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure leaves the eager forward, which is correct
            self.error = _first_line(e)
            return _decode_forward(*args)
        finally:
            self.first_calls_s += time.perf_counter() - start

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args) if self.active else _decode_forward(*args)


class _BatchStepper:
    """Prefill and decode steps for one batch shape over a transformers `StaticCache`.

    The attention mask is ours, 4-D (rows, 1, queries, slots) and additive (0 where a row may look, the
    dtype's minimum elsewhere): transformers uses a 4-D mask as given, so a step runs no mask-building code
    (whose checks read tensors on the host and cannot be captured). Left padding: every row writes slot s
    at step s; a row's positions count its own tokens only.

    A decode step reads nothing back: the slot it writes is a device counter, the positions and the mask's
    new column are computed from it on the device, and each row's greedy pick is written as the next step's
    input (sampling overwrites it with `feed`). So the whole step is one CUDA graph, and greedy decoding
    costs the host one replay and one small read per token. On CUDA, the first decode step runs eagerly on
    a side stream (the warm-up torch.cuda.graph needs, and torch.compile's compile; it also writes that
    step's real KV) and the next ones replay the captured step; if capture fails the steps stay eager and
    `graph_error` says why.
    """

    def __init__(self, model: Any, n: int, slots: int, device: str, graphs: bool, dtype: Any,
                 forward: _DecodeForward) -> None:
        import torch
        import transformers

        self.model, self.shape, self.device, self.forward = model, (n, slots), device, forward
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=slots)
        self.min = torch.finfo(dtype).min
        self.mask = torch.full((n, 1, 1, slots), self.min, dtype=dtype, device=device)  # decode: one query row
        self.ids = torch.zeros((n, 1), dtype=torch.long, device=device)  # the next step's input tokens
        self.pos = torch.zeros((n, 1), dtype=torch.long, device=device)
        self.pads = torch.zeros((n,), dtype=torch.long, device=device)
        self.slot = torch.zeros((1,), dtype=torch.long, device=device)  # the cache slot the next step writes
        self.want_graph, self.graph, self.graphed, self.graph_error = graphs, None, False, None
        self.stepped = False  # whether a decode step ran (the first one traces, compiles, captures)
        self.out: Any = None  # the captured step's logits (the graph's output, rewritten by each replay)

    def prefill(self, ids: Any, pads: Any, width: int) -> Any:
        """The left-padded prompts (n, width) into the cache: their last logits (n, vocab), model dtype."""
        import torch

        with torch.inference_mode():  # the cache's tensors are inference tensors: every update happens in here
            return self._prefill(ids, pads, width)

    def _prefill(self, ids: Any, pads: Any, width: int) -> Any:
        import torch

        slots = self.shape[1]
        self.cache.reset()  # also on a reused stepper: zero the counters, same tensors (the graph's addresses)
        self.pads.copy_(pads)
        cols = torch.arange(slots, device=self.device)
        valid = cols[None, :] >= self.pads[:, None]  # (n, slots): slots of a row's own tokens (and later ones)
        rows = torch.arange(width, device=self.device)
        causal = cols[None, :] <= rows[:, None]  # (width, slots)
        allowed = valid[:, None, :] & causal[None, :, :]
        zero = torch.zeros((), dtype=self.mask.dtype, device=self.device)
        mask = torch.where(allowed, zero, self.min)[:, None]  # (n, 1, width, slots)
        pos = (rows[None, :] - self.pads[:, None]).clamp(min=0)
        self.mask.copy_(mask[:, :, -1:, :])  # the decode mask starts as the last prompt row's
        logits = _decode_forward(self.model, self.cache, ids, pos, mask)  # eager: prompt widths vary
        self.ids.copy_(logits.argmax(dim=-1, keepdim=True))
        self.slot.fill_(width)
        return logits

    def feed(self, tokens: list[int]) -> None:
        """Tokens chosen on the host (sampling) as the next step's input, instead of the greedy picks."""
        import torch

        with torch.inference_mode():
            self.ids[:, 0] = torch.tensor(tokens, dtype=torch.long, device=self.device)

    def picks(self) -> list[int]:
        """Each row's greedy pick from the last step (waits for it)."""
        return self.ids[:, 0].tolist()

    def step(self) -> Any:
        """One decode step: the rows' `ids` at the cache slot the counter says; their logits (n, vocab), model
        dtype (on a graph, its output buffer: read it before the next step)."""
        import torch

        with torch.inference_mode():
            if self.graph is not None:
                self.graph.replay()
                return self.out
            if not self.stepped:
                self.stepped = True
                if self.want_graph:
                    return self._capture()
                return self._step(self.forward.first_call)
            return self._step(self.forward)

    def _step(self, forward: Any) -> Any:
        """The step itself, all on the device (capturable): positions and the mask's new column from the slot
        counter, the forward, the greedy picks as the next input, the counter advanced."""
        self.pos.copy_((self.slot - self.pads)[:, None])
        self.mask[:, 0, 0].index_fill_(1, self.slot, 0.0)
        logits = forward(self.model, self.cache, self.ids, self.pos, self.mask)
        self.ids.copy_(logits.argmax(dim=-1, keepdim=True))
        self.slot.add_(1)
        return logits

    def _capture(self) -> Any:
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the warm-up (and compile): this step, for real
            logits = self._step(self.forward.first_call)
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            # The captured step advances the counters (ours and the cache's) itself, as the eager step did:
            # capture only records, so they stay where the warm-up left them and the first replay writes the
            # next slot.
            with torch.cuda.graph(graph):
                self.out = self._step(self.forward)
            self.graph, self.graphed = graph, True
        except Exception as e:  # noqa: BLE001 - any capture failure leaves the eager steps, which are correct
            self.graph_error = _first_line(e)
            torch.cuda.synchronize()
        return logits


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# -- the spec -------------------------------------------------------------------------------------


class HfTokenizer(VllmTokenizer):
    """The tokenizer-only stand-in: the checkpoint's HF tokenizer, set up as the engine sets up its own."""

    name = "hf"


def _memory(
    name: str, arch: Any, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Any, workload: Any = None
) -> Any:
    """Weights in `dtype`; the KV cache of the larger of one sequence at max_length and the cost suite's largest
    batch (up to max_batch_size sequences in one static cache of prompt + output tokens, rounded up to 128 as
    the engine allocates it); one block of logits (rows become logits ROW_BLOCK at a time) and a batched
    prefill's attention scores (eager: float32 softmax of batch x heads x prompt x slots)."""
    from evalkit.ledger import GB, LedgerRow, fits_count

    per = 4 if options.dtype == "float32" else 2
    n_ctx = int(options.max_length)
    swa = min(n_ctx, arch.sliding_window) if arch.sliding_window else None  # transformers caches only the window
    kv = arch.kv_bytes(n_ctx, swa, per)
    batch = min(int(options.max_batch_size), workload.batch_sequences) if workload is not None else 1
    slots = min(n_ctx, -(-workload.batch_tokens // 128) * 128) if workload is not None and workload.batch_tokens else 0
    scores = 0
    if batch > 1 and slots:
        kv = max(kv, batch * arch.kv_bytes(slots, min(slots, swa) if swa else None, per))
        scores = batch * arch.n_heads * workload.batch_prompt_tokens * slots * 6  # prefill: 16-bit scores + f32 softmax
    acts = n_ctx * (arch.intermediate + 4 * arch.hidden) * per + 2 * ROW_BLOCK * arch.vocab * 4 + scores
    runtime = GB  # the interpreter with torch and transformers imported
    on_gpu = hw.gpus > 0 and options.device != "cpu"
    if on_gpu:
        budget, fixed = hw.gpu_memory_bytes, weights_bytes + acts + TORCH_GPU_RUNTIME_BYTES
        devices = f"1x GPU {hw.gpu_memory_bytes / GB:.1f} GB"
    else:
        budget, fixed = hw.ram_bytes, weights_bytes + acts + runtime
        devices = f"CPU {hw.ram_bytes / GB:.1f} GB RAM"
    per_tok = arch.kv_bytes_per_token(per)
    mem_ctx = max_ctx = fits_count(budget - fixed, per_tok)
    if arch.context_length and max_ctx > arch.context_length:
        max_ctx = arch.context_length
    overhead = fixed - weights_bytes
    return LedgerRow(
        deployment=name, engine="hf", precision=f"{precision} as {options.dtype}", weights_from=weights_from,
        devices=devices, n_devices=1, weights_bytes=weights_bytes, kv_bytes_per_token=per_tok, kv_bytes=kv,
        overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv + overhead), per_device_bytes=int(fixed + kv),
        device_budget_bytes=budget, fits=fixed + kv <= budget, max_context=max_ctx, memory_context=mem_ctx,
        max_concurrency=max(1, batch), notes=(f"transformers, batches of up to {options.max_batch_size} requests in a static KV cache"
                                              + (f"; {batch} x {slots} tokens for the cost suite" if batch > 1 and slots else "")),
    )


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
    memory_model=_memory,
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
)
