"""Chunked perplexity exactly as llama.cpp's `llama-perplexity`, and drift (KLD) from the reference.

Chunking (tools/perplexity/perplexity.cpp, `perplexity()`): the whole text is tokenized once with BOS
(one trailing newline dropped, as `-f` does), cut into non-overlapping chunks of n_ctx tokens (the
remainder is dropped), each chunk's first token is replaced by BOS where the model adds one, and
only the tokens at positions n_ctx/2 + 1 .. n_ctx - 1 are scored (the logits at n_ctx/2 .. n_ctx - 2
predict them). PPL = exp(mean NLL over every scored token of every chunk).

Bits per byte = total NLL in bits / UTF-8 bytes of the scored span, where the span's bytes are those of
`engine.detokenize(scored token ids)` (the scored tokens' pieces concatenated; a character split at a
span edge renders as U+FFFD, 3 bytes). It divides by text, not tokens, so tokenizers compare.

Records hold each chunk's tokens, per-token NLLs and the top-k log-probs, so PPL and KLD are computed
from records alone (`evalkit.metrics.likelihood`).
"""
from __future__ import annotations

import difflib
import hashlib
import io
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from evalkit.config import PositiveInt, resolve_data_path
from evalkit.engines import gives_full_distributions
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import ConfigError, DataError
from evalkit.fileio import atomic_write_bytes
from evalkit.metrics.kld import FORMAT_VERSION as KLD_FORMAT
from evalkit.metrics.kld import (DistributionReader, DistributionWriter, StoreMismatch, bytes_per_token_bound, kld_against,
                                 tokens_sha256)
from evalkit.metrics.likelihood import (
    nll_and_topk,
    DriftSummary,
    PplStats,
    TokenDrift,
    fsum,
    fsum_mean,
    paired_perplexity,
    perplexity_stats,
    sample_sd,
    summarize_drift,
    token_drift_arrays,
)
from evalkit.metrics.stats import excludes_zero, normal_two_sided_p, z_value
from evalkit.records import PerplexityRecord, dump_record, token_arrays, token_dtype, typed, utc_now
from evalkit.sidefiles import SideFile, side_path, write_side_file
from evalkit.store import MANIFEST, SIDE_KEY, ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.metrics.declarations import MetricSpec
from evalkit.suites.base import Emit, Item, ScoreContext, Suite
from evalkit.suites.spec import ItemCell, SuiteSpec, ViewerSpec
from evalkit.terminal import say



