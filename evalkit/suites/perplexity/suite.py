"""The perplexity suite: settings, running one deployment over the chunks, scoring from records."""
from __future__ import annotations

import hashlib
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evalkit.config import PositiveInt, resolve_data_path
from evalkit.engines import gives_full_distributions
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import ConfigError, DataError
from evalkit.metrics.kld import tokens_sha256
from evalkit.metrics.likelihood import (
    fsum_mean,
    perplexity_stats,
)
from evalkit.metrics.stats import z_value
from evalkit.records import dump_record
from evalkit.suites.perplexity.records import PerplexityRecord
from evalkit.store import MANIFEST, SIDE_KEY, ComparisonRow, ScoreRow
from evalkit.suites.base import Emit, Item, ScoreContext, Suite
from evalkit.suites.perplexity.chunking import CATEGORY, REQUIRES, chunk_count, chunk_id, scored_from
from evalkit.suites.perplexity.measure import ChunkSpan, Distributions, cached_chunk_full, cached_chunk_span, distribution_source
from evalkit.suites.perplexity.reference import bound_deployments, kld_reference, streaming_readers
from evalkit.suites.perplexity.scoring import (
    DRIFT_METRICS,
    Chunks,
    bound_looseness,
    Pairs,
    drift_rows,
    ordered,
    pair_deployments,
    position_drift,
    position_rows,
    ppl_rows,
    same_weights_rows,
)
from evalkit.suites.perplexity.stores import STORE_SUFFIX, reference_tokens_path, store_dir, write_reference_tokens
from evalkit.suites.perplexity.streaming import Streaming
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
    # Which positions of each chunk are scored: llama-perplexity's second half (its figures, comparable with its
    # output), or "all" (every token after the first: drift by position from the start of the context).
    positions: Literal["second_half", "all"] = "second_half"
    # Drift by position: the headline is the first position bucket whose top-1 agreement with the reference is
    # below this share.
    top1_threshold: float = Field(default=0.95, gt=0, lt=1)
    # Also compare each quantized-KV deployment with the run's deployment of the same weights and engine with a
    # 16-bit KV cache (evalkit.suites.perplexity.kvref): the KV cache's own effect, apart from the weights'.
    kv_reference: bool = False

    def first_scored(self) -> int:
        """Index in each chunk of the first scored token."""
        return scored_from(self.n_ctx, self.positions)


METHOD = (
    "llama-perplexity chunking (BOS per chunk, second half scored); PPL ± = SE of mean NLL over tokens "
    "(delta method); KLD(ref||dep) exact over the full vocabulary where the reference and the deployment "
    "both give full distributions (the reference's stored once per chunk, evalkit.metrics.kld), else per "
    "token from the reference's top-k ids + the correct token, the rest as one tail bucket (a lower bound)"
)


# Measured against exact full-vocabulary KLD (tests/test_perplexity.py; Gemma 3 270M, 262k vocabulary):
KLD_BIAS = (
    "the top-k+tail bound reads below the exact KLD; measured on the same weights (hf engine, fp8-weight vs bf16 "
    "Gemma 3 270M, WikiText-2, n_ctx 512): 31% low at k=20, 17% at 100, 7.7% at 500, 5.0% at 1000, 2.9% at 2000 "
    "(Q2_K-class drift loses more: ~50% at k=20); compare deployments at the same top_k"
)


@dataclass(frozen=True)
class ChunkPass:
    """What one deployment's pass over the chunks works with, decided once in `PerplexitySuite.run`."""

    tokens: list[int]  # the whole text's token ids (the KLD reference's, for a reader of its stores)
    n_chunks: int
    bos: int | None  # replaces each chunk's first token (None: the model adds no BOS)
    first: int  # index of the first scored token in a chunk
    distributions: Distributions | None  # the engine's full distributions (None: it gives none)
    store: Path | None  # the KLD reference's chunk stores (None: no exact KLD here)
    owner: str | None  # the KLD reference
    is_reference: bool  # this deployment writes the stores
    must_read: bool  # a reader that waits for each chunk's store (or leaves the chunk pending)
    top_k: int  # top-k log-probs kept per token
    text_sha: str
    stream: Streaming | None  # streaming exact KLD's side of this unit
    retokenized: frozenset[int] = frozenset()  # chunks scored on the KLD reference's tokens, not this deployment's


