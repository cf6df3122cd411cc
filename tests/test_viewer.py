"""`evalkit view`: the viewer in a real headless Chromium over the session's real runs, and its guards.

Chromium tests (engine-marked: they read conftest.real_run and its hostile copy) open the runs list and the
real run, filter to "differs from the reference", open an item and find each deployment's output exactly as
the records hold it, compare two real runs and find comparisons.csv's interval, rate three items blind and
find the ratings in scores.csv after `evalkit report`, and render hostile output inert. The quick tests drive
the HTTP guards (paths, token, Host, password) and concurrent reviewers on a small generated run (plumbing:
the same reader code serves both).
"""
from __future__ import annotations

import base64
import csv
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REAL_RUN_REFERENCE

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "docs" / "viewer.png"


# -- a viewer process -----------------------------------------------------------------------------------------


@contextmanager
def viewer(root: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`python -m evalkit view ROOT --port 0` as a user starts it; yields its URL; always stopped."""
    proc = subprocess.Popen([sys.executable, "-m", "evalkit", "view", str(root), "--port", "0", *args],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, start_new_session=True)
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        m = re.search(r"viewer at (http://[^/\s]+/)", line)
        assert m, f"viewer did not start: {line}{proc.stderr.read() if proc.stderr and proc.poll() is not None else ''}"
        threading.Thread(target=lambda: proc.stderr and proc.stderr.read(), daemon=True).start()  # keep the pipe drained
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request with the path sent byte for byte (no client-side normalisation of `..` or %2F)."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Host": f"{host}:{port}", **(headers or {})})
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def token_of(url: str) -> str:
    status, page = raw(url, "GET", "/")
    assert status == 200
    return re.search(rb'name="evalkit-token" content="([^"]+)"', page).group(1).decode()


# -- a small generated run (plumbing for the guards) ------------------------------------------------------------


@pytest.fixture(scope="module")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_viewer import generate

    base = tmp_path_factory.mktemp("viewer-small")
    generate(base, 40, 3)
    return base / "reports"


def _run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if (p / "manifest.json").exists() and not p.is_symlink()]
    return run


def test_paths_outside_the_reports_folder_are_404(small_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "reports"
    shutil.copytree(small_root, root)
    secret = tmp_path / "secret"
    shutil.copytree(_run(root), secret)  # a real run directory outside the folder, reachable only by a link
    (root / "linked").symlink_to(secret)
    run = _run(root).name
    with viewer(root) as url:
        assert raw(url, "GET", f"/api/runs/{run}/overview")[0] == 200
        listed = json.loads(raw(url, "GET", "/api/runs")[1])["runs"]
        assert [r["name"] for r in listed] == [run]  # the symlinked run is not listed
        for path in ["/api/runs/linked/overview", "/api/runs/../secret/overview", "/api/runs/..%2Fsecret/overview",
                     "/api/runs/%2e%2e/overview", "/api/runs/x%2F..%2F..%2Fsecret/overview", f"/api/runs/{run}%2F..%2F..%2Fsecret/overview",
                     "/static/..%2F..%2Fapp.py", "/static/../app.py", "/static/app.py", "/static/%2e%2e%5capp.py",
                     "/api/runs/%00/overview", f"/api/runs/{run}/item?suite=prompts&id=..%2F..%2Fmanifest.json",
                     "/..%2f..%2fetc/passwd", "//etc/passwd", "/api/compare?candidate=..&baseline=linked"]:
            assert raw(url, "GET", path)[0] == 404, path


def test_writes_need_the_token_and_the_host_must_be_local(small_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "reports"
    shutil.copytree(small_root, root)
    run = _run(root)
    body = json.dumps({"rater": "alice"}).encode()
    with viewer(root) as url:
        json_h = {"Content-Type": "application/json"}
        assert raw(url, "POST", f"/api/runs/{run.name}/review/sheet", body, json_h)[0] == 403
        assert raw(url, "POST", f"/api/runs/{run.name}/review/sheet", body, {**json_h, "X-Evalkit-Token": "guess"})[0] == 403
        token = token_of(url)
        assert raw(url, "POST", f"/api/runs/{run.name}/review/sheet", body,
                   {**json_h, "X-Evalkit-Token": token, "Origin": "http://evil.example"})[0] == 403
        assert not (run / "ratings").exists()  # nothing was written by the refused requests
        status, _ = raw(url, "POST", f"/api/runs/{run.name}/review/sheet", body, {**json_h, "X-Evalkit-Token": token})
        assert status == 200 and (run / "ratings" / "browser" / "alice.absolute.csv").is_file()
        # DNS rebinding: a page on another name that resolves here is refused.
        assert raw(url, "GET", "/api/runs", headers={"Host": "evil.example"})[0] == 421
    with viewer(root) as url2:
        assert token_of(url2) != token  # a new token at each start


def test_binding_beyond_loopback_needs_the_flag_and_a_password(small_root: Path) -> None:
    cmd = [sys.executable, "-m", "evalkit", "view", str(small_root), "--port", "0", "--host", "0.0.0.0"]
    env = {k: v for k, v in os.environ.items() if k != "EVALKIT_VIEW_PASSWORD"} | {"PYTHONPATH": str(REPO)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "--allow-remote" in p.stderr
    p = subprocess.run(cmd + ["--allow-remote"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "EVALKIT_VIEW_PASSWORD" in p.stderr
    with viewer(small_root, "--host", "127.0.0.1", env={"EVALKIT_VIEW_PASSWORD": "unused locally"}) as url:
        assert raw(url, "GET", "/api/runs")[0] == 200  # loopback needs no password
    with viewer(small_root, "--host", "0.0.0.0", "--allow-remote", env={"EVALKIT_VIEW_PASSWORD": "s3cret"}) as url:
        url = url.replace("0.0.0.0", "127.0.0.1")
        assert raw(url, "GET", "/api/runs")[0] == 401
        bad = base64.b64encode(b"me:wrong").decode()
        assert raw(url, "GET", "/api/runs", headers={"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(b"me:s3cret").decode()
        assert raw(url, "GET", "/api/runs", headers={"Authorization": f"Basic {good}"})[0] == 200


def test_concurrent_reviewers_lose_no_rating(small_root: Path, tmp_path: Path) -> None:
    """Three reviewers (one of them in two tabs) rate at once; every rating is in rate import's store."""
    from evalkit.rating.aggregate import ratings_frame

    root = tmp_path / "reports"
    shutil.copytree(small_root, root)
    run = _run(root)
    with viewer(root) as url:
        token = token_of(url)
        h = {"Content-Type": "application/json", "X-Evalkit-Token": token}
        sheets = {}
        for rater in ("ann", "bob", "cy"):
            status, body = raw(url, "POST", f"/api/runs/{run.name}/review/sheet", json.dumps({"rater": rater}).encode(), h)
            assert status == 200, body
            sheets[rater] = [o["row_id"] for item in json.loads(body)["items"] for o in item["outputs"]][:12]
        jobs = [(rater, row, 1 + i % 5) for rater, rows in sheets.items() for i, row in enumerate(rows)]
        jobs += [("ann", row, 5) for row in sheets["ann"][6:12]]  # ann's second tab re-rates half of them

        def post(job: tuple[str, str, int]) -> int:
            rater, row, score = job
            return raw(url, "POST", f"/api/runs/{run.name}/review/rate",
                       json.dumps({"rater": rater, "row_id": row, "score": score}).encode(), h)[0]

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(post, jobs)) == {200}
    frame = ratings_frame(run)
    got = {(r.rater_id, r.row_id): int(r.score) for r in frame.itertuples()}
    expected = {(rater, row): 1 + i % 5 for rater, rows in sheets.items() for i, row in enumerate(rows)}
    assert set(got) == set(expected)
    for key, score in expected.items():
        if key[0] == "ann" and key[1] in sheets["ann"][6:12]:
            assert got[key] in (score, 5)  # whichever tab wrote last; never lost
        else:
            assert got[key] == score
    key = json.loads((run / "ratings" / "key.json").read_text())
    assert sorted(e["rater_id"] for e in key["sheets"].values()) == ["ann", "bob", "cy"]