class PerplexitySettings(BaseModel):
    """`suites.perplexity`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(default="texts/ppl_default.txt", min_length=1)
    # Tokens from n_ctx//2 + 1 on are scored (llama-perplexity's rule): 3 is the least with one scored token.
    n_ctx: int = Field(default=512, ge=3)
    max_chunks: PositiveInt | None = 4
    # Where KLD is the top-k + tail bound (vLLM): at k = 2000 it read 2.9% below the exact KLD of fp8-weight vs
    # bf16 Gemma 3 270M (hf engine, same weights; k = 20: 31%, 100: 17%, 1000: 5.0%). Exact pairs ignore it.
    top_k: int = Field(default=2000, ge=1)
    # The deployment whose full next-token distributions every other full-distribution deployment's exact
    # KLD is measured against (None: the run's reference). It must give full distributions (Capability.
    # FULL_DISTRIBUTION); deployments that cannot (vLLM) keep the top-k bound against the run's reference.
    kld_reference: str | None = Field(default=None, min_length=1)
    # Streaming exact KLD: at most this many chunks of the KLD reference's stored distributions on disk at a
    # time (the reference waits; a chunk is deleted once every reader recorded it), the reference and its
    # readers running at once. None: every chunk kept for the whole run (evalkit plan says which fits).
    kld_window: PositiveInt | None = None

CATEGORY = "text"
LOGPROB_DECIMALS = 6  # top-k log-probs in records: 1e-6 is below float32 logit noise, halves the size
METHOD = (
    "llama-perplexity chunking (BOS per chunk, second half scored); PPL ± = SE of mean NLL over tokens "
    "(delta method); KLD(ref||dep) exact over the full vocabulary where the reference and the deployment "
    "both give full distributions (the reference's stored once per chunk, evalkit.metrics.kld), else per "
    "token from the reference's top-k ids + the correct token, the rest as one tail bucket (a lower bound)"
)
STORE_DIR = "distributions"  # run_dir/distributions/<reference>/<chunk id>.evkld
STORE_SUFFIX = ".evkld"
# Text bytes per token assumed where a plan must size a run before any tokenizer is loaded: conservative for BPE
# tokenizers on English (WikiText-2 is ~4.4 bytes per SmolLM2 token).
BYTES_PER_TOKEN = 3.0
ARRAYS_FORMAT = 2  # the side-file layout in cache keys: a change re-measures instead of misreading

# Measured against exact full-vocabulary KLD (tests/test_perplexity.py; Gemma 3 270M, 262k vocabulary):
KLD_BIAS = (
    "the top-k+tail bound reads below the exact KLD; measured on the same weights (hf engine, fp8-weight vs bf16 "
    "Gemma 3 270M, WikiText-2, n_ctx 512): 31% low at k=20, 17% at 100, 7.7% at 500, 5.0% at 1000, 2.9% at 2000 "
    "(Q2_K-class drift loses more: ~50% at k=20); compare deployments at the same top_k"
)


def scored_from(n_ctx: int) -> int:
    """Index in a chunk of the first scored token (llama.cpp: logits from `first = n_ctx/2` on)."""
    return n_ctx // 2 + 1


def chunk_count(n_tokens: int, n_ctx: int, max_chunks: int | None) -> int:
    n = n_tokens // n_ctx
    return n if max_chunks is None else min(n, max_chunks)


def chunk_id(index: int) -> str:
    return f"chunk-{index:04d}"


class PerplexitySuite(Suite["PerplexitySettings"]):
    name = "perplexity"
    requires = frozenset({Capability.PROMPT_LOGPROBS, Capability.TOKENIZER})

    def kld_owner(self) -> str | None:
        """The deployment whose stored distributions this run's exact KLD reads (None: no exact KLD).

        A bare suite (no config: unit tests) takes the binding's reference, and exact KLD wherever its
        store happens to exist."""
        if self.config is None:
            return self.binding.reference if self.binding is not None else None
        return kld_reference(self.config)

    def top_k_for(self, deployment: str | None, full: bool) -> int:
        """How many top-k log-probs `deployment` records per token: only what a reader needs. A deployment
        whose KLD is exact (and the KLD reference itself) needs none; the top-k bound needs them on both of
        its sides: deployments without full distributions, and the run's reference when one of those runs.
        A bare suite (no config) keeps `top_k` everywhere."""
        s = self.settings
        if self.config is None or deployment is None:
            return s.top_k
        if deployment == self.config.reference:
            return s.top_k if bound_deployments(self.config) else 0
        return s.top_k if (not full or self.kld_owner() is None) else 0

    def runs_after(self, deployment: str, spec: Any) -> frozenset[str]:
        """A deployment that gives full distributions reads the KLD reference's store: it runs after it
        (in streaming-KLD mode beside it instead: `runs_beside`)."""
        owner = self.kld_owner()
        if owner is None or deployment == owner or not gives_full_distributions(spec.engine) or self.settings.kld_window:
            return frozenset()
        return frozenset({owner})

    def runs_beside(self, deployment: str, spec: Any) -> frozenset[str]:
        """Streaming-KLD mode: the KLD reference and its readers run at the same time."""
        owner = self.kld_owner()
        if owner is None or not self.settings.kld_window or self.config is None:
            return frozenset()
        readers = streaming_readers(self.config)
        if deployment == owner:
            return frozenset(readers)
        return frozenset({owner}) if deployment in readers else frozenset()

    # -- data -----------------------------------------------------------------------------------

    def _text_path(self) -> Path:
        return resolve_data_path(self.settings.text, self.config_file)

    def _text_bytes(self) -> bytes:
        path = self._text_path()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError(str(path), "perplexity text not found (suites.perplexity.text)") from None
        except OSError as e:
            raise DataError(str(path), f"cannot read perplexity text: {e}") from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(str(path), f"perplexity text is not UTF-8 (byte {e.start})") from None
        return data

    def _text(self) -> str:
        text = self._text_bytes().decode("utf-8")
        return text[:-1] if text.endswith("\n") else text  # llama-perplexity -f drops one trailing newline

    def items(self) -> list[Item]:
        """Chunk placeholders. The real count needs the deployment's tokenizer, so this is an upper
        bound (a token covers at least one byte; +2 for BOS and a space prefix); `run` writes a `skipped`
        record for placeholders past the end of the text so resume sees them done."""
        n_bytes = len(self._text_bytes())
        n = chunk_count(n_bytes + 2, self.settings.n_ctx, self.settings.max_chunks)
        return [Item(chunk_id(i), CATEGORY, {"index": i}) for i in range(n)]

    # -- running --------------------------------------------------------------------------------

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        s = self.settings
        info = engine.info()
        if s.n_ctx > info.n_ctx:
            raise ConfigError(
                str(self.config_file),
                f"suites.perplexity.n_ctx={s.n_ctx} exceeds the deployment's context ({info.n_ctx} tokens)",
            )
        text = self._text()
        text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
        tokens = engine.tokenize(text, add_bos=True)
        n_chunks = chunk_count(len(tokens), s.n_ctx, s.max_chunks)
        if n_chunks == 0:
            raise DataError(str(self._text_path()), f"text has {len(tokens)} tokens, fewer than n_ctx={s.n_ctx}")
        bos = info.bos_token_id if info.add_bos else None
        first = scored_from(s.n_ctx)
        distributions = distribution_source(engine)
        binding = self.binding
        owner = self.kld_owner()
        store = store_dir(binding.run_dir, owner) if binding is not None and owner is not None else None
        is_reference = binding is not None and binding.deployment == owner
        if is_reference and self.config is not None and not streaming_readers(self.config):
            # Only what is read is written: with no deployment reading them, no distributions are stored.
            store = owner = None
            is_reference = False
        # In a configured run the KLD reference stores every chunk before a reader runs (the executors order
        # units by `runs_after`); a chunk whose store is missing (that reference failed) stays pending, so a
        # resumed run measures it exactly instead of recording the bound for good. A Ray node that does not
        # see the run directory (no shared filesystem) cannot read the store: it records the bound.
        must_read = (self.config is not None and distributions is not None and store is not None and not is_reference
                     and (binding.run_dir / MANIFEST).is_file())  # type: ignore[union-attr]
        top_k = self.top_k_for(binding.deployment if binding is not None else None, full=distributions is not None)
        stream = None
        # The driver's cache pass (executors/cached.py) answers what the cache holds and never waits on a peer.
        if (must_read or (is_reference and self.config is not None and store is not None)) and not getattr(self, "cache_pass", False):
            stream = Streaming.of(self, store, binding.deployment, is_reference)  # type: ignore[union-attr,arg-type]
        with stream if stream is not None else nullcontext():
            retokenized: frozenset[int] = frozenset()
            if is_reference and store is not None:
                write_reference_tokens(store, text_sha, tokens)
            elif must_read and store is not None:
                tokens, retokenized = self._reference_tokens(engine, tokens, store, text_sha, owner, stream)
                n_chunks = chunk_count(len(tokens), s.n_ctx, s.max_chunks)
            self._run_chunks(engine, items, emit, tokens, n_chunks, bos, first, distributions, store, owner, is_reference,
                             must_read, top_k, text_sha, stream, retokenized)

    def _reference_tokens(self, engine: Engine, own: list[int], store: Path, text_sha: str, owner: str | None,
                          stream: "Streaming | None") -> tuple[list[int], frozenset[int]]:
        """The token ids an exact-KLD reader scores: the KLD reference's, so that both score the same tokens
        (llama-perplexity --kl-divergence reads them from its base file too), and the chunks where this
        deployment's own tokenizer splits the text differently (a GGUF's tokenizer and tokenizer.json can part
        ways far into a long text). Own tokens where the reference's list is not there (a run directory from
        before it was written, or the driver's cache pass before the reference ran)."""
        path = reference_tokens_path(store, text_sha)
        if not path.is_file() and (stream is None or not stream.wait_for(path)):
            return own, frozenset()
        ref = np.load(path).tolist()
        if ref == own:
            return own, frozenset()
        s = self.settings
        n = chunk_count(len(ref), s.n_ctx, s.max_chunks)
        # Position 0 of every chunk is BOS either way: compare the rest.
        differ = frozenset(i for i in range(n)
                           if own[i * s.n_ctx + 1 : (i + 1) * s.n_ctx] != ref[i * s.n_ctx + 1 : (i + 1) * s.n_ctx])
        if differ:
            at = next((i for i, (a, b) in enumerate(zip(own, ref)) if a != b), min(len(own), len(ref)))
            who = self.binding.deployment if self.binding is not None else engine.info().model
            say(f"evalkit: perplexity: {who}: its tokenizer splits the text differently from the KLD reference "
                f"{owner}'s from token {at:,} on ({len(differ)} of {n} chunks differ): every chunk is scored on the "
                f"reference's tokens, so KLD and PPL compare the same tokens (llama-perplexity --kl-divergence does too)")
        return ref, differ

    def _run_chunks(self, engine: Engine, items: Sequence[Item], emit: Emit, tokens: list[int], n_chunks: int,
                    bos: int | None, first: int, distributions: "Distributions | None", store: Path | None,
                    owner: str | None, is_reference: bool, must_read: bool, top_k: int, text_sha: str,
                    stream: "Streaming | None", retokenized: frozenset[int] = frozenset()) -> None:
        s = self.settings
        info = engine.info()
        binding = self.binding
        waiting: list[str] = []
        for n_item, item in enumerate(items):
            index = int(item.data["index"])
            base = {"suite": self.name, "item_id": item.item_id, "category": CATEGORY}
            if index >= n_chunks:
                emit([_dump({**base, "skipped": f"past the end of the text ({n_chunks} chunks of {s.n_ctx} tokens)"})])
                continue
            start = time.perf_counter()
            chunk = list(tokens[index * s.n_ctx : (index + 1) * s.n_ctx])
            if bos is not None:
                chunk[0] = bos
            path = store / f"{item.item_id}{STORE_SUFFIX}" if store is not None else None
            if stream is not None and is_reference and not stream.room_for_one():
                waiting += [i.item_id for i in items[n_item:]]  # its readers stopped: the rest waits for --resume
                break
            if must_read and path is not None and not path.is_file() and not (stream is not None and stream.wait_for(path)):
                waiting.append(item.item_id)
                continue
            if distributions is not None and path is not None and (is_reference or path.is_file()):
                scalars, side, prov = cached_chunk_full(
                    engine, distributions, chunk, first, top_k, info.vocab_size, path, write=is_reference,
                    meta={"deployment": binding.deployment}, streaming=stream is not None)  # type: ignore[union-attr]
                if not is_reference:
                    scalars["kld_reference"] = owner
            else:
                # No full distributions here (or no store to read on this node): the top-k bound's inputs.
                # A reader that cannot see the store (a Ray node without the run directory) records the bound.
                k = s.top_k if (distributions is not None and store is not None and not is_reference) else top_k
                scalars, side, prov = cached_chunk_span(engine, chunk, first, k, info.vocab_size)
            score_s = time.perf_counter() - start
            record = _dump({
                **base,
                "chunk_index": index,
                "n_ctx": s.n_ctx,
                "tokens_sha256": tokens_sha256(chunk),
                "bos_replaced": bos is not None,
                "scored_from": first,
                **scalars,
                "arrays_sha256": side.sha256,
                "arrays_bytes": len(side.data),
                "n_bytes": len(engine.detokenize(chunk[first:]).encode("utf-8")),
                "n_text_tokens": len(tokens),
                "text_sha256": text_sha,
                **({"tokens_from": owner} if index in retokenized else {}),
                "timings": {"score_s": score_s, "total_s": time.perf_counter() - start},
                **prov,
            })
            emit([{**record, SIDE_KEY: side}])
            if stream is not None and not is_reference:
                stream.sweep()  # the record is on disk: chunks every reader has now recorded are deleted
        if waiting and is_reference:
            say(f"evalkit: perplexity: {len(waiting)} chunk(s) left pending: streaming KLD's readers stopped reading "
                f"(the window of {s.kld_window} chunks stays full); --resume measures them")
        elif waiting:
            say(f"evalkit: perplexity: {len(waiting)} chunk(s) left pending ({', '.join(waiting[:20])}"
                f"{', ...' if len(waiting) > 20 else ''}): the KLD reference "
                f"{owner} has not stored their distributions (it did not finish); --resume measures them")

    # -- scoring --------------------------------------------------------------------------------

    def _scored(self, records: Any, ctx: ScoreContext) -> tuple[dict[str, "_Chunks"], dict[str, "_Pairs"]]:
        """Chunks and pairings of one scoring pass. score, compare and item_rows get the same `records` and
        `ctx` objects, and pairing reads every side file once: done once."""
        kept = getattr(self, "_scored_pass", None)
        if kept is not None and kept[0] is records and kept[1] is ctx:
            return kept[2], kept[3]
        run_dir = getattr(ctx, "run_dir", None)
        chunks = {dep: _Chunks.of(recs, run_dir, dep) for dep, recs in records.items()}
        pairs = _pairs(chunks, ctx)
        self._scored_pass = (records, ctx, chunks, pairs)
        return chunks, pairs

    def score(self, records: dict[str, list[dict[str, Any]]], ctx: ScoreContext) -> list[ScoreRow]:
        rows: list[ScoreRow] = []
        chunks, pairs = self._scored(records, ctx)
        exact = {dep: p for dep, p in pairs.items() if p.exact}
        for dep in _ordered(chunks, ctx):
            st = chunks[dep].ppl()
            rows += _ppl_rows(dep, self.name, st, ctx.stats.alpha)
            p = pairs[dep]
            ratio = p.ppl.ratio_rows() if p.ppl is not None and p.ppl.reason is None else []
            if p.kld is None or p.kld.drift is None:
                # No KLD for this one (a v2 KLD reference stores no top-k, or the two sides come from two runs):
                # its PPL ratio still stands, with the interval it has beside a KLD (as _drift_rows gives it).
                z = z_value(ctx.stats.alpha)
                rows += [ScoreRow(dep, self.name, CATEGORY, m, v, *((v - z * se, v + z * se) if se is not None and math.isfinite(se)
                                                                    else (None, None)), p.ppl.n_tokens) for m, v, se in ratio] \
                    if p.ppl is not None and ratio and dep != ctx.reference else []
                continue
            extra = ratio + p.kld.bias_rows()
            if not p.exact:
                extra += _same_weights_rows(dep, p.kld.drift, exact, ctx)
            rows += _drift_rows(dep, self.name, p.kld.drift, extra, ctx.stats.alpha)
        return rows

    def compare(self, records: dict[str, list[dict[str, Any]]], ctx: ScoreContext) -> list[ComparisonRow]:
        rows: list[ComparisonRow] = []
        alpha = ctx.stats.alpha
        for dep, p in self._scored(records, ctx)[1].items():
            if p.kld is not None and p.kld is not p.ppl and p.kld.drift is not None:
                # Exact KLD against the KLD reference's stored distributions; PPL stays paired with the run's reference.
                if p.ppl is not None:
                    rows += [r for r in p.ppl.comparison_rows(dep, ctx.reference, self.name, alpha) if r.metric not in DRIFT_METRICS]
                rows += p.kld.drift_comparison_rows(dep, p.kld_reference, self.name, z_value(alpha))
            elif p.ppl is not None:
                rows += p.ppl.comparison_rows(dep, ctx.reference, self.name, alpha)
        return rows

    def item_rows(self, records: dict[str, list[dict[str, Any]]], ctx: ScoreContext) -> list[dict[str, Any]]:
        chunks, pairs = self._scored(records, ctx)
        out = []
        for dep in _ordered(chunks, ctx):
            pair = pairs[dep].kld
            c = chunks[dep]
            for cid in c.ids:
                rec = c.records[cid]
                st = perplexity_stats(c.nll[cid], int(rec.n_bytes or 0))
                row: dict[str, Any] = {
                    "item_id": cid, "deployment": dep, "category": CATEGORY, "n_scored": st.n_tokens,
                    "nll_mean": st.nll_mean, "ppl": st.ppl, "bits_per_byte": st.bits_per_byte,
                    "score_s": rec.timings.score_s if rec.timings is not None else None,
                }
                if pair is not None and pair.drift is not None and cid in pair.per_chunk:
                    d = pair.per_chunk[cid]
                    row.update(kld_mean=fsum_mean(d.kld), kld_max=float(np.max(d.kld)),
                               top1_agreement=fsum_mean(d.same_top), delta_p_mean=fsum_mean(d.delta_p))
                out.append(row)
        return out

    def describe(self) -> dict[str, Any]:
        s = self.settings
        data = self._text_bytes()
        return {
            "text": str(self._text_path()),
            "text_sha256": hashlib.sha256(data).hexdigest(),
            "text_bytes": len(data),
            "n_ctx": s.n_ctx,
            "max_chunks": s.max_chunks,
            "chunks_upper_bound": len(self.items()),
            "scored_positions": f"{scored_from(s.n_ctx)}..{s.n_ctx - 1} of each chunk",
            "top_k": s.top_k,
            "bytes_of": "UTF-8 of engine.detokenize(scored tokens)",
            "ci": "95% normal: ±1.96 SE over tokens (llama-perplexity's ±); top-1 agreement: Wilson",
            "method": METHOD,
            "kld_bias": KLD_BIAS,
            "kld_reference": kld_reference(self.config) if self.config is not None else None,
        }


