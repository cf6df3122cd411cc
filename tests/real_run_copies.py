"""Copies of the session's real run (conftest.real_run) for tests that need what a model run cannot give.

- `rate`: blind rating sheets exported from the run, filled by a fixed rule (as raters would, de-blinded
  through the key), imported. The values written are returned, so tests compute their expectations from
  them, not from evalkit's aggregation.
- `make_hostile`: markup (script, event handlers) put in place of a few real outputs, then re-scored and
  re-rendered: the one plumbing case a real model does not produce on demand (escaping of hostile text).

Both start from the real records, so every record keeps exactly the shape the suites emit today.
"""
from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

HOSTILE = (
    "<script>document.title='pwned'</script>",
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(2)>',
)


def copy_run(src: Path, dest_root: Path, *, days_later: int = 0) -> Path:
    """`src` copied under `dest_root`; `days_later` > 0 makes it a later run (new run id and created time)."""
    manifest = json.loads((src / "manifest.json").read_text(encoding="utf-8"))
    created = datetime.fromisoformat(manifest["created"]) + timedelta(days=days_later)
    run_id = created.strftime("%Y%m%d-%H%M%S") if days_later else manifest["run_id"]
    dest = dest_root / run_id
    shutil.copytree(src, dest)
    if days_later:
        manifest |= {"run_id": run_id, "created": created.isoformat()}
        (dest / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return dest


# -- ratings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rating:
    mode: str  # absolute | pairwise
    rater: int
    item_id: str
    category: str
    deployment: str  # the rated deployment (pairwise: the one compared with the reference)
    value: str  # absolute: "1".."5"; pairwise: "win" / "tie" / "loss" for `deployment`


def absolute_score(reference: bool, category: str, rater: int) -> int:
    """The rule the raters follow: the reference 4, others 2; the second rater is one point kinder on QA."""
    return (4 if reference else 2) + (1 if rater == 2 and category == "qa" else 0)


def pairwise_outcome(category: str) -> str:
    """For the non-reference deployment: a tie on translation, a loss everywhere else."""
    return "tie" if category == "translation" else "loss"


def rate(run: Path, raters: int = 2) -> list[Rating]:
    from evalkit.rating import export_sheets, import_sheets
    from evalkit.rating.aggregate import refresh_tidy_tables

    reference = json.loads((run / "manifest.json").read_text(encoding="utf-8"))["reference"]
    written: list[Rating] = []
    filled = []
    for mode in ("absolute", "pairwise"):
        sheets = export_sheets(run, raters=raters, fmt="csv", mode=mode, seed=1)
        key = json.loads((run / "ratings" / "key.json").read_text(encoding="utf-8"))
        for sheet in sheets:
            with sheet.open(encoding="utf-8-sig", newline="") as f:
                rows = list(csv.reader(f))
            head = rows[0]
            entry = key["sheets"][rows[1][head.index("sheet_id")]]
            for r in rows[1:]:
                plan = entry["rows"][r[head.index("row_id")]]
                dep, item, cat = plan["deployment"], plan["item_id"], plan["category"]
                if mode == "absolute":
                    score = absolute_score(dep == reference, cat, entry["rater_index"])
                    r[head.index("score")] = str(score)
                    written.append(Rating(mode, entry["rater_index"], item, cat, dep, str(score)))
                else:
                    outcome = pairwise_outcome(cat)
                    ref_side = "A" if plan["A"] == reference else "B"
                    dep_side = "B" if ref_side == "A" else "A"
                    r[head.index("choice")] = {"tie": "tie", "loss": ref_side, "win": dep_side}[outcome]
                    written.append(Rating(mode, entry["rater_index"], item, cat, dep, outcome))
            out = run.parent / f".{run.name}.{mode}.{sheet.name}"
            with out.open("w", encoding="utf-8-sig", newline="") as f:
                csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
            filled.append(out)
    import_sheets(run, filled)
    refresh_tidy_tables(run)  # as `rate import` does: the ratings rows of scores.csv / comparisons.csv
    for p in filled:
        p.unlink()
    return written


# -- hostile output ------------------------------------------------------------------------------


def make_hostile(run: Path, deployment: str) -> None:
    """`deployment`'s QA answers and long-context continuations become markup; the run is re-scored and
    re-rendered. Its QA answers are then all wrong, so wherever the reference was right the report and the
    notebooks show the hostile text as a regression."""
    from evalkit.report.render import render_report
    from evalkit.scoring import score_run
    from evalkit.store import RunDir

    path = run / "records" / f"{deployment}.jsonl"
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["suite"] == "prompts" and r["category"] == "qa":
            r["generation"]["output_text"] = "\n".join(HOSTILE)
        elif r["suite"] == "longcontext" and r.get("kind") == "rep" and "generation" in r:
            r["generation"]["output_text"] += " " + HOSTILE[0]
        lines.append(json.dumps(r, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for stale in ("decision.json",):
        (run / stale).unlink(missing_ok=True)
    score_run(RunDir(run))
    render_report(run)


def keep_only(run: Path, suites: tuple[str, ...]) -> None:
    """The run as if only `suites` had been configured, by a pipeline that stored no ledger and no suite
    provenance in the manifest (an older evalkit's run); re-scored and re-rendered."""
    from evalkit.report.render import render_report
    from evalkit.scoring import score_run
    from evalkit.store import RunDir

    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    manifest["config"]["suites"] = {k: v for k, v in manifest["config"]["suites"].items() if k in suites}
    manifest["config"].pop("decision", None)
    for key in ("ledger", "suites"):
        manifest.pop(key, None)
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    for path in (run / "records").glob("*.jsonl"):
        kept = [x for x in path.read_text(encoding="utf-8").splitlines() if json.loads(x)["suite"] in suites]
        path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
    for stale in ("decision.json", "parity.csv"):
        (run / stale).unlink(missing_ok=True)
    shutil.rmtree(run / "items")
    shutil.rmtree(run / "report_files", ignore_errors=True)
    score_run(RunDir(run))
    render_report(run)
