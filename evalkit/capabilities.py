"""Plan-time capability check: which (deployment, suite) pairs cannot run, and why, before anything loads.

A suite declares what it needs (`Suite.requires`, and one of `Suite.requires_any`), an engine what it can do (`EngineSpec.capabilities_of`:
its declared capabilities, or for a served engine what its server answers, with the server's reasons).
A pair whose engine lacks something is skipped with the reason in the run's manifest (`skipped`) and
report, or refused as a user error with `run --strict`. Nothing then fails mid-run for a missing capability.
A deployment's own `suites:` list skips the others the same way (`chosen`: the user's choice, which
`--strict` does not refuse).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from evalkit.engines import Capability, engine_spec
from evalkit.errors import ConfigError

if TYPE_CHECKING:
    from evalkit.suites.base import Suite


@dataclass(frozen=True)
class Skip:
    deployment: str
    suite: str
    reason: str
    chosen: bool = False  # left out by the deployment's `suites:` list, not for a missing capability


def plan_skips(config: Any, config_file: Path, suites: "list[Suite] | None" = None) -> list[Skip]:
    """Every (deployment, enabled suite) pair the deployment's engine cannot run, in config order."""
    if suites is None:
        from evalkit.suites import enabled_suites

        suites = enabled_suites(config, config_file)
    out: list[Skip] = []
    for dep in config.deployments:
        spec = engine_spec(dep.engine)
        known: tuple[frozenset[Capability], dict[Capability, str]] | None = None
        for suite in suites:
            if not dep.runs(suite.name):
                out.append(Skip(dep.name, suite.name, f"not in its suites: list ({', '.join(dep.suites or [])})", True))
                continue
            known = known or spec.capabilities_of(dep)  # a served engine asks its server once per deployment
            caps, why = known
            missing = [c for c in Capability if c in suite.requires and c not in caps]
            if suite.requires_any and not suite.requires_any & caps:  # none of the ways it can measure
                missing += [c for c in Capability if c in suite.requires_any]
            if missing:
                what = ", ".join(c.value for c in missing)
                reasons = list(dict.fromkeys(why[c] for c in missing if why.get(c)))
                told = f" ({'; '.join(reasons)})" if reasons else ""
                out.append(Skip(dep.name, suite.name, f"engine {dep.engine} cannot give {what}{told}"))
    return out


def check_capabilities(config: Any, config_file: Path, strict: bool) -> list[dict[str, str]]:
    """The manifest's `skipped` list; with `strict`, any skip is a ConfigError (nothing is written)."""
    skips = plan_skips(config, config_file)
    refused = [s for s in skips if not s.chosen]
    if strict and refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ConfigError(
            str(config_file),
            f"deployment {first.deployment} cannot run suite {first.suite}: {first.reason}{more}; "
            "drop --strict to skip such pairs",
        )
    return [asdict(s) for s in skips]


def skipped_suites(manifest: Mapping[str, Any], deployment: str) -> dict[str, str]:
    """suite -> reason for the suites this run skips for `deployment` (a noise-floor rerun shares its base's)."""
    base = (manifest.get("deployments", {}).get(deployment) or {}).get("base", deployment)
    return {s["suite"]: s["reason"] for s in manifest.get("skipped", []) if s["deployment"] == base}


def runnable_suites(suites: "list[Suite]", manifest: Mapping[str, Any], deployment: str) -> "list[Suite]":
    """`suites` without those the plan skipped for `deployment`."""
    skipped = skipped_suites(manifest, deployment)
    return [s for s in suites if s.name not in skipped]


def grouped_skips(skipped: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(deployment, reason) -> the suites skipped for it, from manifest `skipped` entries: one line for a
    deployment whose `suites:` list leaves out four suites of five."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for s in skipped:
        grouped.setdefault((s["deployment"], s["reason"]), []).append(s["suite"])
    return grouped