def test_index_follows_a_run_being_written(small_root: Path, tmp_path: Path) -> None:
    from evalkit.store import RunDir
    from evalkit.viewer.index import IndexCache, Query
    from evalkit.viewer.runs import status

    root = tmp_path / "reports"
    shutil.copytree(small_root, root)
    run = _run(root)
    cache = IndexCache()
    before = cache.get(run)
    assert cache.get(run) is before  # cached while nothing changed
    rd = RunDir(run)
    first = rd.records("dep1")[0]
    rec = dict(first, item_id="qa-99999", generation={**first["generation"], "output_text": "a new answer"})
    with rd.writer("dep1") as w:
        w.write_batch([rec])
    assert cache.get(run) is before  # a run being written is re-indexed at most every few seconds
    before.built_at -= 60
    after = cache.get(run)
    assert after is not before and after.page(Query(q="a new answer"))["total"] == 1
    (run / "progress.json").write_text(json.dumps({"started": time.time(), "plan": {"dep1": {"prompts": 50}},
                                                   "done": {"dep1": {"prompts": 41}}, "seconds": {"dep1": {"prompts": 4.1}}}))
    st = status(run)
    assert st["status"] == "running" and abs(st["progress"] - 41 / 50) < 1e-9
    assert status(run, now=time.time() + 3600)["status"] == "partial"  # scored earlier, items left, nobody writing


