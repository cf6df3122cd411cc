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

import hashlib
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from evalkit.config import resolve_data_path
from evalkit.engines import gives_full_distributions
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import ConfigError, DataError
from evalkit.metrics.kld import FORMAT_VERSION as KLD_FORMAT
from evalkit.metrics.kld import DistributionReader, DistributionWriter, StoreMismatch, bytes_per_token_bound, kld_against
from evalkit.metrics.likelihood import (
    DELTA_P_PERCENTILES,
    KLD_PERCENTILES,
    nll_and_topk,
    DriftSummary,
    PplStats,
    TokenDrift,
    paired_perplexity,
    perplexity_stats,
    summarize_drift,
    token_drift,
)
from evalkit.metrics.stats import excludes_zero, normal_two_sided_p, z_value
from evalkit.records import PerplexityRecord, call_provenance, dump_record, typed, utc_now
from evalkit.store import MANIFEST, ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites.base import Emit, Item, ScoreContext, Suite

if TYPE_CHECKING:  # the settings model of this suite (config `suites.perplexity`)
    from evalkit.config import PerplexitySettings

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

    def runs_after(self, deployment: str, spec: Any) -> frozenset[str]:
        """A deployment that gives full distributions reads the KLD reference's store: it runs after it."""
        owner = self.kld_owner()
        if owner is None or deployment == owner or not gives_full_distributions(spec.engine):
            return frozenset()
        return frozenset({owner})

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
        # In a configured run the KLD reference stores every chunk before a reader runs (the executors order
        # units by `runs_after`); a chunk whose store is missing (that reference failed) stays pending, so a
        # resumed run measures it exactly instead of recording the bound for good. A Ray node that does not
        # see the run directory (no shared filesystem) cannot read the store: it records the bound.
        must_read = (self.config is not None and distributions is not None and store is not None and not is_reference
                     and (binding.run_dir / MANIFEST).is_file())  # type: ignore[union-attr]
        waiting: list[str] = []
        for item in items:
            index = int(item.data["index"])
            base = {"suite": self.name, "item_id": item.item_id, "category": CATEGORY}
            if index >= n_chunks:
                emit([_dump({**base, "skipped": f"past the end of the text ({n_chunks} chunks of {s.n_ctx} tokens)"})])
                continue
            start = time.perf_counter()
            chunk = list(tokens[index * s.n_ctx : (index + 1) * s.n_ctx])
            if bos is not None:
                chunk[0] = bos
            extra: dict[str, Any] = {}
            path = store / f"{item.item_id}{STORE_SUFFIX}" if store is not None else None
            if must_read and path is not None and not path.is_file():
                waiting.append(item.item_id)
                continue
            if distributions is not None and path is not None and (is_reference or path.is_file()):
                full = cached_chunk_full(engine, distributions, chunk, first, s.top_k, info.vocab_size, path,
                                         write=is_reference, meta={"deployment": binding.deployment})  # type: ignore[union-attr]
                nll, top, hit = full.pop("nll"), full.pop("top"), bool(full.pop("cached", False))
                stamp = full.pop("measured_at", None)  # None: a stored measurement from before it kept the time
                extra = {**full, **({"kld_reference": owner} if "kld" in full else {})}
                prov = {"cached": hit, "measured_at": stamp if hit else stamp or utc_now()}
            else:
                nll, top = score_chunk(engine, chunk, first, s.top_k)
                prov = call_provenance(engine, 1)[0]
            score_s = time.perf_counter() - start
            emit([_dump({
                **base,
                "chunk_index": index,
                "n_ctx": s.n_ctx,
                "token_ids": chunk,
                "bos_replaced": bos is not None,
                "scored_from": first,
                "nll": nll,
                "top_k": s.top_k,
                "top": top,
                "n_bytes": len(engine.detokenize(chunk[first:]).encode("utf-8")),
                "n_text_tokens": len(tokens),
                "text_sha256": text_sha,
                **extra,
                "timings": {"score_s": score_s, "total_s": time.perf_counter() - start},
                **prov,
            })])
        if waiting:
            print(f"evalkit: perplexity: {len(waiting)} chunk(s) left pending ({', '.join(waiting)}): the KLD reference "
                  f"{owner} has not stored their distributions (it did not finish); --resume measures them",
                  file=sys.stderr, flush=True)

    # -- scoring --------------------------------------------------------------------------------

    def _scored(self, records: Any, ctx: ScoreContext) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, "_Pairs"]]:
        """Chunks and pairings of one scoring pass. score, compare and item_rows get the same `records` and
        `ctx` objects, and pairing top-k lists takes seconds per deployment at a large top_k: done once."""
        kept = getattr(self, "_scored_pass", None)
        if kept is not None and kept[0] is records and kept[1] is ctx:
            return kept[2], kept[3]
        chunks = {dep: _chunks(recs) for dep, recs in records.items()}
        pairs = _pairs(chunks, ctx)
        self._scored_pass = (records, ctx, chunks, pairs)
        return chunks, pairs

    def score(self, records: dict[str, list[dict[str, Any]]], ctx: ScoreContext) -> list[ScoreRow]:
        rows: list[ScoreRow] = []
        chunks, pairs = self._scored(records, ctx)
        exact = {dep: p for dep, p in pairs.items() if p.exact}
        for dep in _ordered(chunks, ctx):
            st = _ppl(chunks[dep].values())
            rows += _ppl_rows(dep, self.name, st, ctx.stats.alpha)
            p = pairs[dep]
            if p.kld is None or p.kld.drift is None:
                continue
            extra = p.ppl.ratio_rows() if p.ppl is not None and p.ppl.reason is None else []
            extra += p.kld.bias_rows()
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
            for cid, rec in sorted(chunks[dep].items()):
                st = perplexity_stats(rec["nll"], rec["n_bytes"])
                row: dict[str, Any] = {
                    "item_id": cid, "deployment": dep, "category": CATEGORY, "n_scored": st.n_tokens,
                    "nll_mean": st.nll_mean, "ppl": st.ppl, "bits_per_byte": st.bits_per_byte,
                    "score_s": rec.get("timings", {}).get("score_s"),
                }
                if pair is not None and pair.drift is not None and cid in pair.per_chunk:
                    d = pair.per_chunk[cid]
                    row.update(kld_mean=float(np.mean(d.kld)), kld_max=float(np.max(d.kld)),
                               top1_agreement=float(np.mean(d.same_top)), delta_p_mean=float(np.mean(d.delta_p)))
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