class PerplexitySuite(Suite["PerplexitySettings"]):
    name = "perplexity"
    requires = REQUIRES

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

    def text_path(self) -> Path:
        return resolve_data_path(self.settings.text, self.config_file)

    def text_bytes(self) -> bytes:
        """The text file's bytes, checked to be UTF-8 (the plans size a run from their count)."""
        path = self.text_path()
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

    def text(self) -> str:
        """The text as llama-perplexity reads it."""
        text = self.text_bytes().decode("utf-8")
        return text[:-1] if text.endswith("\n") else text  # llama-perplexity -f drops one trailing newline

    def items(self) -> list[Item]:
        """Chunk placeholders. The real count needs the deployment's tokenizer, so this is an upper
        bound (a token covers at least one byte; +2 for BOS and a space prefix); `run` writes a `skipped`
        record for placeholders past the end of the text so resume sees them done."""
        n_bytes = len(self.text_bytes())
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
        text = self.text()
        text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
        tokens = engine.tokenize(text, add_bos=True)
        n_chunks = chunk_count(len(tokens), s.n_ctx, s.max_chunks)
        if n_chunks == 0:
            raise DataError(str(self.text_path()), f"text has {len(tokens)} tokens, fewer than n_ctx={s.n_ctx}")
        bos = info.bos_token_id if info.add_bos else None
        first = s.first_scored()
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
                     and binding is not None and (binding.run_dir / MANIFEST).is_file())
        top_k = self.top_k_for(binding.deployment if binding is not None else None, full=distributions is not None)
        if info.top_k_limit is not None and top_k > info.top_k_limit:
            # A server gives at most its own limit (vLLM --max-logprobs, 20 unless set): ask no more; the actual
            # token's log-prob (PPL) does not depend on it, the KLD bound does.
            say(f"perplexity: {binding.deployment if binding is not None else info.engine}: the engine gives at most "
                f"top-{info.top_k_limit} log-probs per token, so its KLD is the top-{info.top_k_limit} + tail bound "
                f"({bound_looseness(info.top_k_limit)}), not top-{top_k}")
            top_k = info.top_k_limit
        stream = None
        # The driver's cache pass (executors/cached.py) answers what the cache holds and never waits on a peer.
        if (must_read or (is_reference and self.config is not None and store is not None)) and not self.cache_pass:
            stream = self._streaming(store)
        with stream if stream is not None else nullcontext():
            retokenized: frozenset[int] = frozenset()
            if is_reference and store is not None:
                write_reference_tokens(store, text_sha, tokens)
            elif must_read and store is not None:
                tokens, retokenized = self._reference_tokens(engine, tokens, store, text_sha, owner, stream)
                n_chunks = chunk_count(len(tokens), s.n_ctx, s.max_chunks)
            self._run_chunks(engine, items, emit, ChunkPass(tokens, n_chunks, bos, first, distributions, store, owner,
                                                            is_reference, must_read, top_k, text_sha, stream, retokenized))

    def _streaming(self, store: Path | None) -> Streaming | None:
        """Streaming exact KLD's side of this unit (None: not streaming, or a bare suite)."""
        window = self.settings.kld_window
        owner = self.kld_owner()
        if window is None or self.config is None or self.binding is None or store is None or owner is None:
            return None
        return Streaming(self.binding.run_dir, store, self.binding.deployment, owner, streaming_readers(self.config), int(window))

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
            who = self.binding.deployment if self.binding is not None else engine.info().model_path
            say(f"evalkit: perplexity: {who}: its tokenizer splits the text differently from the KLD reference "
                f"{owner}'s from token {at:,} on ({len(differ)} of {n} chunks differ): every chunk is scored on the "
                f"reference's tokens, so KLD and PPL compare the same tokens (llama-perplexity --kl-divergence does too)")
        return ref, differ

    def _run_chunks(self, engine: Engine, items: Sequence[Item], emit: Emit, p: ChunkPass) -> None:
        tokens, n_chunks, bos, first, distributions = p.tokens, p.n_chunks, p.bos, p.first, p.distributions
        store, owner, is_reference, must_read, top_k = p.store, p.owner, p.is_reference, p.must_read, p.top_k
        text_sha, stream, retokenized = p.text_sha, p.stream, p.retokenized
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
                    engine, distributions, ChunkSpan(chunk, first, top_k, info.vocab_size), path, write=is_reference,
                    meta={"deployment": binding.deployment if binding is not None else None}, streaming=stream is not None)
                if not is_reference:
                    scalars["kld_reference"] = owner
            else:
                # No full distributions here (or no store to read on this node): the top-k bound's inputs.
                # A reader that cannot see the store (a Ray node without the run directory) records the bound.
                k = s.top_k if (distributions is not None and store is not None and not is_reference) else top_k
                scalars, side, prov = cached_chunk_span(engine, ChunkSpan(chunk, first, k, info.vocab_size))
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

    def _scored(self, records: Any, ctx: ScoreContext) -> tuple[dict[str, "Chunks"], dict[str, "Pairs"]]:
        """Chunks and pairings of one scoring pass. score, compare and item_rows get the same `records` and
        `ctx` objects, and pairing reads every side file once: done once."""
        kept = getattr(self, "_scored_pass", None)
        if kept is not None and kept[0] is records and kept[1] is ctx:
            return kept[2], kept[3]
        run_dir = getattr(ctx, "run_dir", None)
        chunks = {dep: Chunks.of(recs, run_dir, dep) for dep, recs in records.items()}
        pairs = pair_deployments(chunks, ctx)
        self._scored_pass = (records, ctx, chunks, pairs)
        return chunks, pairs

    def score(self, records: Mapping[str, list[Any]], ctx: ScoreContext) -> list[ScoreRow]:
        rows: list[ScoreRow] = []
        chunks, pairs = self._scored(records, ctx)
        exact = {dep: p for dep, p in pairs.items() if p.exact}
        for dep in ordered(chunks, ctx):
            st = chunks[dep].ppl()
            rows += ppl_rows(dep, self.name, st, ctx.stats.alpha)
            p = pairs[dep]
            ratio = p.ppl.ratio_rows() if p.ppl is not None and p.ppl.reason is None else []
            if p.kld is None or p.kld.drift is None:
                # No KLD for this one (a v2 KLD reference stores no top-k, or the two sides come from two runs):
                # its PPL ratio still stands, with the interval it has beside a KLD (as drift_rows gives it).
                if p.ppl is not None and ratio and dep != ctx.reference:
                    z = z_value(ctx.stats.alpha)
                    for m, v, se in ratio:
                        lo, hi = (v - z * se, v + z * se) if se is not None and math.isfinite(se) else (None, None)
                        rows.append(ScoreRow(dep, self.name, CATEGORY, m, v, lo, hi, p.ppl.n_tokens))
                continue
            extra = ratio + p.kld.bias_rows()
            if not p.exact:
                extra += same_weights_rows(dep, p.kld.drift, exact, ctx)
            rows += drift_rows(dep, self.name, p.kld.drift, extra, ctx.stats.alpha)
            rows += position_rows(dep, self.name, position_drift(p.kld, ctx.stats.alpha), self.settings.top1_threshold)
        if self.settings.kv_reference:
            from evalkit.suites.perplexity.kvref import kv_reference_rows

            rows += kv_reference_rows(self.name, chunks, ctx, self.settings.top1_threshold)
        return rows

    def compare(self, records: Mapping[str, list[Any]], ctx: ScoreContext) -> list[ComparisonRow]:
        rows: list[ComparisonRow] = []
        alpha = ctx.stats.alpha
        for dep, p in self._scored(records, ctx)[1].items():
            if p.kld is not None and p.kld is not p.ppl and p.kld.drift is not None:
                # Exact KLD against the KLD reference's stored distributions; PPL stays paired with the run's reference.
                if p.ppl is not None:
                    rows += [r for r in p.ppl.comparison_rows(dep, ctx.reference, self.name, alpha) if r.metric not in DRIFT_METRICS]
                rows += p.kld.drift_comparison_rows(dep, p.kld_reference, self.name, alpha)
            elif p.ppl is not None:
                rows += p.ppl.comparison_rows(dep, ctx.reference, self.name, alpha)
        return rows

    def item_rows(self, records: Mapping[str, list[Any]], ctx: ScoreContext) -> list[dict[str, Any]]:
        chunks, pairs = self._scored(records, ctx)
        out = []
        for dep in ordered(chunks, ctx):
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
        data = self.text_bytes()
        return {
            "text": str(self.text_path()),
            "text_sha256": hashlib.sha256(data).hexdigest(),
            "text_bytes": len(data),
            "n_ctx": s.n_ctx,
            "max_chunks": s.max_chunks,
            "chunks_upper_bound": len(self.items()),
            "scored_positions": f"{s.first_scored()}..{s.n_ctx - 1} of each chunk",
            "top1_threshold": s.top1_threshold,
            "top_k": s.top_k,
            "bytes_of": "UTF-8 of engine.detokenize(scored tokens)",
            "ci": "95% normal: ±1.96 SE over tokens (llama-perplexity's ±); top-1 agreement: Wilson",
            "method": METHOD,
            "kld_bias": KLD_BIAS,
            "kld_reference": kld_reference(self.config) if self.config is not None else None,
        }


def _dump(fields: dict[str, Any]) -> dict[str, Any]:
    """A records line built through the suite's record type (evalkit.records.PerplexityRecord)."""
    return dump_record(PerplexityRecord(**fields))