# -- engine side -------------------------------------------------------------------------------

Distributions = Callable[[list[int], int], Iterator[tuple[int, np.ndarray]]]


def kld_reference(config: Any) -> str | None:
    """The deployment whose full distributions a run's exact KLD is measured against: `suites.perplexity.
    kld_reference`, else the run's reference; None when that one gives no full distributions (vLLM) or does
    not run perplexity, so there is no exact KLD in the run (only the top-k bound)."""
    from evalkit.engines import engine_spec

    settings = config.suites.perplexity
    if settings is None:
        return None
    name = settings.kld_reference or config.reference
    dep = config.deployment(name)
    spec = engine_spec(dep.engine)
    if not gives_full_distributions(dep.engine) or spec.missing(PerplexitySuite.requires) or not dep.runs("perplexity"):
        return None
    return name


STREAM_GRACE_S = float(os.environ.get("EVALKIT_STREAM_GRACE_S", "600"))  # how long a missing peer may take to start
STREAM_POLL_S = 0.2


@dataclass
class Streaming:
    """Streaming exact KLD (`suites.perplexity.kld_window`): the KLD reference keeps at most `window` chunk
    stores on disk, waiting for room; a reader waits for each chunk to appear; once every reader has
    recorded a chunk (its records line is on disk), the chunk's store is deleted (by the reader that
    recorded it last, or by the waiting reference). Liveness is a file lock each side holds while it runs:
    a side that waits on a peer whose lock has been free for STREAM_GRACE_S stops and leaves the rest pending.
    What is lost against the stored mode: the reference's distributions themselves (scoring needs only the
    records and side files, so `evalkit report` re-scores unchanged), so a deployment added to the run later,
    or a reader re-run from scratch, needs the reference's chunks re-run too; the cache keeps none of them."""

    run_dir: Path
    store: Path
    me: str
    owner: str
    readers: list[str]
    window: int
    _lock: Any = None

    @classmethod
    def of(cls, suite: "PerplexitySuite", store: Path, me: str, is_reference: bool) -> "Streaming | None":
        window = suite.settings.kld_window
        if window is None or suite.config is None or suite.binding is None:
            return None
        owner = suite.kld_owner()
        assert owner is not None
        return cls(suite.binding.run_dir, store, me, owner, streaming_readers(suite.config), int(window))

    def _lock_path(self, name: str) -> Path:
        return self.store / (".writer.lock" if name == self.owner else f".reader.{name}.lock")

    def __enter__(self) -> "Streaming":
        from filelock import FileLock

        self.store.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self._lock_path(self.me))
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def _running(self, name: str) -> bool:
        from filelock import FileLock, Timeout

        lock = FileLock(self._lock_path(name), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return True
        lock.release()
        return False

    def _stored(self) -> list[Path]:
        return sorted(self.store.glob(f"chunk-*{STORE_SUFFIX}"))

    def sweep(self) -> list[Path]:
        """Delete the stores every reader has recorded; returns those still needed."""
        from evalkit.store import RunDir, record_key

        run = RunDir(self.run_dir)
        done = {r: run.done_keys(r) for r in self.readers}
        left = []
        for path in self._stored():
            key = record_key("perplexity", path.name.removesuffix(STORE_SUFFIX))
            if all(key in d for d in done.values()):
                path.unlink(missing_ok=True)
            else:
                left.append(path)
        return left

    def room_for_one(self) -> bool:
        """The reference, before storing a chunk: wait until fewer than `window` stores are on disk (False:
        the readers still owing the stored chunks have not run for STREAM_GRACE_S)."""
        return self._wait(lambda: len(self.sweep()) < self.window, self.readers)

    def wait_for(self, path: Path) -> bool:
        """A reader: wait until the reference has stored `path` (False: the reference is not running and has
        not for STREAM_GRACE_S; the chunk stays pending)."""
        return self._wait(path.is_file, [self.owner])

    def _wait(self, ready: Callable[[], bool], peers: list[str]) -> bool:
        """Poll until `ready()`; False once none of `peers` has run for STREAM_GRACE_S."""
        idle_since: float | None = None
        while not ready():
            if any(self._running(p) for p in peers):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > STREAM_GRACE_S:
                return False
            time.sleep(STREAM_POLL_S)
        return True


def streaming_readers(config: Any) -> list[str]:
    """The deployments that read the KLD reference's stored distributions (exact KLD)."""
    owner = kld_reference(config)
    if owner is None:
        return []
    out = [d.name for d in config.deployments
           if d.runs("perplexity") and d.name != owner and gives_full_distributions(d.engine)]
    if config.noise_floor and config.reference in out:
        out.append(config.reference + ".rerun")
    return out


def bound_deployments(config: Any) -> list[str]:
    """Deployments (not the reference) whose KLD is the top-k bound against the run's reference: they give
    no full distributions, or the run has no exact-KLD reference. Their top-k and the reference's are kept."""
    owner = kld_reference(config)
    out = [d.name for d in config.deployments
           if d.runs("perplexity") and d.name != config.reference and (owner is None or not gives_full_distributions(d.engine))]
    if config.noise_floor and (owner is None or not gives_full_distributions(config.deployment(config.reference).engine)):
        out.append(config.reference + ".rerun")
    return out


def store_dir(run_dir: Path, reference: str) -> Path:
    return run_dir / STORE_DIR / reference


def reference_tokens_path(store: Path, text_sha: str) -> Path:
    """The KLD reference's tokenization of the whole text (int32 .npy, BOS first), beside its chunk stores:
    its readers score these ids. Streaming KLD never deletes it (4 bytes per token of the text)."""
    return store / f"tokens-{text_sha[:16]}.npy"


def write_reference_tokens(store: Path, text_sha: str, tokens: list[int]) -> None:
    buf = io.BytesIO()
    np.save(buf, np.asarray(tokens, dtype="<i4"))
    atomic_write_bytes(reference_tokens_path(store, text_sha), buf.getvalue())


def store_bytes_upper_bound(n_tokens: int, vocab: int) -> int:
    """Most bytes the reference's store can take for `n_tokens` scored tokens (the dense layout: llama.cpp's
    2 bytes per vocabulary id); the bitmap layout takes less whenever the distribution has a long tail."""
    return n_tokens * bytes_per_token_bound(vocab)


def plan_store_note(config: Any, config_file: Path) -> str | None:
    """The plan's lines on exact KLD, before anything runs: which deployments get it, against whose stored
    distributions and how large that store can get; which keep the top-k bound. None: perplexity is off."""
    from evalkit.ledger import local_model_path, gguf_weights, hf_weights

    s = config.suites.perplexity
    if s is None:
        return None
    owner = kld_reference(config)
    if owner is None:
        ref = config.deployment(config.reference)
        return (f"perplexity: no exact KLD (the reference {ref.name} runs on {ref.engine}, which gives no full "
                f"distributions, and no suites.perplexity.kld_reference is set); KLD is the top-{s.top_k} + tail lower bound")
    ref = config.deployment(owner)
    runs = [d for d in config.deployments if d.runs("perplexity") and d.name != owner]
    readers = [d.name for d in runs if gives_full_distributions(d.engine)]
    bound = [d.name for d in runs if not gives_full_distributions(d.engine) and d.name != config.reference]
    lines = [f"perplexity: exact KLD against {owner} for {', '.join(readers) or 'no deployment'}"]
    if bound:  # engines without full distributions keep the bound, against the run's reference
        lines.append(f"perplexity: top-{s.top_k} + tail lower bound of KLD against {config.reference} for {', '.join(bound)}")
    suite = PerplexitySuite(s, config, config_file)
    # The same estimate as the disk plan's (evalkit.diskplan): tokens at BYTES_PER_TOKEN text bytes each.
    chunks = min(len(suite.items()), chunk_count(int(len(suite._text_bytes()) / BYTES_PER_TOKEN) + 2, s.n_ctx, s.max_chunks))
    tokens = chunks * (s.n_ctx - scored_from(s.n_ctx))
    path = local_model_path(ref.model.source, config_file)
    try:
        vocab = (hf_weights(path) if path.is_dir() else gguf_weights(path)).arch.vocab if path is not None else None
    except Exception:  # noqa: BLE001 - an unreadable model is the ledger's row to report, not this line's
        vocab = None
    if not vocab:
        lines.append(f"perplexity: {owner}'s store size is unknown (vocabulary of {ref.model.source} unknown)")
    else:
        most = store_bytes_upper_bound(tokens, vocab)
        window = f"; streaming (kld_window: {s.kld_window}): at most {s.kld_window} chunks of it at a time" if s.kld_window else ""
        lines.append(f"perplexity: {owner}'s stored distributions: ~{most / 1e9:.2f} GB in the run directory "
                     f"(~{tokens:,} scored tokens x {vocab:,} ids, 2 bytes each at most, as llama.cpp's base file; "
                     f"long-tailed distributions take less{window})")
    return "\n".join(lines)


def distribution_source(engine: Engine) -> Distributions | None:
    """`token_distributions` of an engine whose spec declares FULL_DISTRIBUTION, else None.

    Reads the capability from the engine's spec (not hasattr: a lazy engine would load to answer)."""
    try:
        full = gives_full_distributions(engine.info().engine)
    except Exception:  # noqa: BLE001 - an engine outside the registry (test doubles): no full distributions
        return None
    if not full:
        return None

    def source(tokens: list[int], first: int) -> Iterator[tuple[int, np.ndarray]]:
        return engine.token_distributions(tokens, first)  # wrappers pass it through (a lazy engine loads here)

    return source


Measured = tuple[dict[str, Any], SideFile, dict[str, Any]]  # record scalars, side file, provenance


def _through_cache(engine: Engine, kind: str, payload: dict[str, Any], compute: Callable[[], tuple[dict[str, Any], SideFile]],
                   ok: Callable[[dict[str, Any]], bool] = lambda hit: True) -> Measured:
    """One chunk's measurement through the engine-result cache (when the engine has one): the entry holds the
    record's scalars and the side file's hash; the side file itself is kept by hash under the cache's
    `arrays/` (evalkit.sidefiles), so a re-run copies bytes and parses no array. `ok` vets a hit further."""
    if not keeps_measurements(engine):
        scalars, side = compute()
        return scalars, side, {"cached": False, "measured_at": utc_now()}
    hit = engine.measurement(kind, payload)  # type: ignore[attr-defined]
    if isinstance(hit, dict) and isinstance(hit.get("arrays_sha256"), str) and ok(hit):
        sha = hit["arrays_sha256"]
        blob = side_path(cache_root(), sha)
        try:
            data = blob.read_bytes()
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() == sha:
            scalars = {k: v for k, v in hit.items() if k not in ("arrays_sha256", "measured_at")}
            stamp = hit.get("measured_at")  # None: a stored measurement from before it kept the time
            return scalars, SideFile(sha, data), {"cached": True, "measured_at": stamp}
    scalars, side = compute()
    now = utc_now()
    try:
        write_side_file(cache_root(), side)
        engine.store_measurement(kind, payload, {**scalars, "arrays_sha256": side.sha256, "measured_at": now})  # type: ignore[attr-defined]
    except OSError as e:  # a full cache disk costs the cache entry, not the run
        print(f"evalkit: warning: result cache not written ({e.strerror})", file=sys.stderr, flush=True)
    return scalars, side, {"cached": False, "measured_at": now}


def keeps_measurements(engine: Engine) -> bool:
    """Whether this engine's results go through the result cache (not under `--no-cache`)."""
    return bool(getattr(engine, "keeps_measurements", False))


def cache_root() -> Path:
    from evalkit.models import cache_dir

    return cache_dir()


def cached_chunk_span(engine: Engine, chunk: list[int], first: int, top_k: int, vocab: int) -> Measured:
    """NLL (and top-k where a bound reads it) of chunk[first:] from `Engine.score_span`, through the cache."""
    payload = {"token_ids": chunk, "first": first, "top_k": top_k, "arrays": ARRAYS_FORMAT}

    def compute() -> tuple[dict[str, Any], SideFile]:
        # The engine's own call, not its cache wrapper's: the wrapper would keep the top-k lists as JSON.
        nll, top = uncached_engine(engine).score_span(chunk, first, top_k)
        return _arrays(chunk, first, np.asarray(nll, dtype=np.float64), top_k, vocab, top=top)

    return _through_cache(engine, "perplexity_chunk", payload, compute)


def uncached_engine(engine: Engine) -> Engine:
    return engine.uncached() if hasattr(engine, "uncached") else engine


def _arrays(chunk: list[int], first: int, nll: np.ndarray, top_k: int, vocab: int, *, top: Any = None,
            ids: np.ndarray | None = None, lps: np.ndarray | None = None, argmax: np.ndarray | None = None,
            kld: np.ndarray | None = None, same_top: np.ndarray | None = None) -> tuple[dict[str, Any], SideFile]:
    """The record's scalars and side file of one chunk (only the fields given are written)."""
    fields = ["token", "nll"] + [f for f, v in (("argmax", argmax), ("kld", kld), ("same_top", same_top)) if v is not None]
    if top_k:
        fields += ["top_ids", "top_lp"]
    out = np.zeros(len(nll), dtype=token_dtype(fields, top_k, vocab))
    out["token"] = chunk[first:]
    out["nll"] = nll
    for name, v in (("argmax", argmax), ("kld", kld), ("same_top", same_top)):
        if v is not None:
            out[name] = v
    if top_k:
        if top is not None:  # [[id, logprob], ...] per row from score_span (a row may hold fewer: padded)
            ids = np.full((len(nll), top_k), -1 if out["top_ids"].dtype.kind == "i" else 0, dtype=np.int64)
            lps = np.full((len(nll), top_k), -np.inf)
            for i, row in enumerate(top):
                if row:
                    a = np.asarray(row, dtype=np.float64)[:top_k]
                    ids[i, : len(a)], lps[i, : len(a)] = a[:, 0], a[:, 1]
        out["top_ids"], out["top_lp"] = ids[:, :top_k], lps[:, :top_k]  # type: ignore[index]
    scalars: dict[str, Any] = {"n_scored": int(len(nll)), "nll_sum": float(out["nll"].astype(np.float64).sum()), "top_k": top_k}
    if kld is not None:
        scalars["kld_sum"] = float(out["kld"].astype(np.float64).sum())
    return scalars, SideFile.of(out)


def cached_chunk_full(
    engine: Engine, distributions: Distributions, chunk: list[int], first: int, top_k: int, vocab: int, path: Path, *,
    write: bool, meta: dict[str, Any] | None = None, streaming: bool = False,
) -> Measured:
    """`score_chunk_full` through the engine-result cache (when the engine has one), so a re-run does not load
    the model: the reference's store is kept in the cache too (content-addressed) and copied back into the
    run; a deployment's result is keyed by the exact reference store it was compared with."""
    payload: dict[str, Any] = {"token_ids": chunk, "first": first, "top_k": top_k, "store_format": KLD_FORMAT,
                               "arrays": ARRAYS_FORMAT}
    if not write:
        payload["reference_store_sha256"] = _file_sha256(path)
    kind = "perplexity_reference_chunk" if write else "perplexity_kld_chunk"

    def kept(hit: dict[str, Any]) -> bool:
        """The reference's store is in the cache too: copied back into the run (else: a miss)."""
        if not write:
            return True
        src = _kept_stores() / f"{hit.get('store_sha256')}{STORE_SUFFIX}"
        if not src.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.copy")
        shutil.copyfile(src, tmp)
        os.replace(tmp, path)
        return True

    def compute() -> tuple[dict[str, Any], SideFile]:
        scalars, side = score_chunk_full(distributions, chunk, first, top_k, vocab, path, write=write, meta=meta)
        if write and keeps_measurements(engine) and not streaming:
            digest = _file_sha256(path)
            try:
                _kept_stores().mkdir(parents=True, exist_ok=True)
                tmp = _kept_stores() / f".{digest}.{os.getpid()}.tmp"
                shutil.copyfile(path, tmp)
                os.replace(tmp, _kept_stores() / f"{digest}{STORE_SUFFIX}")
            except OSError as e:
                print(f"evalkit: warning: KLD store not kept in the cache ({e.strerror})", file=sys.stderr, flush=True)
            scalars["store_sha256"] = digest
        return scalars, side

    return _through_cache(engine, kind, payload, compute, kept)


def _kept_stores() -> Path:
    return cache_root() / "kld-stores"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def score_chunk_full(
    distributions: Distributions, chunk: list[int], first: int, top_k: int, vocab: int, path: Path, *,
    write: bool, meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], SideFile]:
    """One teacher-forced pass with full distributions: NLL (top-k only when `top_k`) of every scored token,
    and either the chunk's reference store written to `path` plus each token's argmax (`write`, the KLD
    reference) or each token's exact KL(P_ref || P_dep) against the store at `path` and whether its argmax
    is the reference's (every other deployment). Streams block by block."""
    n = len(chunk) - first
    nll = np.empty(n)
    argmax = np.empty(n, dtype=np.int64)
    ids = np.zeros((n, top_k), dtype=np.int64)
    lps = np.zeros((n, top_k))
    kld = np.empty(n)
    same = np.zeros(n, dtype=bool)
    writer = DistributionWriter(path, vocab=vocab, token_ids=chunk, first=first, meta=meta) if write else None
    reader = None if write else DistributionReader(path, vocab=vocab, token_ids=chunk, first=first)
    ref_tokens = iter(reader) if reader is not None else None
    done = 0
    try:
        for start, rows in distributions(chunk, first):
            if rows.shape[1] != vocab:
                raise StoreMismatch(str(path), f"the engine gave {rows.shape[1]} log-probs per token, its vocabulary has {vocab}")
            m = rows.shape[0]
            if done + m > n:
                raise ValueError(f"engine gave more than {n} distributions for {n} scored tokens")
            b_nll, b_ids, b_lps = nll_and_topk(rows, chunk[start : start + m], max(top_k, 1), normalized=True)
            nll[done : done + m] = b_nll
            argmax[done : done + m] = b_ids[:, 0]
            if top_k:
                ids[done : done + m], lps[done : done + m] = b_ids[:, :top_k], b_lps[:, :top_k]
            if writer is not None:
                writer.write_rows(rows)
            if ref_tokens is not None:
                for j, row in enumerate(rows):
                    ref = next(ref_tokens)
                    kld[done + j] = kld_against(ref, row)
                    same[done + j] = ref.argmax == b_ids[j, 0]
            done += m
        if done != n:
            raise ValueError(f"engine gave {done} distributions for {n} scored tokens")
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if reader is not None:
            reader.close()
    extra: dict[str, Any] = {"ids": ids, "lps": lps} if top_k else {}
    if writer is not None:
        writer.close()
        scalars, side = _arrays(chunk, first, nll, top_k, vocab, argmax=argmax, **extra)
        scalars["store_bytes"] = writer.bytes
        return scalars, side
    return _arrays(chunk, first, nll, top_k, vocab, kld=kld, same_top=same, **extra)