def test_saved_index_answers_as_the_built_one(small_root: Path, tmp_path: Path) -> None:
    """The index kept in the cache dir gives the same pages and items; a changed run is not read from it."""
    from evalkit.store import RunDir
    from evalkit.viewer.index import RunIndex, Query

    root = tmp_path / "reports"
    shutil.copytree(small_root, root)
    run = _run(root).resolve()
    files = (tmp_path / "i.json", tmp_path / "i.npz")
    built = RunIndex(run)
    built.save(files)
    loaded = RunIndex.load(run, files)
    assert loaded is not None
    for q in (Query(), Query(differs=True), Query(failed=True, category="qa"), Query(q="river"),
              Query(sort="dep1|prompts:contains", desc=True, offset=7)):
        assert json.dumps(loaded.page(q)) == json.dumps(built.page(q))
    for key in built.keys[:10]:
        assert json.dumps(loaded.item(*key)) == json.dumps(built.item(*key))
    rd = RunDir(run)
    with rd.writer("dep2") as w:
        w.write_batch([dict(rd.records("dep2")[0], item_id="qa-77777")])
    assert RunIndex.load(run, files) is None


# -- Chromium over the session's real runs ----------------------------------------------------------------------

EXTRA_HOSTILE = [
    '<a href="javascript:alert(3)">click me</a>',
    "x" * 20000,  # one very long line
    "bell\x07 escape\x1b[31m null-ish\x01 tail",
    "user \u202egnp.exe\u202c file \u2066isolate\u2069",
    "<iframe src=\"https://example.com/\"></iframe><link rel=stylesheet href=https://example.com/x.css>",
    "<img src=https://example.com/track.png>",
]


def _hostile_copy(hostile_run: Path, root: Path) -> Path:
    """hostile_run (markup in the non-reference QA answers) plus more: javascript: links, a very long line,
    control characters, bidi overrides and remote resources, in the non-reference reasoning answers and in one
    prompt (records edited in a copy; the viewer reads outputs from records)."""
    run = root / hostile_run.name
    shutil.copytree(hostile_run, run)
    other = next(d for d in json.loads((run / "manifest.json").read_text())["deployment_order"] if d != REAL_RUN_REFERENCE)
    for dep in (other, REAL_RUN_REFERENCE):
        path = run / "records" / f"{dep}.jsonl"
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r["suite"] == "prompts" and r["category"] == "reasoning":
                if dep == other:
                    r["generation"]["output_text"] = "\n".join(EXTRA_HOSTILE)
                else:
                    r["prompt"] = r["prompt"] + " " + EXTRA_HOSTILE[0] + "<script>window.pwned=1</script>"
            out.append(json.dumps(r, ensure_ascii=False))
        path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return run


def _wait(cdp: Any, session: str, expr: str, timeout: float = 60) -> Any:
    from test_report import evaluate

    deadline = time.monotonic() + timeout
    while True:
        value = evaluate(cdp, session, expr)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expr}: {evaluate(cdp, session, 'document.body.innerText.slice(0, 2000)')}")
        time.sleep(0.05)