def store_dir(run_dir: Path, reference: str) -> Path:
    return run_dir / STORE_DIR / reference


def store_bytes_upper_bound(n_tokens: int, vocab: int) -> int:
    """Most bytes the reference's store can take for `n_tokens` scored tokens (the dense layout: llama.cpp's
    2 bytes per vocabulary id); the bitmap layout takes less whenever the distribution has a long tail."""
    return n_tokens * bytes_per_token_bound(vocab)


def plan_store_note(config: Any, config_file: Path) -> str | None:
    """The plan's lines on exact KLD, before anything runs: which deployments get it, against whose stored
    distributions and how large that store can get; which keep the top-k bound. None: perplexity is off."""
    from evalkit.ledger import _resolve, gguf_weights, hf_weights

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
    chunks = len(suite.items())  # upper bound from the text's bytes
    tokens = chunks * (s.n_ctx - scored_from(s.n_ctx))
    path = _resolve(ref.model.source, config_file)
    try:
        vocab = (hf_weights(path) if path.is_dir() else gguf_weights(path)).arch.vocab if path is not None else None
    except Exception:  # noqa: BLE001 - an unreadable model is the ledger's row to report, not this line's
        vocab = None
    if not vocab:
        lines.append(f"perplexity: {owner}'s store size is unknown (vocabulary of {ref.model.source} unknown)")
    else:
        most = store_bytes_upper_bound(tokens, vocab)
        lines.append(f"perplexity: {owner}'s stored distributions: at most {most / 1e9:.2f} GB in the run directory "
                     f"({tokens:,} scored tokens x {vocab:,} ids, 2 bytes each at most, as llama.cpp's base file; "
                     f"long-tailed distributions take less)")
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