def score_chunk(engine: Engine, chunk: list[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
    """NLL and top-k [[id, logprob], ...] of chunk[first:], each predicted from its prefix in the chunk
    (`Engine.score_span`: llama.cpp computes logits only for the scored rows; the default slices `score`),
    with the log-probs rounded for the records."""
    nll, top = engine.score_span(chunk, first, top_k)
    top = [[[int(t), round(float(lp), LOGPROB_DECIMALS)] for t, lp in row] for row in top]
    return [float(x) for x in nll], top


# -- scoring helpers (records only) ------------------------------------------------------------


def _dump(fields: dict[str, Any]) -> dict[str, Any]:
    """A records line built through the suite's record type (evalkit.records.PerplexityRecord)."""
    return dump_record(PerplexityRecord(**fields))


@dataclass
class _Chunks:
    """One deployment's scored chunks: the (small) records by item id and each chunk's NLL (float64). The
    per-token arrays stay in the side files; pairing reads them one chunk at a time."""

    records: dict[str, PerplexityRecord]
    nll: dict[str, np.ndarray]
    run_dir: Path | None
    where: str

    @classmethod
    def of(cls, records: list[Any], run_dir: Path | None, dep: str) -> "_Chunks":
        parsed = typed({"": records})[""]
        recs = {r.item_id: r for r in parsed if isinstance(r, PerplexityRecord) and r.scored}
        where = f"records/{dep}.jsonl"
        chunks = cls(dict(sorted(recs.items())), {}, run_dir, where)
        chunks.nll = {cid: np.asarray(chunks.arrays(cid)["nll"], dtype=np.float64) for cid in chunks.records}
        return chunks

    @property
    def ids(self) -> list[str]:
        return list(self.records)

    def arrays(self, cid: str) -> np.ndarray:
        return token_arrays(self.records[cid], self.run_dir, self.where)

    def tokens_key(self, cid: str) -> tuple[str, int | None]:
        """What must be equal for two deployments' chunks to pair: the chunk's token ids and scored_from."""
        r = self.records[cid]
        return (r.tokens_sha256 or tokens_sha256(r.token_ids or []), r.scored_from)

    def ppl(self, ids: list[str] | None = None) -> PplStats:
        ids = self.ids if ids is None else ids
        nll = np.concatenate([self.nll[c] for c in ids]) if ids else np.zeros(0)
        return perplexity_stats(nll, sum(int(self.records[c].n_bytes or 0) for c in ids))

    def __bool__(self) -> bool:
        return bool(self.records)


def _ordered(chunks: dict[str, Any], ctx: ScoreContext) -> list[str]:
    known = [d for d in ctx.deployments if d in chunks and chunks[d]]
    return known + sorted(d for d in chunks if d not in known and chunks[d])


def _ppl_rows(dep: str, suite: str, st: PplStats, alpha: float) -> list[ScoreRow]:
    z = z_value(alpha)

    def row(metric: str, value: float, se: float | None) -> ScoreRow:
        lo, hi = (value - z * se, value + z * se) if se is not None and math.isfinite(se) else (None, None)
        return ScoreRow(dep, suite, CATEGORY, metric, value, lo, hi, st.n_tokens)

    return [
        row("ppl", st.ppl, st.ppl_se),
        row("nll_mean", st.nll_mean, st.nll_se),
        row("bits_per_byte", st.bits_per_byte, st.bpb_se),
        row("n_tokens", float(st.n_tokens), None),
        row("n_bytes", float(st.n_bytes), None),
    ]


def _drift_rows(dep: str, suite: str, d: DriftSummary, extra: list[tuple[str, float, float | None]],
                alpha: float) -> list[ScoreRow]:
    n = d.n_tokens
    z = z_value(alpha)
    ci = lambda v, se: (v - z * se, v + z * se) if math.isfinite(se) else (None, None)  # noqa: E731
    rows = [ScoreRow(dep, suite, CATEGORY, "kld_mean", d.kld_mean, *ci(d.kld_mean, d.kld_se), n)]
    # llama.cpp's whole statistics block: KLD max / percentiles / min, Δp mean / RMS / max / percentiles / min.
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_max", d.kld_max, None, None, n))
    rows += [ScoreRow(dep, suite, CATEGORY, f"kld_{name}", v, None, None, n) for name, v in d.kld_percentiles.items()]
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_min", d.kld_min, None, None, n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_exact", float(d.exact), None, None, n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "top1_agreement", d.same_top, d.same_top_ci[0], d.same_top_ci[1], n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_mean", d.delta_p_mean, *ci(d.delta_p_mean, d.delta_p_se), n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_rms", d.delta_p_rms, *ci(d.delta_p_rms, d.delta_p_rms_se), n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_max", d.delta_p_max, None, None, n))
    rows += [ScoreRow(dep, suite, CATEGORY, f"delta_p_{name}", v, None, None, n) for name, v in d.delta_p_percentiles.items()]
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_min", d.delta_p_min, None, None, n))
    for metric, value, se in extra:
        rows.append(ScoreRow(dep, suite, CATEGORY, metric, value, *(ci(value, se) if se is not None else (None, None)), n))
    return rows


@dataclass
class _Pair:
    """A deployment's chunks lined up with the reference's: paired when the token ids are identical."""

    ref: "_Chunks"
    dep: "_Chunks"
    ref_ids: list[str]  # the chunks used on each side (the shared ones when paired)
    dep_ids: list[str]
    reason: str | None  # why KLD / paired PPL is not computed, or None
    per_chunk: dict[str, Any]  # item_id -> TokenDrift
    drift: DriftSummary | None
    top_k: int
    # Exact pairs: how far the top-k + tail bound at this k reads below the exact mean KLD (1 - bound/exact).
    bound_bias: float | None = None

    @property
    def n_tokens(self) -> int:
        return sum(int(self.dep.nll[c].size) for c in self.dep_ids)

    def nll(self) -> tuple[np.ndarray, np.ndarray]:
        cat = lambda c, ids: np.concatenate([c.nll[i] for i in ids]) if ids else np.zeros(0)  # noqa: E731
        return cat(self.dep, self.dep_ids), cat(self.ref, self.ref_ids)

    def ratio_rows(self) -> list[tuple[str, float, float | None]]:
        """llama.cpp's "Perplexity statistics" block beside the deployment's own PPL."""
        p = paired_perplexity(*self.nll())
        return [
            ("ppl_ratio", p.ratio, p.ratio_se), ("ln_ppl_ratio", p.ln_ratio, p.ln_ratio_se),
            ("ppl_diff", p.diff, p.diff_se), ("nll_correlation", p.correlation, None),
        ]

    def bias_rows(self) -> list[tuple[str, float, float | None]]:
        return [("kld_bound_bias", self.bound_bias, None)] if self.bound_bias is not None else []

    def comparison_rows(self, dep: str, ref: str, suite: str, alpha: float) -> list[ComparisonRow]:
        # Significance, as everywhere: the (1 - alpha) interval of the difference excludes 0.
        z = z_value(alpha)
        if self.reason is not None:
            return self._unpaired_rows(dep, ref, suite, z)
        q, b = self.nll()
        n = int(q.size)
        p = paired_perplexity(q, b)
        if p.ln_ratio_se > 0:
            p_value = normal_two_sided_p(p.ln_ratio / p.ln_ratio_se)
        else:  # identical per-token NLL differences: no noise to test against
            p_value = 1.0 if p.ln_ratio == 0 else 0.0
        lo, hi = p.diff - z * p.diff_se, p.diff + z * p.diff_se
        ppl_q, ppl_b = math.exp(fsum_mean(q)), math.exp(fsum_mean(b))
        rows = [ComparisonRow(
            dep, ref, suite, CATEGORY, "ppl", ppl_q, ppl_b, p.diff, lo, hi, p_value, n,
            f"paired over {n} tokens: PPL(Q)-PPL(ref) ± z SE with the NLL covariance (llama-perplexity); "
            f"p: z-test of ln(PPL ratio)", excludes_zero(lo, hi),
        )]
        n_bytes = sum(int(self.ref.records[c].n_bytes or 0) for c in self.ref_ids)
        d = q - b
        bpb_diff = fsum(d) / (math.log(2) * n_bytes)
        bpb_se = sample_sd(d, fsum_mean(d)) * math.sqrt(n) / (math.log(2) * n_bytes) if n > 1 else math.nan
        dep_bpb = self.dep.ppl(self.dep_ids).bits_per_byte
        ref_bpb = self.ref.ppl(self.ref_ids).bits_per_byte
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "bits_per_byte", dep_bpb, ref_bpb, bpb_diff,
            bpb_diff - z * bpb_se, bpb_diff + z * bpb_se, p_value, n,
            f"paired over {n} tokens: SE of per-token NLL differences; p as for ppl",
            excludes_zero(bpb_diff - z * bpb_se, bpb_diff + z * bpb_se),
        ))
        return rows + (self.drift_comparison_rows(dep, ref, suite, z) if self.drift is not None else [])

    def drift_comparison_rows(self, dep: str, ref: str, suite: str, z: float) -> list[ComparisonRow]:
        """KLD and top-1 agreement of `dep` against `ref` (whose distributions or top-k it was measured with)."""
        assert self.drift is not None
        k = self.drift
        rows: list[ComparisonRow] = []
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "kld", k.kld_mean, 0.0, k.kld_mean,
            k.kld_mean - z * k.kld_se, k.kld_mean + z * k.kld_se, None, k.n_tokens,
            f"mean KL(ref||dep) over {k.n_tokens} tokens ± z SE over tokens; "
            + ("exact over the full vocabulary" if k.exact else f"top-{self.top_k}+tail approximation (a lower bound)"), excludes_zero(k.kld_mean - z * k.kld_se, k.kld_mean + z * k.kld_se),
        ))
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "top1_agreement", k.same_top, 1.0, k.same_top - 1.0,
            k.same_top_ci[0] - 1.0, k.same_top_ci[1] - 1.0, None, k.n_tokens,
            "share of scored tokens where both argmaxes agree; CI: Wilson 95%", bool(k.same_top_ci[1] < 1.0),
        ))
        return rows

    def _unpaired_rows(self, dep: str, ref: str, suite: str, z: float) -> list[ComparisonRow]:
        nan = math.nan
        rows = [ComparisonRow(dep, ref, suite, CATEGORY, "kld", nan, 0.0, nan, None, None, None, 0,
                              f"not computed: {self.reason}", False)]
        if not self.ref_ids or not self.dep_ids:
            return rows
        a, b = self.dep.ppl(self.dep_ids), self.ref.ppl(self.ref_ids)
        diff = a.bits_per_byte - b.bits_per_byte
        se = math.hypot(a.bpb_se, b.bpb_se)  # independent samples: the texts were cut differently
        p_value = normal_two_sided_p(diff / se) if se > 0 else nan
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "bits_per_byte", a.bits_per_byte, b.bits_per_byte, diff,
            diff - z * se, diff + z * se, p_value, a.n_tokens + b.n_tokens,
            f"unpaired ({self.reason}): ± z sqrt(SE_dep² + SE_ref²); PPL not compared across tokenizations",
            excludes_zero(diff - z * se, diff + z * se),
        ))
        return rows