def _go(cdp: Any, session: str, hash_: str, view: str) -> None:
    from test_report import evaluate

    evaluate(cdp, session, f"document.body.dataset.loading = '1'; location.hash = {json.dumps(hash_)}; 1")
    _wait(cdp, session, f"document.body.dataset.loading === '0' && document.body.dataset.view === {json.dumps(view)}")
    assert evaluate(cdp, session, "document.querySelector('main .error') === null"), \
        evaluate(cdp, session, "document.querySelector('main .error').textContent")


@pytest.mark.engine
def test_viewer_in_chromium(real_run: Path, hostile_run: Path, tmp_path: Path) -> None:
    from test_report import SCREEN, chromium, evaluate, open_page, problems, requests

    from evalkit.store import RunDir

    root = tmp_path / "reports"
    root.mkdir()
    real = root / real_run.name
    shutil.copytree(real_run, real)
    hostile = _hostile_copy(hostile_run, root)
    manifest = json.loads((real / "manifest.json").read_text())
    deps = manifest["deployment_order"]
    other = next(d for d in deps if d != REAL_RUN_REFERENCE)
    with viewer(root) as url, chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, url)
        _wait(cdp, session, "document.body.dataset.loading === '0'")
        listed = evaluate(cdp, session, "[...document.querySelectorAll('#runs tr[data-run]')].map(r => r.dataset.run)")
        assert sorted(listed) == sorted([real.name, hostile.name])
        row_text = evaluate(cdp, session, f"document.querySelector('#runs tr[data-run=\"{real.name}\"]').innerText")
        assert "finished" in row_text and REAL_RUN_REFERENCE in row_text and "run.yaml" in row_text

        # One run: decision first, then the matrix; filter to "differs from the reference".
        _go(cdp, session, f"#/run/{real.name}", "run")
        decision = json.loads((real / "decision.json").read_text())
        assert evaluate(cdp, session, "document.getElementById('decision-summary').textContent") == decision["summary"]
        t0 = time.monotonic()
        evaluate(cdp, session, "document.body.dataset.loading='1'; document.querySelector('input[name=differs]').click(); 1")
        _wait(cdp, session, "document.body.dataset.loading === '0' && location.hash.includes('differs=1')")
        filter_s = time.monotonic() - t0
        shot = cdp.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": SCREEN[0], "height": 1500, "scale": 1})
        run_dir = RunDir(real)
        recs = {d: {(r["suite"], str(r["item_id"])): r for r in run_dir.records(d) if r["suite"] != "cost"} for d in deps}
        expected = sorted(k for k, r in recs[other].items() if k[0] in ("prompts", "humaneval", "longcontext")
                          and k in recs[REAL_RUN_REFERENCE] and "generation" in r
                          and r["generation"]["output_text"] != recs[REAL_RUN_REFERENCE][k]["generation"]["output_text"])
        expected += sorted(k for k, r in recs[other].items() if k[0] == "mmlu" and r["pred"] != recs[REAL_RUN_REFERENCE][k]["pred"])
        evaluate(cdp, session, "1")
        _go(cdp, session, f"#/run/{real.name}?differs=1&suite=prompts", "run")
        shown = evaluate(cdp, session, "[...document.querySelectorAll('table.matrix tr[data-item]')].map(r => [r.dataset.suite, r.dataset.item])")
        assert sorted(map(tuple, shown)) == [k for k in expected if k[0] == "prompts"]
        assert evaluate(cdp, session, "[...document.querySelectorAll('table.matrix tr[data-item]')].every("
                                      "r => r.querySelector('td[data-differs=\"1\"]'))")
        assert evaluate(cdp, session, "document.querySelectorAll('table.matrix .d').length") > 0  # token differences marked

        # An item: every deployment's output exactly as recorded.
        suite, item_id = shown[0]
        evaluate(cdp, session, "document.body.dataset.loading='1'; document.querySelector('table.matrix tr[data-item] td.meta a').click(); 1")
        _wait(cdp, session, "document.body.dataset.loading === '0' && document.body.dataset.view === 'item'")
        for d in deps:
            text = evaluate(cdp, session, f"document.querySelector('.card[data-dep=\"{d}\"] .output').textContent")
            assert text == recs[d][(suite, item_id)]["generation"]["output_text"], d
        assert evaluate(cdp, session, "document.getElementById('prompt').textContent") == recs[REAL_RUN_REFERENCE][(suite, item_id)]["prompt"]
        # A perplexity chunk's token ids (records v2 keep them in a side file): as evalkit.load_run reads them.
        chunk = sorted(k[1] for k in recs[other] if k[0] == "perplexity" and "skipped" not in recs[other][k])[0]
        _go(cdp, session, f"#/item/{real.name}?suite=perplexity&id={chunk}", "item")
        ids = evaluate(cdp, session, f"document.querySelector('.card[data-dep=\"{other}\"] .ids').textContent")
        from evalkit import load_run

        assert [int(x) for x in ids.split()] == [int(t) for t in load_run(real).token_arrays(other, chunk)["token"]]

        # Run against run: the hostile copy's non-reference deployment against the real run's reference gives the
        # hostile run's own comparisons.csv (same reference records, same suite code, same statistics).
        _go(cdp, session, f"#/compare?candidate={hostile.name}&baseline={real.name}&pair={other}%7C{REAL_RUN_REFERENCE}", "compare")
        shown_rows = evaluate(cdp, session, f"""[...document.querySelectorAll('table.compare[data-dep="{other}"] tr[data-metric]')].map(r => (
            {{suite: r.dataset.suite, category: r.dataset.category, metric: r.dataset.metric,
              low: r.querySelector('.interval').dataset.low, high: r.querySelector('.interval').dataset.high}}))""")
        with (hostile_run / "comparisons.csv").open(encoding="utf-8") as f:
            csv_rows = {(r["suite"], r["category"], r["metric"]): r for r in csv.DictReader(f) if r["deployment"] == other}
        matched = 0
        for r in shown_rows:
            c = csv_rows.get((r["suite"], r["category"], r["metric"]))
            if c is None or r["suite"] == "perplexity":
                continue  # perplexity pairs chunks through the run's KLD reference: compared below only by presence
            for side in ("low", "high"):
                want = c[f"ci_{side}"]
                assert (r[side] == "") == (want == ""), r
                if want:
                    assert abs(float(r[side]) - float(want)) <= 1e-12 * max(1.0, abs(float(want))), (r, want)
            matched += 1
        assert matched >= 5 and ("prompts", "qa", "contains") in {(r["suite"], r["category"], r["metric"]) for r in shown_rows}
        # Same deployment across the two runs: its QA answers became markup, so outcomes changed.
        _go(cdp, session, f"#/compare?candidate={hostile.name}&baseline={real.name}", "compare")
        changed = evaluate(cdp, session, "[...document.querySelectorAll('table.changed tr td:first-child')].map(t => t.textContent)")
        ref_rows = [r for (s, i), r in recs[other].items() if s == "prompts" and r["category"] == "qa"]
        assert changed and all(c.startswith("prompts / qa-") or c.startswith("prompts / reasoning-") for c in changed)
        assert len(ref_rows) >= 1

        # Hostile output: the matrix and an item of the hostile copy render it as text; nothing runs or loads.
        cdp.events.clear()
        _go(cdp, session, f"#/run/{hostile.name}?suite=prompts&category=reasoning", "run")
        matrix_text = evaluate(cdp, session, "document.querySelector('table.matrix').innerText")
        first_reasoning = evaluate(cdp, session, "document.querySelector('table.matrix tr[data-item]').dataset.item")
        _go(cdp, session, f"#/item/{hostile.name}?suite=prompts&id={first_reasoning}", "item")
        item_text = evaluate(cdp, session, "document.querySelector('main').innerText")
        _go(cdp, session, f"#/run/{hostile.name}?suite=prompts&category=qa", "run")
        qa_text = evaluate(cdp, session, "document.querySelector('table.matrix').innerText")
        cdp.drain(1.0)
        page_state = evaluate(cdp, session, """(() => ({
            pwned: window.pwned === 1 || document.title === 'pwned',
            scripts: [...document.scripts].map(s => s.src),
            foreign: document.querySelectorAll('main img, main svg, main iframe, main link, main a[href^="javascript"], main [onerror], main [onload]').length,
            hrefs: [...document.querySelectorAll('a')].map(a => a.getAttribute('href')).filter(h => !h.startsWith('#/')),
        }))()""")
        events = list(cdp.events)
    assert page_state == {"pwned": False, "scripts": [f"{url}static/app.js"], "foreign": 0, "hrefs": []}
    assert "<script>document.title='pwned'</script>" in qa_text and "<img src=x onerror=alert(1)>" in qa_text
    assert '<a href="javascript:alert(3)">click me</a>' in item_text and "x" * 20000 in item_text
    assert "\u202e" not in item_text and "U+202E" in item_text and "\u241b" in item_text  # overrides and ESC shown as marks
    assert "<iframe" in item_text and "<script>window.pwned=1</script>" in item_text
    assert "javascript:alert(3)" in matrix_text
    assert problems(events) == []  # no console error, no exception, no dialog
    assert [u for u in requests(events) if not u.startswith(url)] == []  # no request left the page
    assert filter_s < 10  # a figure for the note; the benchmark measures the big run
    SCREENSHOT.parent.mkdir(exist_ok=True)
    SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))


