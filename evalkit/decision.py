"""The decision: which deployment to serve, on this hardware, for this load, and why.

Inputs are what scoring wrote (scores, comparisons) plus the memory plan at the stated workload; nothing
loads a model, so `evalkit report RUN` and a notebook can re-decide with other margins or workloads.

Per deployment and workload:
- quality: each configured margin tested for non-inferiority (evalkit/metrics/noninferiority.py); the
  reference qualifies on quality by definition (it is what "no loss" means);
- memory: the ledger's prediction with the context and concurrency set to the workload's (fits, per-device
  bytes, the longest context and the number of sequences memory holds);
- cost: output tokens/s and median time to first token at the workload's concurrency from the workload suite
  (the registry's suite whose metrics are a workload's limits, SuiteSpec.quality False; its figures are the metrics
  whose declaration names a `role`), measured at that level or interpolated linearly between the two measured levels around it (labelled);
  never extrapolated.

RULE (below) picks one deployment. When none qualifies, the decision says what would change that.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

# Margin keys are checked against the metric declarations (where config checks them too).
from evalkit.metrics.declarations import MarginKey, direction_of
from evalkit.fileio import json_safe
from evalkit.metrics.noninferiority import NonInferiority, non_inferiority

DECISION_JSON = "decision.json"
PRIMARY = "workload"  # name of the stated workload among the scenarios
RULE = ("Among deployments that fit the hardware at the stated context and concurrency, meet the latency and "
        "throughput limits, and are non-inferior on every margin (the reference qualifies on quality by "
        "definition), the one with the highest output tokens/s at the stated concurrency; throughputs within "
        "{tie:.0%} of the highest count as tied (one measurement's noise), and among tied ones the smaller memory "
        "per device wins.")
TEST = ("non-inferiority: the bound of the run's two-sided (1 - alpha) paired interval that faces the margin "
        "(one-sided level alpha/2); inconclusive when the interval contains the margin")


# -- what each part of the decision found -----------------------------------------------------------------


@dataclass(frozen=True)
class MarginResult:
    key: str
    margin: float
    direction: str
    decision: str  # non-inferior | inferior | inconclusive | reference
    basis: str = "difference"  # the tested quantity: difference from the reference, or the value itself
    category: str | None = None
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    bound: float | None = None
    n: int | None = None
    n_needed: int | None = None
    note: str = ""


@dataclass(frozen=True)
class MemoryFit:
    fits: bool | None  # at the workload's context and concurrency
    per_device_gb: float | None
    budget_gb: float | None
    devices: str = ""
    max_context: int | None = None
    max_concurrency: int | None = None
    note: str = ""
    # The limit that binds when it does not fit: "memory" (bytes per device), "context" (the longest context it
    # holds is shorter than the workload's) or "sequences" (it holds fewer sequences at once than requests).
    binding: str = ""
    kv_precision: str = ""  # the KV cache's precision the plan sized (EngineSpec.kv_precision)


@dataclass(frozen=True)
class CostAt:
    tokens_per_s: float | None  # all requests together
    per_request_tokens_per_s: float | None
    ttft_ms: float | None  # median over requests
    how: str  # "measured at concurrency 4" / "interpolated between concurrency 1 and 4" / why unknown
    measured: bool | None  # True measured, False interpolated, None unknown


@dataclass(frozen=True)
class DeploymentDecision:
    deployment: str
    reference: bool
    memory: MemoryFit | None
    cost: CostAt | None
    memory_ok: bool | None
    latency_ok: bool | None
    feasible: bool | None
    margins: list[MarginResult]
    non_inferior: bool  # on every margin (the reference: by definition)
    qualifies: bool
    reasons: list[str] = field(default_factory=list)  # why it does not qualify
    changes: list[str] = field(default_factory=list)  # what would make it qualify


@dataclass(frozen=True)
class ScenarioDecision:
    name: str
    workload: dict[str, Any]
    recommended: str | None
    summary: str  # the recommendation in one sentence
    reasons: list[str]
    deployments: list[DeploymentDecision]
    what_would_change: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    rule: str
    test: str
    alpha: float
    margins: dict[str, float]
    scenarios: list[ScenarioDecision]

    @property
    def primary(self) -> ScenarioDecision:
        return self.scenarios[0]

    @property
    def recommended(self) -> str | None:
        return self.primary.recommended

    @property
    def summary(self) -> str:
        return self.primary.summary

    def table(self, scenario: str | None = None) -> pd.DataFrame:
        """One row per deployment: feasibility, cost at the load, each margin's decision."""
        sc = self.primary if scenario is None else next(s for s in self.scenarios if s.name == scenario)
        rows = []
        for d in sc.deployments:
            row: dict[str, Any] = {
                "deployment": d.deployment, "reference": d.reference, "qualifies": d.qualifies,
                "recommended": d.deployment == sc.recommended, "feasible": d.feasible,
                "fits_memory": d.memory_ok, "per_device_gb": d.memory.per_device_gb if d.memory else None,
                "tokens_per_s": d.cost.tokens_per_s if d.cost else None,
                "ttft_ms": d.cost.ttft_ms if d.cost else None, "cost_basis": d.cost.how if d.cost else "",
            }
            for m in d.margins:
                row[m.key] = m.decision
            row["reasons"] = "; ".join(d.reasons)
            rows.append(row)
        return pd.DataFrame(rows)

    def to_json(self) -> dict[str, Any]:
        p = self.primary
        return json_safe({
            "recommended": p.recommended,
            "summary": p.summary,
            "rule": self.rule,
            "test": self.test,
            "alpha": self.alpha,
            "margins": self.margins,
            "workload": p.workload,
            "reasons": p.reasons,
            "what_would_change": p.what_would_change,
            "deployments": [asdict(d) for d in p.deployments],
            "scenarios": [asdict(s) for s in self.scenarios],
        })

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Decision":
        def dep(d: dict[str, Any]) -> DeploymentDecision:
            return DeploymentDecision(**{**d, "memory": _memory_fit(d["memory"]) if d.get("memory") else None,
                                         "cost": CostAt(**d["cost"]) if d.get("cost") else None,
                                         "margins": [MarginResult(**m) for m in d["margins"]]})

        scenarios = [ScenarioDecision(**{**s, "deployments": [dep(d) for d in s["deployments"]]}) for s in data["scenarios"]]
        return cls(data["rule"], data["test"], data["alpha"], data["margins"], scenarios)