DRIFT_METRICS = ("kld", "top1_agreement")


@dataclass
class _Pairs:
    """One deployment's pairings: `ppl` with the run's reference (paired PPL, and the top-k bound), `kld` the
    one whose drift is reported (exact against `kld_reference`'s stored distributions where the records were
    measured so, else `ppl`)."""

    ppl: _Pair | None
    kld: _Pair | None
    kld_reference: str

    @property
    def exact(self) -> bool:
        return self.kld is not None and self.kld.drift is not None and self.kld.drift.exact


def _pairs(chunks: dict[str, "_Chunks"], ctx: ScoreContext) -> dict[str, _Pairs]:
    ref = ctx.reference
    out: dict[str, _Pairs] = {}
    for dep in _ordered(chunks, ctx):
        owners = {r.kld_reference for r in chunks[dep].records.values()}
        owner = owners.pop() if len(owners) == 1 else None
        exact = _pair(chunks[owner], chunks[dep], owner) if owner is not None and owner not in (dep, ref) and chunks.get(owner) else None
        if exact is not None and not (exact.drift is not None and exact.drift.exact):
            exact = None
        # With exact KLD elsewhere, the pair with the reference serves paired PPL only: its top-k drift (the
        # slow part of scoring at a large top_k) is not computed.
        ppl = _pair(chunks[ref], chunks[dep], ref, drift=exact is None) if dep != ref and chunks.get(ref) else None
        out[dep] = _Pairs(ppl, exact, owner) if exact is not None else _Pairs(ppl, ppl, ref)  # type: ignore[arg-type]
    return out