def cached_chunk_full(
    engine: Engine, distributions: Distributions, chunk: list[int], first: int, top_k: int, vocab: int, path: Path, *,
    write: bool, meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`score_chunk_full` through the engine-result cache (when the engine has one), so a re-run does not load
    the model: the reference's store is kept in the cache too (content-addressed) and copied back into the
    run; a deployment's result is keyed by the exact reference store it was compared with."""
    lookup = getattr(engine, "measurement", None)
    keep = getattr(engine, "store_measurement", None)
    if lookup is None or keep is None:
        return score_chunk_full(distributions, chunk, first, top_k, vocab, path, write=write, meta=meta)
    payload: dict[str, Any] = {"token_ids": chunk, "first": first, "top_k": top_k, "store_format": KLD_FORMAT}
    if not write:
        payload["reference_store_sha256"] = _file_sha256(path)
    kind = "perplexity_reference_chunk" if write else "perplexity_kld_chunk"
    hit = lookup(kind, payload)
    kept = _kept_stores() / f"{hit.get('store_sha256')}{STORE_SUFFIX}" if write and isinstance(hit, dict) else None
    if isinstance(hit, dict) and (not write or (kept is not None and kept.is_file())):
        if kept is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.copy")
            shutil.copyfile(kept, tmp)
            os.replace(tmp, path)
        return {**hit, "cached": True}
    out = score_chunk_full(distributions, chunk, first, top_k, vocab, path, write=write, meta=meta)
    out["measured_at"] = utc_now()  # kept with the measurement: a re-run's record says when it was made
    if write:
        digest = _file_sha256(path)
        _kept_stores().mkdir(parents=True, exist_ok=True)
        tmp = _kept_stores() / f".{digest}.{os.getpid()}.tmp"
        shutil.copyfile(path, tmp)
        os.replace(tmp, _kept_stores() / f"{digest}{STORE_SUFFIX}")
        out["store_sha256"] = digest
    keep(kind, payload, out)
    return out


def _kept_stores() -> Path:
    from evalkit.models import cache_dir

    return cache_dir() / "kld-stores"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def score_chunk_full(
    distributions: Distributions, chunk: list[int], first: int, top_k: int, vocab: int, path: Path, *,
    write: bool, meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One teacher-forced pass with full distributions: NLL, top-k and argmax of every scored token, and
    either the chunk's reference store written to `path` (`write`, the reference) or each token's exact
    KL(P_ref || P_dep) against the store at `path` (every other deployment). Streams block by block."""
    nll: list[float] = []
    top: list[list[list[float]]] = []
    argmax: list[int] = []
    kld: list[float] = []
    ref_argmax: list[int] = []
    writer = DistributionWriter(path, vocab=vocab, token_ids=chunk, first=first, meta=meta) if write else None
    reader = None if write else DistributionReader(path, vocab=vocab, token_ids=chunk, first=first)
    ref_tokens = iter(reader) if reader is not None else None
    try:
        for start, rows in distributions(chunk, first):
            if rows.shape[1] != vocab:
                raise StoreMismatch(f"engine gave {rows.shape[1]} log-probs per token, its vocabulary has {vocab}")
            b_nll, ids, lps = nll_and_topk(rows, chunk[start : start + rows.shape[0]], max(top_k, 1), normalized=True)
            nll += b_nll.tolist()
            top += [[[int(t), round(float(lp), LOGPROB_DECIMALS)] for t, lp in zip(ti[:top_k], li[:top_k])]
                    for ti, li in zip(ids, lps)]
            argmax += ids[:, 0].tolist()
            if writer is not None:
                writer.write_rows(rows)
            if ref_tokens is not None:
                for row in rows:
                    ref = next(ref_tokens)
                    kld.append(kld_against(ref, row))
                    ref_argmax.append(ref.argmax)
        if len(nll) != len(chunk) - first:
            raise ValueError(f"engine gave {len(nll)} distributions for {len(chunk) - first} scored tokens")
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if reader is not None:
            reader.close()
    out: dict[str, Any] = {"nll": nll, "top": top, "argmax": argmax}
    if writer is not None:
        writer.close()
        out["store_bytes"] = writer.bytes
    else:
        out.update(kld=[float(f"{k:.9g}") for k in kld], ref_argmax=ref_argmax)
    return out


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


def _chunks(records: list[Any]) -> dict[str, dict[str, Any]]:
    """item_id -> record, for finished (not skipped) chunk records.

    Records are read through evalkit.records (parsed, older layouts upgraded); the helpers below work on
    their dict form.
    """
    parsed = typed({"": records})[""]
    return {r.item_id: r.model_dump(mode="json", exclude_none=True) for r in parsed if isinstance(r, PerplexityRecord) and r.scored}


def _ordered(chunks: dict[str, Any], ctx: ScoreContext) -> list[str]:
    known = [d for d in ctx.deployments if d in chunks and chunks[d]]
    return known + sorted(d for d in chunks if d not in known and chunks[d])


def _ppl(records: Any) -> PplStats:
    recs = sorted(records, key=lambda r: r["item_id"])
    nll = [x for r in recs for x in r["nll"]]
    return perplexity_stats(nll, sum(int(r["n_bytes"]) for r in recs))


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

    ref: list[dict[str, Any]]
    dep: list[dict[str, Any]]
    reason: str | None  # why KLD / paired PPL is not computed, or None
    per_chunk: dict[str, Any]  # item_id -> TokenDrift
    drift: DriftSummary | None
    top_k: int
    # Exact pairs: how far the top-k + tail bound at this k reads below the exact mean KLD (1 - bound/exact).
    bound_bias: float | None = None

    def nll(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([x for r in self.dep for x in r["nll"]]), np.array([x for r in self.ref for x in r["nll"]]))

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
        ppl_q, ppl_b = math.exp(q.mean()), math.exp(b.mean())
        rows = [ComparisonRow(
            dep, ref, suite, CATEGORY, "ppl", ppl_q, ppl_b, p.diff, lo, hi, p_value, n,
            f"paired over {n} tokens: PPL(Q)-PPL(ref) ± z SE with the NLL covariance (llama-perplexity); "
            f"p: z-test of ln(PPL ratio)", excludes_zero(lo, hi),
        )]
        n_bytes = sum(int(r["n_bytes"]) for r in self.ref)
        d = q - b
        bpb_diff = float(d.sum()) / (math.log(2) * n_bytes)
        bpb_se = float(d.std(ddof=1)) * math.sqrt(n) / (math.log(2) * n_bytes) if n > 1 else math.nan
        dep_bpb = _ppl(self.dep).bits_per_byte
        ref_bpb = _ppl(self.ref).bits_per_byte
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
        if not self.ref or not self.dep:
            return rows
        a, b = _ppl(self.dep), _ppl(self.ref)
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


def _pairs(chunks: dict[str, dict[str, dict[str, Any]]], ctx: ScoreContext) -> dict[str, _Pairs]:
    ref = ctx.reference
    out: dict[str, _Pairs] = {}
    for dep in _ordered(chunks, ctx):
        owners = {r.get("kld_reference") for r in chunks[dep].values()}
        owner = owners.pop() if len(owners) == 1 else None
        exact = _pair(chunks[owner], chunks[dep]) if owner is not None and owner not in (dep, ref) and chunks.get(owner) else None
        if exact is not None and not (exact.drift is not None and exact.drift.exact):
            exact = None
        # With exact KLD elsewhere, the pair with the reference serves paired PPL only: its top-k drift (the
        # slow part of scoring at a large top_k) is not computed.
        ppl = _pair(chunks[ref], chunks[dep], drift=exact is None) if dep != ref and chunks.get(ref) else None
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


def _pair(ref_chunks: dict[str, dict[str, Any]], dep_chunks: dict[str, dict[str, Any]], drift: bool = True) -> _Pair:
    """Line up chunks present for both; KLD needs every shared chunk's token ids to be identical (`drift`
    False: paired PPL only, no KLD)."""
    shared = sorted(set(ref_chunks) & set(dep_chunks))
    ref = [ref_chunks[c] for c in shared]
    dep = [dep_chunks[c] for c in shared]
    top_k = min((int(r.get("top_k", len(r["top"][0]) if r["top"] else 0)) for r in ref + dep), default=0)
    reason = None
    if not shared:
        reason = "no chunks in common with the reference"
        ref, dep = list(ref_chunks.values()), list(dep_chunks.values())
    elif any(r["token_ids"] != d["token_ids"] or r["scored_from"] != d["scored_from"] for r, d in zip(ref, dep)):
        reason = "mismatched tokenization (chunk token ids differ from the reference's)"
        ref, dep = list(ref_chunks.values()), list(dep_chunks.values())
    if reason is not None or not drift:
        return _Pair(ref, dep, reason, {}, None, top_k)
    bound = {c: token_drift(r["token_ids"][r["scored_from"]:], r["nll"], d["nll"], r["top"], d["top"])
             for c, r, d in zip(shared, ref, dep)}
    reference = ref[0].get("deployment")
    # Exact only when every shared chunk was measured against the stored reference distributions.
    exact = all("kld" in d and "argmax" in r and len(d["kld"]) == len(d["nll"])
                and d.get("kld_reference", reference) == reference for r, d in zip(ref, dep))
    if not exact:
        return _Pair(ref, dep, None, bound, summarize_drift(_concat(list(bound.values()))), top_k)
    per_chunk = {}
    for c, r, d in zip(shared, ref, dep):
        delta_p = np.exp(-np.asarray(d["nll"], dtype=np.float64)) - np.exp(-np.asarray(r["nll"], dtype=np.float64))
        same = np.asarray(d["argmax"]) == np.asarray(d.get("ref_argmax", r["argmax"]))
        per_chunk[c] = TokenDrift(np.asarray(d["kld"], dtype=np.float64), same, delta_p)
    drift = summarize_drift(_concat(list(per_chunk.values())), exact=True)
    bound_mean = float(np.mean(_concat(list(bound.values())).kld))
    bias = 1.0 - bound_mean / drift.kld_mean if top_k and drift.kld_mean > 0 else None
    return _Pair(ref, dep, None, per_chunk, drift, top_k, bias)


def _concat(drifts: list[Any]) -> TokenDrift:
    return TokenDrift(
        np.concatenate([d.kld for d in drifts]) if drifts else np.zeros(0),
        np.concatenate([d.same_top for d in drifts]) if drifts else np.zeros(0, dtype=bool),
        np.concatenate([d.delta_p for d in drifts]) if drifts else np.zeros(0),
    )
