"""Which deployments must finish before which: a suite that reads another deployment's artefacts from the
run directory says so (`Suite.runs_after`); the local executor runs deployments in an order that respects
it, the Ray executor holds a unit back until the deployments it depends on have no unit left running."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.capabilities import runnable_suites
from evalkit.config import Config, Deployment
from evalkit.store import RunDir
from evalkit.suites import enabled_suites


def _configured(config: Config, manifest: dict[str, Any], name: str) -> Deployment:
    """The config's deployment a run's deployment runs (a noise-floor rerun: its base's)."""
    return config.deployment((manifest["deployments"].get(name) or {}).get("base", name))


def dependencies(run: RunDir, names: list[str]) -> dict[str, frozenset[str]]:
    """deployment -> the deployments among `names` that must finish before it starts (the suites it runs)."""
    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    suites = enabled_suites(config, Path(manifest["config_file"]))
    out: dict[str, frozenset[str]] = {}
    for name in names:
        spec = _configured(config, manifest, name)
        after: set[str] = set()
        for suite in runnable_suites(suites, manifest, name):
            after |= suite.runs_after(name, spec)
        out[name] = frozenset(after & set(names) - {name})
    return out


def dependency_order(names: list[str], deps: dict[str, frozenset[str]]) -> list[str]:
    """`names` reordered so each comes after what it depends on, otherwise in the given order (stable).
    A cycle cannot arise from today's suites; if one did, its members keep their given order."""
    out: list[str] = []
    left = list(names)
    while left:
        ready = next((n for n in left if not (deps.get(n, frozenset()) & set(left))), left[0])
        out.append(ready)
        left.remove(ready)
    return out


def concurrent_groups(run: RunDir, names: list[str]) -> dict[str, list[str]]:
    """deployment -> the deployments among `names` that must run at the same time as it, itself included
    (`Suite.runs_beside`, closed under the relation), in `names` order."""
    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    suites = enabled_suites(config, Path(manifest["config_file"]))
    beside: dict[str, set[str]] = {n: {n} for n in names}
    for name in names:
        spec = _configured(config, manifest, name)
        for suite in runnable_suites(suites, manifest, name):
            for other in suite.runs_beside(name, spec) & set(names):
                beside[name].add(other)
                beside[other].add(name)
    changed = True
    while changed:  # the closure: a group of a reference and all its readers
        changed = False
        for n in names:
            grown = set().union(*(beside[m] for m in beside[n]))
            if grown != beside[n]:
                beside[n], changed = grown, True
    return {n: [m for m in names if m in beside[n]] for n in names}


def narrow_deployments(run: RunDir, names: list[str]) -> set[str]:
    """The deployments among `names` fixed to fewer CPU threads than this process may use, on no GPU (the hf
    engine's KLD references run on one thread, so their rounding never depends on the load): while one runs,
    the other cores are free for the next worker's imports."""
    from evalkit.engines import engine_spec
    from evalkit.hardware import available_cores

    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    cores = available_cores()
    out = set()
    for name in names:
        dep = _configured(config, manifest, name)
        spec = engine_spec(dep.engine)
        threads = getattr(dep.options, spec.threads_option, None) if spec.threads_option else None
        if isinstance(threads, int) and threads < cores and not spec.resources(dep.options).num_gpus:
            out.add(name)
    return out


def interleave_narrow(names: list[str], deps: dict[str, frozenset[str]], narrow: set[str]) -> list[str]:
    """`names` (in dependency order) with each narrow deployment moved to just before the next other deployment
    its dependencies allow, one before each, so the executor starts that deployment's worker beside it
    (`LocalExecutor`: a vLLM worker imports for ~7 s of one core). The others keep their order; every
    deployment still comes after what it depends on."""
    waiting = [n for n in names if n in narrow]
    out: list[str] = []

    def place(name: str) -> None:
        for dep in sorted(deps.get(name, frozenset()) - set(out), key=names.index):
            place(dep)
        if name not in out:
            out.append(name)
            if name in waiting:
                waiting.remove(name)

    for name in names:
        if name in narrow:
            continue
        ready = next((m for m in waiting if deps.get(m, frozenset()) <= set(out)), None)
        if ready is not None:
            place(ready)
        place(name)
    for name in list(waiting):
        place(name)
    return out