def same_weights(manifest: dict[str, Any], a: str, b: str) -> bool:
    """True when the manifest fingerprinted the same model files for deployments `a` and `b`."""
    deps = manifest.get("deployments") or {}
    sha = [(deps.get(n) or {}).get("sha256") for n in (a, b)]
    return sha[0] is not None and sha[0] == sha[1]


def _same_weights_rows(dep: str, bound: DriftSummary, exact: dict[str, _Pairs], ctx: ScoreContext
                       ) -> list[tuple[str, float, float | None]]:
    """For a deployment with only the top-k bound (vLLM): the exact KLD another engine measured in this run
    on the same weights against a reference of the same weights, and how far the bound reads below it."""
    for other, p in exact.items():
        if other == dep or not (same_weights(ctx.manifest, dep, other) and same_weights(ctx.manifest, ctx.reference, p.kld_reference)):
            continue
        value = p.kld.drift.kld_mean  # type: ignore[union-attr]
        if value > 0:
            return [("kld_same_weights_exact", value, None), ("kld_bound_reads_below", 1.0 - bound.kld_mean / value, None)]
    return []


def _pair(ref_c: "_Chunks", dep_c: "_Chunks", reference: str, drift: bool = True) -> _Pair:
    """Line up chunks present for both; KLD needs every shared chunk's token ids to be identical (`drift`
    False: paired PPL only, no KLD). Side files are read one chunk pair at a time."""
    shared = sorted(set(ref_c.records) & set(dep_c.records))
    top_k = min((int(r.top_k if r.top_k is not None else (len(r.top[0]) if r.top else 0))
                 for c in (ref_c, dep_c) for r in c.records.values()), default=0)
    reason = None
    if not shared:
        reason = "no chunks in common with the reference"
    elif any(ref_c.tokens_key(c) != dep_c.tokens_key(c) for c in shared):
        reason = "mismatched tokenization (chunk token ids differ from the reference's)"
    if reason is not None or not drift:
        ids = (ref_c.ids, dep_c.ids) if reason is not None else (shared, shared)
        return _Pair(ref_c, dep_c, ids[0], ids[1], reason, {}, None, top_k)
    bound: dict[str, TokenDrift] = {}
    per_chunk: dict[str, TokenDrift] = {}
    exact = True
    for c in shared:
        ra, da = ref_c.arrays(c), dep_c.arrays(c)
        b = _bound_chunk(ra, da)
        if b is not None:
            bound[c] = b
        # Exact only when every shared chunk was measured against the stored reference distributions.
        rec = dep_c.records[c]
        names = da.dtype.names or ()
        if exact and "kld" in names and ("same_top" in names or ("argmax" in names and "argmax" in (ra.dtype.names or ())))\
                and (rec.kld_reference or reference) == reference:
            delta_p = np.exp(-dep_c.nll[c]) - np.exp(-ref_c.nll[c])
            same = da["same_top"].astype(bool) if "same_top" in names else np.asarray(da["argmax"]) == np.asarray(ra["argmax"])
            per_chunk[c] = TokenDrift(np.asarray(da["kld"], dtype=np.float64), np.asarray(same), delta_p)
        else:
            exact = False
    complete_bound = len(bound) == len(shared)
    if not exact:
        if not complete_bound:  # no top-k on a side (a v2 exact-KLD deployment or KLD reference keeps none)
            return _Pair(ref_c, dep_c, shared, shared, None, {}, None, top_k)
        return _Pair(ref_c, dep_c, shared, shared, None, bound, summarize_drift(_concat([bound[c] for c in shared])), top_k)
    summary = summarize_drift(_concat([per_chunk[c] for c in shared]), exact=True)
    bias = None
    if complete_bound and top_k and summary.kld_mean > 0:
        bias = 1.0 - fsum_mean(_concat([bound[c] for c in shared]).kld) / summary.kld_mean
    return _Pair(ref_c, dep_c, shared, shared, None, per_chunk, summary, top_k, bias)