@pytest.mark.engine
def test_review_three_items_in_chromium_then_report(real_run: Path, tmp_path: Path) -> None:
    """A reviewer rates three outputs blind in the browser; after `evalkit report`, scores.csv has them."""
    from test_report import chromium, evaluate, open_page, problems

    root = tmp_path / "reports"
    root.mkdir()
    run = root / real_run.name
    shutil.copytree(real_run, run)
    (run / "ratings").exists() and shutil.rmtree(run / "ratings")
    with viewer(root) as url, chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, url + f"#/review/{run.name}?rater=dana")
        _wait(cdp, session, "document.body.dataset.loading === '0' && document.querySelectorAll('.review-item').length > 0")
        labels = evaluate(cdp, session, "[...document.querySelectorAll('.review-item')].slice(0, 3).map(i => "
                                        "[...i.querySelectorAll('.output')].map(o => o.dataset.letter).join(''))")
        assert all(lbl.startswith("AB") for lbl in labels)  # outputs shown as A, B, … never by deployment
        page_text = evaluate(cdp, session, "document.querySelector('main').innerText")
        deps = json.loads((run / "manifest.json").read_text())["deployment_order"]
        assert not any(re.search(rf"\b{re.escape(d)}\b", page_text) for d in deps)  # blind
        chosen = []
        for n, score in enumerate((5, 2, 4)):
            row = evaluate(cdp, session, f"document.querySelectorAll('.review-item')[{n}].querySelector('.output').dataset.row")
            evaluate(cdp, session, f"document.querySelector('.output[data-row=\"{row}\"] button[data-score=\"{score}\"]').click(); 1")
            _wait(cdp, session, f"document.getElementById('review-status').textContent.startsWith('saved {row} = {score}')")
            chosen.append((row, score))
        events = list(cdp.events)
    assert problems(events) == []
    # De-blind through the key the export wrote (not through the viewer), then let `evalkit report` score it.
    key = json.loads((run / "ratings" / "key.json").read_text())
    (entry,) = [e for e in key["sheets"].values() if e["rater_id"] == "dana"]
    rated = [(entry["rows"][row]["deployment"], entry["rows"][row]["category"], score) for row, score in chosen]
    p = subprocess.run([sys.executable, "-m", "evalkit", "report", str(run)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    with (run / "scores.csv").open(encoding="utf-8") as f:
        ratings = [r for r in csv.DictReader(f) if r["suite"] == "ratings" and r["metric"] == "rating" and r["category"] == "all"]
    got = {r["deployment"]: (float(r["value"]), int(r["n"])) for r in ratings}
    want: dict[str, list[int]] = {}
    for dep, _, score in rated:
        want.setdefault(dep, []).append(score)
    assert got == {d: (sum(s) / len(s), len(s)) for d, s in want.items()}
    # The browser's sheet is a sheet `rate import` reads like any exported one.
    p = subprocess.run([sys.executable, "-m", "evalkit", "rate", "import", str(run), str(run / "ratings" / "browser" / "dana.absolute.csv")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert p.returncode == 0 and "unchanged 3/" in p.stdout, p.stdout + p.stderr