def _memory_fit(data: dict[str, Any]) -> MemoryFit:
    """A MemoryFit from decision.json, leaving out fields this version does not have (a decision.json written
    before the KV column was renamed: re-scoring the run writes it again)."""
    known = {f.name for f in fields(MemoryFit)}
    return MemoryFit(**{k: v for k, v in data.items() if k in known})


# -- quality: the tested quantity and its interval ------------------------------------------------------


def _isnum(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _num(x: Any) -> float | None:
    return float(x) if _isnum(x) else None


def _select(df: pd.DataFrame, dep: str, mk: MarginKey) -> pd.DataFrame:
    """Rows of one deployment and metric in the margin's category (None: "all", else the only category)."""
    if df.empty:
        return df
    rows = df[(df.deployment == dep) & (df.suite == mk.suite) & (df.metric == mk.metric)]
    if mk.category is not None:
        return rows[rows.category.astype(str) == mk.category]
    cats = sorted(set(rows.category.astype(str)))
    pick = "all" if "all" in cats else cats[0] if len(cats) == 1 else None
    return rows[rows.category.astype(str) == pick] if pick else rows.iloc[0:0]


def tested_quantity(scores: pd.DataFrame, comps: pd.DataFrame, dep: str, reference: str, mk: MarginKey
                    ) -> tuple[str, str, float, float | None, float | None, int] | None:
    """(basis, category, estimate, ci_low, ci_high, n) of a margin's quantity for one deployment, or None.

    - The reference has its own score for the metric (accuracy, chrF...): the paired difference
      deployment - reference from comparisons.csv ("difference").
    - Otherwise the metric only exists against the reference (perplexity ratio, KLD, top-1 agreement,
      flip rates): the deployment's own value and interval ("value"), from the comparison row when there is
      one (reference_value + the difference's interval), else from scores.csv.
    """
    comp = _select(comps, dep, mk)
    own = _select(scores, dep, mk)
    ref_own = _select(scores, reference, replace(mk, category=(own.category.iloc[0] if not own.empty else mk.category)))
    if not comp.empty and not ref_own.empty:
        c = comp.iloc[0]
        return ("difference", str(c.category), float(c["diff"]), _num(c.ci_low), _num(c.ci_high), int(c.n))
    # A comparison row's interval before the score row's: for perplexity's ratio, KLD and top-1 agreement it is
    # block-clustered, while the score row keeps llama-perplexity's token-level SE for the parity block.
    if not comp.empty:
        c = comp.iloc[0]
        base = float(c.reference_value) if _isnum(c.reference_value) else 0.0
        lo, hi = _num(c.ci_low), _num(c.ci_high)
        return ("value", str(c.category), float(c.value), None if lo is None else base + lo,
                None if hi is None else base + hi, int(c.n))
    if not own.empty:
        s = own.iloc[0]
        return ("value", str(s.category), float(s.value), _num(s.ci_low), _num(s.ci_high), int(s.n) if _isnum(s.n) else 0)
    return None


def judge_margin(scores: pd.DataFrame, comps: pd.DataFrame, dep: str, reference: str, key: str, margin: float) -> MarginResult:
    mk = MarginKey.parse(key)
    direction = direction_of(mk.suite, mk.metric) or "higher"
    if dep == reference:
        return MarginResult(key, margin, direction, "reference", note="the reference: no loss by definition")
    found = tested_quantity(scores, comps, dep, reference, mk)
    if found is None:
        return MarginResult(key, margin, direction, "inconclusive", note="no result for this deployment")
    basis, category, est, lo, hi, n = found
    ni: NonInferiority = non_inferiority(est, lo, hi, n, margin, direction, basis)  # type: ignore[arg-type]
    needed, extra = ni.n_needed, ""
    if ni.decision == "inconclusive" and basis == "difference":
        flips = _flip_counts(comps, dep, mk.suite, category)
        if flips is not None:  # a pass/fail metric: the score test's own sample size, not a rescaled width
            from evalkit.metrics.stats import pass_fail_items_needed

            needed = pass_fail_items_needed(flips[1], flips[0], n, margin)
            best = pass_fail_items_needed(0, 0, n, margin) if needed is None else None
            if best is not None:  # the observed difference cannot clear it; the best case still tells the size
                extra = (f"the observed difference is not better than the margin; even with no answer flipped, "
                         f"about {best:,} {_unit(key)} would be needed to show it (now {n:,})")
    note = "" if lo is not None and hi is not None else "no interval (too few items)"
    note = "; ".join(x for x in (note, extra) if x)
    floor = _noise_floor_note(scores, comps, reference, mk, margin, direction)
    note = "; ".join(x for x in (note, floor) if x)
    return MarginResult(key, margin, direction, ni.decision, basis, category, est, lo, hi, ni.bound, n, needed, note)


RERUN_SUFFIX = ".rerun"  # evalkit.pipeline.NOISE_SUFFIX: the noise-floor rerun of the reference (noise_floor: true)


def _noise_floor_note(scores: pd.DataFrame, comps: pd.DataFrame, reference: str, mk: MarginKey, margin: float,
                      direction: str) -> str:
    """A margin the reference cannot meet against its own rerun is tighter than the noise floor: say so, with
    the figure. Empty without a rerun (noise_floor: false) or when the reference clears the margin."""
    rerun = reference + RERUN_SUFFIX
    found = tested_quantity(scores, comps, rerun, reference, mk)
    if found is None:
        return ""
    _, _, est, lo, hi, n = found
    own = non_inferiority(est, lo, hi, n, margin, direction)  # type: ignore[arg-type]
    if own.decision == "non-inferior" or lo is None or hi is None:  # no interval: no floor to compare with
        return ""
    return (f"margin tighter than the noise floor at this size: the reference against its own rerun is {own.decision} at it "
            f"({_fmt(est)} [{_fmt(lo)}, {_fmt(hi)}], n = {n})")


def _flip_counts(comps: pd.DataFrame, dep: str, suite: str, category: str) -> tuple[int, int] | None:
    """(right->wrong, wrong->right) counts of a pass/fail comparison, from its flip rows; None without them."""
    rows = comps[(comps.deployment == dep) & (comps.suite == suite) & (comps.category.astype(str) == category)]
    counts = {}
    for name in ("flips_right_to_wrong", "flips_wrong_to_right"):
        row = rows[rows.metric == name]
        if row.empty or not _isnum(row.iloc[0].value) or not _isnum(row.iloc[0].n):
            return None
        counts[name] = round(float(row.iloc[0].value) * int(row.iloc[0].n))
    return counts["flips_right_to_wrong"], counts["flips_wrong_to_right"]


# -- cost at the stated concurrency ---------------------------------------------------------------------


# CostAt's figures, each the workload suite's metric declaring that role (MetricSpec.role); ttft in ms, declared in s.
ROLES = {"tokens_per_s": "tokens_per_s", "per_request_tokens_per_s": "per_request_tokens_per_s", "ttft_ms": "ttft_s"}


def workload_metrics() -> tuple[str | None, dict[str, str]]:
    """The workload suite's name (SuiteSpec.quality False) and CostAt's figure -> its metric (MetricSpec.role);
    (None, {}) when no registered suite measures a workload."""
    from evalkit.suites import workload_suite

    spec = workload_suite()
    if spec is None:
        return None, {}
    by_role = {m.role: m.name for m in spec.metrics if m.role}
    return spec.name, {figure: by_role[role] for figure, role in ROLES.items() if role in by_role}


def cost_at(scores: pd.DataFrame, dep: str, concurrency: int) -> CostAt | None:
    """The workload suite's figures at `concurrency`: measured there, or interpolated linearly between the
    nearest measured levels below and above (labelled), never extrapolated. None without a workload suite."""
    suite, metrics = workload_metrics()
    if scores.empty or suite is None:
        return None
    # its categories are its concurrency levels ("c8": concurrency 8), SuiteSpec.quality's contract
    rows = scores[(scores.deployment == dep) & (scores.suite == suite) & scores.category.astype(str).str.fullmatch(r"c\d+")]
    if rows.empty:
        return None
    levels: dict[int, dict[str, float]] = {}
    for r in rows.itertuples():
        levels.setdefault(int(str(r.category)[1:]), {})[str(r.metric)] = float(r.value)
    measured = sorted(levels)
    listed = ", ".join(map(str, measured))

    def value(level_values: dict[str, float], name: str) -> float | None:
        metric = metrics.get(name)
        v = None if metric is None else level_values.get(metric)
        return None if v is None else v * 1000.0 if name == "ttft_ms" else v

    if concurrency in levels:
        lv = levels[concurrency]
        return CostAt(value(lv, "tokens_per_s"), value(lv, "per_request_tokens_per_s"), value(lv, "ttft_ms"),
                      f"measured at concurrency {concurrency}", True)
    below = [c for c in measured if c < concurrency]
    above = [c for c in measured if c > concurrency]
    if not below or not above:
        return CostAt(None, None, None, f"not measured at concurrency {concurrency} (measured: {listed}; "
                      "not extrapolated)", None)
    a, b = below[-1], above[0]
    w = (concurrency - a) / (b - a)
    out: dict[str, float | None] = {}
    for name in ROLES:
        va, vb = value(levels[a], name), value(levels[b], name)
        out[name] = None if va is None or vb is None else va + w * (vb - va)
    return CostAt(out["tokens_per_s"], out["per_request_tokens_per_s"], out["ttft_ms"],
                  f"interpolated between concurrency {a} and {b}", False)


# -- memory at the stated context and concurrency ----------------------------------------------------------


def memory_plan(config: Any, config_file: Path, workload: Any) -> dict[str, MemoryFit]:
    """The ledger's prediction per deployment with context and concurrency set to the workload's.

    A deployment fits when the ledger says it fits and memory holds `concurrency` sequences of
    `context_tokens` tokens at once. A prediction that cannot be made is "unknown", never "fits".
    """
    from evalkit.engines import engine_spec
    from evalkit.ledger import GB, deployment_row, hardware_from_config

    out: dict[str, MemoryFit] = {}
    try:
        hw = hardware_from_config(config)
    except Exception as e:  # a prediction must never stop a report
        return {d.name: MemoryFit(None, None, None, note=f"memory plan unavailable: {e}") for d in config.deployments}
    for dep in config.deployments:
        # The engine's own context and concurrency options (its spec names them), set to the workload's.
        options = engine_spec(dep.engine).at_workload(dep.options, workload.context_tokens, workload.concurrency)
        at_load = dep.model_copy(update={"options": options})
        try:
            row = deployment_row(at_load, Path(config_file), hw)
        except Exception as e:
            out[dep.name] = MemoryFit(None, None, None, note=f"memory plan unavailable: {e}")
            continue
        fits = row.fits
        why: list[str] = []
        binding = "memory" if fits is False else ""
        if fits and row.max_context is not None and row.max_context < workload.context_tokens:
            fits, binding, why = False, "context", why + [f"holds at most {row.max_context:,} tokens of context"]
        if fits and row.max_concurrency is not None and row.max_concurrency < workload.concurrency:
            fits, binding = False, "sequences"
            why.append(f"holds {row.max_concurrency} sequence(s) of {workload.context_tokens:,} tokens at once")
        out[dep.name] = MemoryFit(
            fits, row.per_device_bytes / GB if row.per_device_bytes else None,
            row.device_budget_bytes / GB if row.device_budget_bytes else None, row.devices, row.max_context,
            row.max_concurrency, "; ".join(why + ([row.notes] if row.notes else [])), binding,
            engine_spec(dep.engine).kv_precision_of(dep.options))
    return out


# -- the decision -------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 3) -> str:
    return "?" if x is None else f"{x:.{digits}g}"


def _workload_text(w: Any) -> str:
    s = f"{w.concurrency} concurrent request{'s' if w.concurrency != 1 else ''} at {w.context_tokens:,} tokens of context"
    limits = ([f"first token within {w.max_ttft_ms:g} ms"] if w.max_ttft_ms else []) + \
             ([f"at least {w.min_tokens_per_s:g} tokens/s per request"] if w.min_tokens_per_s else [])
    return s + (f" ({', '.join(limits)})" if limits else "")


def _unit(key: str) -> str:
    """What `n` counts in the intervals of the margin key's suite (SuiteSpec.n_unit; items where not declared)."""
    from evalkit.suites import suite_spec

    try:
        return suite_spec(key.split("/")[0]).n_unit
    except Exception:  # a suite outside the registry (imported ratings): items
        return "items"


def _margin_reason(m: MarginResult) -> tuple[str, str]:
    """(why it fails, what would change that) for a margin that is not non-inferior."""
    interval = (f"[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]" if m.ci_low is not None and m.ci_high is not None
                else "no interval: too few items")
    what = f"{m.key} ({'difference from the reference' if m.basis == 'difference' else 'value'} "
    what += f"{_fmt(m.estimate)} {interval}, margin {m.margin:g})"
    if m.decision == "inferior":
        return f"inferior on {what}", f"a margin looser than {_fmt(m.bound)} on {m.key}"
    if m.note == "no result for this deployment":
        return f"no {m.key} result", f"running the {m.key.split('/')[0]} suite for it"
    if m.n_needed is not None:
        return (f"inconclusive on {what}",
                f"about {m.n_needed:,} {_unit(m.key)} on {m.key} instead of {m.n:,} (80% power if the observed difference "
                f"holds), or a margin looser than {_fmt(m.bound)}")
    if m.estimate is not None and m.ci_low is not None and (  # 1e-12: -0.05 computed as 0.45 - 0.5
            m.estimate <= m.margin + 1e-12 if m.direction == "higher" else m.estimate >= m.margin - 1e-12):
        return (f"inconclusive on {what}", f"a margin looser than {_fmt(m.estimate)} on {m.key}: the observed "
                "difference is not better than this one, so more items would not show non-inferiority if it holds")
    return f"inconclusive on {what}", f"more items on {m.key}"


def judge_deployment(dep: str, reference: str, scores: pd.DataFrame, comps: pd.DataFrame, margins: dict[str, float],
                     workload: Any, memory: MemoryFit | None, lacking: dict[str, str] | None = None) -> DeploymentDecision:
    """`lacking`: suite -> why, for the suites the decision needs (margins, cost) that this deployment does not
    run in this run; such a deployment is never recommended, and that is said once instead of per margin."""
    results = [judge_margin(scores, comps, dep, reference, k, v) for k, v in margins.items()]
    reasons, changes = [], []
    if lacking:
        names = sorted(lacking)
        reasons.append(f"not measured on {', '.join(names)}, which the decision needs (it does not run "
                       f"{'it' if len(names) == 1 else 'them'}: {lacking[names[0]]})")
        changes.append(f"running {', '.join(names)} for it")
    for m in results:
        if lacking and MarginKey.parse(m.key).suite in lacking:
            continue  # said once above
        if m.decision in ("inferior", "inconclusive"):
            why, change = _margin_reason(m)
            reasons.append(why)
            changes.append(change)
    non_inferior = all(m.decision in ("non-inferior", "reference") for m in results)

    memory_ok = memory.fits if memory else None
    if memory_ok is False and memory is not None and memory.binding == "sequences":
        reasons.append(f"holds {memory.max_concurrency} sequence(s) at once, the load has {workload.concurrency} "
                       f"concurrent requests (memory is not the limit: {_fmt(memory.per_device_gb)} of "
                       f"{_fmt(memory.budget_gb)} GB per device)")
        changes.append(f"an engine or setting that runs {workload.concurrency} sequences at once, or fewer concurrent requests")
    elif memory_ok is False and memory is not None and memory.binding == "context":
        reasons.append(f"holds at most {memory.max_context:,} tokens of context, the load needs "
                       f"{workload.context_tokens:,}")
        changes.append("a longer context setting for its engine, or a shorter context")
    elif memory_ok is False:
        need = f"needs {_fmt(memory.per_device_gb)} GB per device of {_fmt(memory.budget_gb)} GB" if memory else ""
        reasons.append(f"does not fit in memory at this load ({need}{'; ' + memory.note if memory and memory.note else ''})")
        more = (memory.per_device_gb or 0) - (memory.budget_gb or 0) if memory else 0
        changes.append(f"about {more:.2g} GB more memory per device, or a shorter context / fewer concurrent requests"
                       if more > 0 else "a shorter context or fewer concurrent requests")
    elif memory_ok is None:
        reasons.append(f"memory fit unknown ({memory.note if memory else 'no memory plan'})")

    cost = cost_at(scores, dep, workload.concurrency)
    measures = workload_metrics()[0] or "workload"  # the suite that measures the load (its settings name the levels)
    latency_ok: bool | None = True
    for limit, value, label, worse_if_above in (
        (workload.max_ttft_ms, cost.ttft_ms if cost else None, "median time to first token", True),
        (workload.min_tokens_per_s, cost.per_request_tokens_per_s if cost else None, "tokens/s per request", False),
    ):
        if not limit:
            continue
        if value is None:
            latency_ok = None if latency_ok is not False else False
            reasons.append(f"{label} at concurrency {workload.concurrency} unknown ({cost.how if cost else f'no {measures} suite'})")
            changes.append(f"measuring concurrency {workload.concurrency} (suites.{measures}.concurrency)")
        elif (value > limit) if worse_if_above else (value < limit):
            latency_ok = False
            unit = " ms" if worse_if_above else ""
            reasons.append(f"{label} {value:.4g}{unit} at concurrency {workload.concurrency} ({cost.how if cost else ''}) "
                           f"{'exceeds' if worse_if_above else 'is below'} the limit {limit:g}{unit}")
            changes.append(f"a {'looser' if worse_if_above else 'lower'} limit than {value:.4g}{unit}, or fewer concurrent requests")
    feasible = None if memory_ok is None or latency_ok is None else bool(memory_ok and latency_ok)
    if memory_ok is False or latency_ok is False:
        feasible = False
    return DeploymentDecision(dep, dep == reference, memory, cost, memory_ok, latency_ok, feasible, results,
                              non_inferior, bool(feasible) and non_inferior and not lacking, reasons, changes)


def _tps(d: DeploymentDecision) -> float:
    return d.cost.tokens_per_s if d.cost and d.cost.tokens_per_s is not None else -math.inf


def _mem(d: DeploymentDecision) -> float:
    return d.memory.per_device_gb if d.memory and d.memory.per_device_gb is not None else math.inf


def rank(qualifying: list[DeploymentDecision], tie: float) -> tuple[list[DeploymentDecision], int]:
    """The qualifying deployments best first, and how many are tied at the top (throughput within `tie`
    of the highest: the least memory per device first among them). Unknown throughput ranks last."""
    best = max((_tps(d) for d in qualifying), default=-math.inf)
    if best == -math.inf:  # no throughput known at all: memory decides
        return sorted(qualifying, key=lambda d: (_mem(d), d.deployment)), len(qualifying)
    tied = [d for d in qualifying if _tps(d) >= best * (1 - tie)]
    rest = [d for d in qualifying if d not in tied]
    return (sorted(tied, key=lambda d: (_mem(d), -_tps(d), d.deployment))
            + sorted(rest, key=lambda d: (-_tps(d), _mem(d), d.deployment)), len(tied))


@dataclass(frozen=True)
class Evidence:
    """What every workload's decision reads, the same for all of them: the run's scores and comparisons, its
    reference and deployments, the quality margins, and the suites a deployment lacks (deployment -> {suite: why})."""

    scores: pd.DataFrame
    comps: pd.DataFrame
    reference: str
    deployments: list[str]
    margins: dict[str, float]
    lacking: dict[str, dict[str, str]] = field(default_factory=dict)


def decide_scenario(name: str, workload: Any, evidence: Evidence, memory: dict[str, MemoryFit],
                    tie: float = 0.05) -> ScenarioDecision:
    margins = evidence.margins
    table = [judge_deployment(d, evidence.reference, evidence.scores, evidence.comps, margins, workload, memory.get(d),
                              evidence.lacking.get(d))
             for d in evidence.deployments]
    ranked, n_tied = rank([d for d in table if d.qualifies], tie)
    load = _workload_text(workload)
    reasons: list[str] = []
    change: list[str] = []
    if ranked:
        best = ranked[0]
        cost = f"{_fmt(best.cost.tokens_per_s)} tokens/s, {best.cost.how}" if best.cost and best.cost.tokens_per_s is not None \
            else "throughput not measured at this load"
        mem = f"{_fmt(best.memory.per_device_gb)} of {_fmt(best.memory.budget_gb)} GB per device" if best.memory else "memory unknown"
        quality = "the reference" if best.reference else f"non-inferior on all {len(margins)} margin(s)"
        runner = f"; next: {ranked[1].deployment}" if len(ranked) > 1 else ""
        if n_tied > 1:
            speed = (f"has the least memory of the {n_tied} whose throughput is within {tie:.0%} of the highest "
                     f"among the {len(ranked)} that qualify ({cost})")
        else:
            speed = f"has the highest throughput of the {len(ranked)} deployment(s) that qualify ({cost})"
        summary = f"Serve {best.deployment} for {load}: it fits ({mem}), is {quality}, and {speed}{runner}."
        reasons.append(f"{best.deployment}: qualifies and {speed}; {mem}.")
    else:
        summary = f"No deployment qualifies for {load}: " + "; ".join(
            f"{d.deployment} {d.reasons[0]}" if d.reasons else f"{d.deployment} not feasible" for d in table) + "."
        change = [f"{d.deployment}: " + "; or ".join(d.changes) for d in table if d.changes]
    for d in table:
        if not d.qualifies:
            reasons.append(f"{d.deployment}: " + ("; ".join(d.reasons) or "not feasible") + ".")
        elif ranked and d is not ranked[0]:
            tied = ranked.index(d) < n_tied
            reasons.append(f"{d.deployment}: qualifies, " + ("tied on throughput, more memory" if tied else "lower throughput")
                           + f" ({_fmt(d.cost.tokens_per_s) if d.cost else '?'} tokens/s, {_fmt(_mem(d))} GB per device).")
    return ScenarioDecision(name, workload.model_dump(mode="json"), ranked[0].deployment if ranked else None,
                            summary, reasons, table, change)


def decide(scores: pd.DataFrame, comps: pd.DataFrame, reference: str, deployments: list[str], settings: Any,
           memory: dict[str, dict[str, MemoryFit]], alpha: float = 0.05,
           lacking: dict[str, dict[str, str]] | None = None) -> Decision:
    """Decide every workload of `settings` (config.DecisionSettings); `memory` maps scenario name -> plan;
    `lacking` deployment -> {suite: why} for needed suites it does not run (see `lacking_suites`)."""
    workloads = [(PRIMARY, settings.workload)] + [(s.name, s) for s in settings.scenarios]
    margins = dict(settings.margins)
    tie = float(settings.throughput_tie)
    evidence = Evidence(scores, comps, reference, deployments, margins, lacking or {})
    out = [decide_scenario(name, w, evidence, memory.get(name, {}), tie) for name, w in workloads]
    return Decision(RULE.format(tie=tie), TEST, alpha, margins, out)


# -- wiring: scoring, run directories ------------------------------------------------------------------------


def rows_frame(rows: Iterable[Any]) -> pd.DataFrame:
    """ScoreRow / ComparisonRow dataclasses as the DataFrame scores.csv / comparisons.csv read back into."""
    rows = list(rows)
    return pd.DataFrame([asdict(r) for r in rows]) if rows else pd.DataFrame()


def candidates(manifest: dict[str, Any], config: Any) -> list[str]:
    """The deployments one could serve: the config's, in run order (not the noise-floor rerun)."""
    names = {d.name for d in config.deployments}
    return [d for d in manifest.get("deployment_order", []) if d in names] or sorted(names)


def workloads(settings: Any) -> list[tuple[str, Any]]:
    return [(PRIMARY, settings.workload)] + [(s.name, s) for s in settings.scenarios]


def lacking_suites(config: Any, manifest: dict[str, Any], settings: Any) -> dict[str, dict[str, str]]:
    """deployment -> {suite: why} for the suites the decision needs (its margins' suites, and the workload suite
    when the run has one: the workload's throughput and latency) that the run skipped for that deployment
    (its `suites:` list, or a capability its engine lacks)."""
    from evalkit.capabilities import skipped_suites

    needed = {MarginKey.parse(k).suite for k in settings.margins}
    measures = workload_metrics()[0]
    if measures is not None and config.suites.get(measures) is not None:
        needed.add(measures)
    out = {}
    for dep in candidates(manifest, config):
        missing = {s: why for s, why in skipped_suites(manifest, dep).items() if s in needed}
        if missing:
            out[dep] = missing
    return out


def decide_from(config: Any, config_file: Path, manifest: dict[str, Any], scores: pd.DataFrame, comps: pd.DataFrame,
                settings: Any | None = None) -> Decision | None:
    """Decide from a run's frames; `settings` overrides the config's `decision:` (None: the config's)."""
    settings = settings if settings is not None else getattr(config, "decision", None)
    if settings is None:
        return None
    memory = {name: memory_plan(config, config_file, w) for name, w in workloads(settings)}
    alpha = getattr(getattr(config, "stats", None), "alpha", 0.05)
    return decide(scores, comps, manifest.get("reference", config.reference), candidates(manifest, config), settings,
                  memory, alpha, lacking_suites(config, manifest, settings))


def annotate_comparisons(decision: Decision, comparisons: list[Any]) -> list[Any]:
    """comparisons.csv rows with `margin` and `decision` filled where a margin applies (stated workload).

    A margin on a value that only exists against the reference (e.g. perplexity ratio) has no comparison
    row: one is added with that value, its interval, and no difference (diff empty)."""
    from evalkit.store import ComparisonRow

    out = list(comparisons)
    ref = next((d.deployment for d in decision.primary.deployments if d.reference), "")
    for d in decision.primary.deployments:
        for m in d.margins:
            if m.decision == "reference" or m.estimate is None:
                continue
            mk = MarginKey.parse(m.key)
            hit = False
            for i, c in enumerate(out):
                if (c.deployment, c.suite, str(c.category), c.metric) == (d.deployment, mk.suite, m.category, mk.metric):
                    out[i] = replace(c, margin=m.margin, decision=m.decision)
                    hit = True
            if not hit:
                out.append(ComparisonRow(d.deployment, ref, mk.suite, str(m.category), mk.metric, m.estimate, math.nan,
                                         math.nan, m.ci_low, m.ci_high, None, int(m.n or 0),
                                         "non-inferiority on the deployment's own value (it exists only against the "
                                         "reference; interval from scores.csv); no difference", False,
                                         margin=m.margin, decision=m.decision))
    return out


def write_decision(path: Path, decision: Decision | None) -> None:
    from evalkit.store import atomic_write_text

    target = path / DECISION_JSON
    if decision is None:
        target.unlink(missing_ok=True)  # a config without `decision:` must not keep a stale one
        return
    atomic_write_text(target, json.dumps(decision.to_json(), indent=2, ensure_ascii=False, allow_nan=False,
                                         default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def load_decision(path: Path) -> Decision | None:
    f = Path(path) / DECISION_JSON
    return Decision.from_json(json.loads(f.read_text(encoding="utf-8"))) if f.exists() else None