def _bound_chunk(ra: np.ndarray, da: np.ndarray) -> TokenDrift | None:
    """The top-k + tail bound of one chunk from both sides' side-file arrays (None: a side kept no top-k)."""
    if not all("top_ids" in (a.dtype.names or ()) and a.dtype["top_ids"].shape and a.dtype["top_ids"].shape[0] > 0 for a in (ra, da)):
        return None
    return token_drift_arrays(np.asarray(ra["token"]), np.asarray(ra["nll"], dtype=np.float64), np.asarray(da["nll"], dtype=np.float64),
                              np.asarray(ra["top_ids"]), np.asarray(ra["top_lp"]), np.asarray(da["top_ids"]), np.asarray(da["top_lp"]))


def _concat(drifts: list[Any]) -> TokenDrift:
    return TokenDrift(
        np.concatenate([d.kld for d in drifts]) if drifts else np.zeros(0),
        np.concatenate([d.same_top for d in drifts]) if drifts else np.zeros(0, dtype=bool),
        np.concatenate([d.delta_p for d in drifts]) if drifts else np.zeros(0),
    )


# -- the suite's declaration (evalkit/suites/spec.py) -----------------------------------------------------

METRICS = (
    MetricSpec("perplexity", "ppl", "perplexity", "lower", "continuous", "num", "paired_bootstrap", "exp(mean NLL) over scored tokens"),
    MetricSpec("perplexity", "nll_mean", "nats/token", "lower", "continuous", "num", "none"),
    MetricSpec("perplexity", "bits_per_byte", "bits/byte", "lower", "continuous", "num", "paired_bootstrap"),
    MetricSpec("perplexity", "n_tokens", "tokens", "none", "count", "count", "none"),
    MetricSpec("perplexity", "n_bytes", "bytes", "none", "count", "count", "none"),
    MetricSpec("perplexity", "kld", "nats/token", "lower", "continuous", "kld", "none", "mean KL(ref||dep); its value is the difference"),
    MetricSpec("perplexity", "kld_mean", "nats/token", "lower", "continuous", "kld", "none"),
    # llama.cpp's KLD block: max, percentiles 99.9 .. 0.1 (kld_p99_9 = 99.9%), median, min.
    *[MetricSpec("perplexity", f"kld_{q}", "nats/token", "lower", "continuous", "kld", "none", f"{q} of per-token KLD")
      for q in ("max", "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0_1", "min")],
    MetricSpec("perplexity", "kld_exact", "flag", "none", "count", "count", "none",
       "1: KLD exact over the full vocabulary; 0: top-k + tail lower bound"),
    MetricSpec("perplexity", "kld_bound_bias", "share", "none", "continuous", "pct", "none",
       "how far the top-k + tail bound at the run's top_k reads below the exact mean KLD (1 - bound/exact)"),
    MetricSpec("perplexity", "kld_same_weights_exact", "nats/token", "none", "continuous", "kld", "none",
       "a bound deployment's weights: the exact mean KLD another engine measured on them in the same run"),
    MetricSpec("perplexity", "kld_bound_reads_below", "share", "none", "continuous", "pct", "none",
       "how far a bound deployment's KLD reads below the exact value measured on the same weights (1 - bound/exact)"),
    MetricSpec("perplexity", "top1_agreement", "share", "higher", "rate", "pct", "none", "both argmaxes agree"),
    MetricSpec("perplexity", "delta_p_mean", "probability", "none", "continuous", "num", "none", "p_dep - p_ref of the correct token"),
    MetricSpec("perplexity", "delta_p_rms", "probability", "lower", "continuous", "kld", "none"),
    # llama.cpp's token probability block: Δp max, percentiles 99.9 .. 0.1, median, min.
    *[MetricSpec("perplexity", f"delta_p_{q}", "probability", "none", "continuous", "num", "none", f"{q} of per-token Δp")
      for q in ("max", "p99_9", "p99", "p95", "p90", "p75", "median", "p25", "p10", "p5", "p1", "p0_1", "min")],
    MetricSpec("perplexity", "ppl_diff", "perplexity", "lower", "continuous", "num", "none", "PPL(dep) - PPL(ref), paired ±"),
    MetricSpec("perplexity", "nll_correlation", "correlation", "higher", "continuous", "num", "none",
       "Cor(ln PPL(dep), ln PPL(ref)) of the per-token NLLs, as llama.cpp"),
    MetricSpec("perplexity", "ppl_ratio", "ratio", "lower", "continuous", "num", "none", "PPL(dep) / PPL(ref)"),
    MetricSpec("perplexity", "ln_ppl_ratio", "nats/token", "lower", "continuous", "num", "none"),
)


def _check_kld_reference(settings: PerplexitySettings, config: Any) -> None:
    """`suites.perplexity.kld_reference` names a deployment that gives full distributions and runs perplexity."""
    name = settings.kld_reference
    if name is None:
        return
    names = [d.name for d in config.deployments]
    where = "suites.perplexity.kld_reference"
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        raise ValueError(f"{where}: {name!r} is not a deployment name" + (f" (did you mean {close[0]!r}?)" if close else ""))
    dep = config.deployment(name)
    if not gives_full_distributions(dep.engine):
        full = [d.name for d in config.deployments if gives_full_distributions(d.engine)]
        hint = f" (deployments that do: {', '.join(full)})" if full else ""
        raise ValueError(f"{where}: {name} runs on engine {dep.engine}, which gives no full next-token "
                         f"distributions, so exact KLD cannot be measured against it{hint}")
    if not dep.runs("perplexity"):
        raise ValueError(f"{where}: {name} does not run the perplexity suite (its suites: list)")


def _check_plan(suite: Suite[Any], items: list[Any], config: Any, config_file: Path) -> None:
    """The text fills at least one chunk, and no deployment's context is shorter than a chunk."""
    n_ctx = suite.settings.n_ctx
    if not items:
        # A token covers at least one byte (+2 for BOS and a space prefix): fewer bytes can't fill one chunk.
        path = resolve_data_path(suite.settings.text, suite.config_file)
        raise DataError(str(path), f"perplexity text is too short for one chunk of n_ctx={n_ctx} tokens")
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        if not dep.runs(suite.name):
            continue
        spec = engine_spec(dep.engine)
        context = spec.context_of(dep.options)
        if context and n_ctx > context:
            raise ConfigError(
                str(config_file),
                f"suites.perplexity.n_ctx={n_ctx} exceeds deployment {dep.name}'s context ({context} tokens, "
                f"options.{spec.context_option})",
            )


def _viewer_cell(rec: PerplexityRecord) -> ItemCell:
    if rec.skipped:
        return ItemCell(f"skipped: {rec.skipped}", None, -1, prompt="(past the end of the text)")
    # Token ids come from records.token_arrays on the item page (the scored tokens; v2 keeps them in a side file).
    return ItemCell("", None, -1, {"n_ctx": rec.n_ctx}, prompt=f"(perplexity chunk {rec.chunk_index}: {rec.n_ctx} tokens of the text)")


def _token_ids(rec: PerplexityRecord, run_dir: Path) -> Any:
    """The scored token ids of a chunk (records v2: from its side file; v1: inline)."""
    if not rec.scored:
        return None
    arrays = token_arrays(rec, run_dir)
    return arrays["token"] if "token" in (arrays.dtype.names or ()) else None


SPEC = SuiteSpec(
    name="perplexity",
    settings_model=PerplexitySettings,
    suite_class=PerplexitySuite,
    records=(PerplexityRecord,),
    metrics=METRICS,
    title="Perplexity and distribution drift",
    report="evalkit.suites.report.perplexity:section",
    verdict="evalkit.suites.report.perplexity:verdict_columns",
    viewer=ViewerSpec(cell=_viewer_cell, word_diff=False, token_ids=_token_ids, value_metric="ppl",
                      figures=(("ppl", "ppl", "{:.4g}"), ("kld_mean", "KLD", "{:.3g}"), ("top1_agreement", "top-1", "{:.1%}"),
                               ("bits_per_byte", "bpb", "{:.4g}"))),
    check=_check_plan,
    config_check=_check_kld_reference,
)
