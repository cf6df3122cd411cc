"""The report: every section from a realistic run, Markdown mirroring HTML, and hostile model output kept inert.

The browser test opens report.html in headless Chromium over the DevTools protocol: no console errors,
no script ran (title unchanged, no dialog), the injected HTML is visible as text, the plots decode, nothing
is fetched from the network; it saves the first screen to test-artifacts/report-first-screen.png.
"""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import require_module, require_tool
from evalkit.report import cells as C
from evalkit.report.render import TEMPLATES, context, md_table, render_report
from evalkit.results import Run
from fixtures_run import DEPLOYMENTS, FP8, HOSTILE, Q4, REFERENCE, build_run, shared_runs

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
SCREEN = (1280, 900)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (run,) = shared_runs(tmp_path_factory, 1)
    render_report(run)
    return run


@pytest.fixture(scope="module")
def prompts_only_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the pipeline writes today (no ledger or suite provenance in the manifest), prompts suite only."""
    run = build_run(tmp_path_factory.mktemp("prompts-only"), suites=("prompts",), ratings=False, proposed_keys=False)
    render_report(run)
    return run


# -- formatting ---------------------------------------------------------------------------------


def test_formats_and_marks() -> None:
    assert C.fmt(0.61, "pct") == "61.0%"
    assert C.fmt_diff(-0.07, -0.15, -0.02, "pct") == "−7.0 pts [−15.0, −2.0]"
    assert C.fmt_diff(0.5, None, None, "rating") == "+0.50 (no interval)"
    assert C.fmt(float("nan")) == "–" and C.fmt(0.0025, "ms") == "2 ms"
    assert C.mark_for(-0.1, -0.2, -0.05, True, +1) == "worse"
    assert C.mark_for(-0.1, -0.2, -0.05, True, -1) == "better"  # lower is better (PPL, KLD, flips)
    assert C.mark_for(-0.1, -0.2, 0.05, False, +1) == "same"
    assert C.mark_for(0.9, None, None, False, -1) == "na"


def test_template_never_trusts_text() -> None:
    source = re.sub(r"\{#.*?#\}", "", (TEMPLATES / "report.html.j2").read_text(), flags=re.S)  # drop comments
    assert "|safe" not in source.replace(" ", "") and "Markup(" not in source
    assert "script-src" not in source and "default-src 'none'" in source


# -- the full run --------------------------------------------------------------------------------


def test_verdict_traces_to_comparisons(full_run: Path) -> None:
    run = Run(full_run)
    ctx = context(run)
    v = ctx["verdict"]
    assert [r[0].value for r in v.rows] == list(DEPLOYMENTS)
    assert v.header[1:] == ["code rating", "reasoning rating", "translation rating", "QA rating", "BLEU en-de",
                            "BLEU en-zh", "PPL", "KLD", "MMLU accuracy", "MMLU flips", "HumanEval pass@1",
                            "repetition @8K", "pass-key recall"]
    assert v.groups == [("human rating (1–5)", 4), ("BLEU", 2), ("perplexity", 2), ("MMLU", 2), ("HumanEval", 1),
                        ("long context", 2)]
    cell = {(r[0].value, h): c for r in v.rows for h, c in zip(v.header, r)}
    comps = run.comparisons.set_index(["deployment", "suite", "category", "metric"])
    mmlu = comps.loc[(Q4, "mmlu", "all", "accuracy")]
    assert cell[(Q4, "MMLU accuracy")].value == C.fmt(mmlu["value"], "pct")
    assert cell[(Q4, "MMLU accuracy")].diff == C.fmt_diff(mmlu["diff"], mmlu["ci_low"], mmlu["ci_high"], "pct")
    r2w = round(comps.loc[(Q4, "mmlu", "all", "flips_right_to_wrong"), "value"] * 100)
    assert cell[(Q4, "MMLU flips")].diff.startswith(f"{r2w} ✓→✗")
    assert cell[(REFERENCE, "MMLU accuracy")].diff == "" and cell[(REFERENCE, "MMLU accuracy")].mark is None
    # Q4 loops past 4K tokens in the fixture: one item per length, so no interval, and the mark says so.
    assert cell[(Q4, "repetition @8K")].mark == "na"
    assert cell[(Q4, "KLD")].mark == "worse"
    from evalkit.rating.aggregate import aggregate

    absolute = aggregate(full_run)["absolute"].set_index(["deployment", "category"])
    human = cell[(Q4, "code rating")]
    assert human.value == f"{absolute.loc[(Q4, 'code'), 'mean']:.2f}" and human.mark == "worse"  # fixture: Q4 rated lower
    sure = {s.deployment: s for s in ctx["sure"]}
    assert set(sure) == {FP8, Q4} and sure[Q4].significant > sure[FP8].significant >= 1
    assert re.match(r"\d+ of \d+ differences are distinguishable from noise; biggest: ", sure[Q4].text)


def test_every_section_and_plot(full_run: Path) -> None:
    ctx = context(Run(full_run))
    keys = [s.key for s in ctx["sections"]]
    assert keys == ["prompts", "human", "perplexity", "mmlu", "longcontext", "humaneval", "cost", "ledger", "hardware",
                    "environment", "numbers"]
    plots = {p.key for s in ctx["sections"] for p in s.plots}
    assert plots == {"prompts-categories", "human-ratings", "perplexity", "mmlu-subjects", "longcontext-lengths",
                     "longcontext-recall-heatmap", "cost", "ledger"}
    for p in (full_run / "report_files").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stem in plots
    tables = {t.key: t for s in ctx["sections"] for t in s.tables + s.details}
    # Cost tables have MOTIVATION's shape: deployments x concurrency levels.
    assert tables["cost-per_request_tokens_per_s"].header == ["deployment", "1", "4", "8", "16"]
    assert tables["cost-ttft_median_s"].rows[0][1].value.endswith(" ms")
    ledger = tables["ledger"]
    assert [r[0].value for r in ledger.rows] == list(DEPLOYMENTS) and all("GB" in r[7].value for r in ledger.rows)
    assert {r[0].value for r in tables["human-agreement"].rows} == {"absolute", "pairwise"}
    assert any(r[0].value == "prompts" and r[3].value == "23/24 identical" for r in tables["parity"].rows)
    sigs = {r[0].value: r[1].value for r in tables["signatures"].rows}
    assert sigs["prompts · bleu en-zh"].startswith("nrefs:1|") and "tok:zh" in sigs["prompts · bleu en-zh"]
    engines = {r[0].value: r for r in tables["engines"].rows}
    assert engines[Q4][2].value == "gguf:tokenizer.chat_template" and engines[Q4][6].value == "2.4 s"
    html = (full_run / "report.html").read_text()
    assert "FP8 requested but not real here" in html.split('<section id="verdict">')[0]  # warning before the verdict
    assert html.count("data:image/png;base64,") == len(plots)


def test_html_escapes_model_output(full_run: Path) -> None:
    html = (full_run / "report.html").read_text()
    assert "<script" not in html and "<svg" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&#34;&gt;&lt;svg onload=alert(2)&gt;" in html


def test_markdown_mirrors_tables(full_run: Path) -> None:
    md = (full_run / "report.md").read_text()
    ctx = context(Run(full_run))
    for t in [ctx["verdict"]] + [t for s in ctx["sections"] for t in s.tables + s.details]:
        rows = md_table(t)
        assert all(line in md for line in rows if line.startswith("| ")), t.key  # every row, cell for cell
    for p in (full_run / "report_files").glob("*.png"):
        assert f"](report_files/{p.name})" in md
    # Model output only inside fenced blocks; outside them any HTML is escaped.
    outside = re.sub(r"(`{3,})text\n.*?\n\1", "", md, flags=re.S)
    assert "<script" not in outside and "<img" not in outside and "<svg" not in outside
    assert HOSTILE[0] in md  # verbatim inside a fence, where Markdown never interprets it


def test_prompts_only_run_renders(prompts_only_run: Path) -> None:
    ctx = context(Run(prompts_only_run))
    assert [s.key for s in ctx["sections"]] == ["prompts", "hardware", "environment", "numbers"]
    assert [p.key for s in ctx["sections"] for p in s.plots] == ["prompts-categories"]
    assert ctx["verdict"].header == ["deployment", "code pass@1", "reasoning correct", "translation chrF en-de",
                                     "translation chrF en-zh", "QA correct", "BLEU en-de", "BLEU en-zh"]
    assert ctx["verdict"].groups == [("prompts (automatic)", 5), ("BLEU", 2)]
    sigs = {r[0].value: r[1].value for s in ctx["sections"] for t in s.tables if t.key == "signatures" for r in t.rows}
    assert sigs["prompts · chrf en-de"].startswith("nrefs:1|")  # from the metrics when the manifest has no describe()
    assert "report.md" in {p.name for p in prompts_only_run.iterdir()}
    assert sorted(p.name for p in (prompts_only_run / "report_files").iterdir()) == ["prompts-categories.png"]


# -- headless Chromium over the DevTools protocol ---------------------------------------------------


class Cdp:
    """The few DevTools protocol calls the test needs, over one browser websocket (flattened sessions)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("method") == method:
                    return e
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def drain(self, seconds: float) -> None:
        """Collect events for a moment (late console messages, dialogs)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-port=0"]


@contextmanager
def chromium(profile: Path) -> Iterator[Cdp]:
    exe = require_tool("chromium", "chromium-browser", "google-chrome", why="renders the HTML report")
    profile.mkdir(parents=True, exist_ok=True)
    log = (profile.parent / "chromium.log").open("wb")
    proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes "<port>\n<browser ws path>" once listening
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {(profile.parent / 'chromium.log').read_text()[-2000:]}")
            time.sleep(0.1)
        port, path = port_file.read_text().split()
        connect = require_module("websockets.sync.client", "drives Chromium (dev extra)").connect

        with connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=20) as ws:
            yield Cdp(ws)
    finally:
        # Its own session: the group id is the browser's pid, so this ends its renderers and nothing else.
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def open_page(cdp: Cdp, url: str) -> str:
    target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
    session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        cdp.call(f"{domain}.enable", session)
    cdp.call("Emulation.setDeviceMetricsOverride", session, width=SCREEN[0], height=SCREEN[1], deviceScaleFactor=1,
             mobile=False)
    cdp.events.clear()
    cdp.call("Page.navigate", session, url=url)
    cdp.wait_for("Page.loadEventFired")
    cdp.drain(1.0)
    return session


def evaluate(cdp: Cdp, session: str, expression: str) -> Any:
    res = cdp.call("Runtime.evaluate", session, expression=expression, returnByValue=True, awaitPromise=True)
    assert "exceptionDetails" not in res, res
    return res["result"].get("value")


def problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions, CSP violations and dialogs seen while the page was open."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(f"console.{p['type']}: {p.get('args')}")
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text')}")
        elif m == "Page.javascriptDialogOpening":
            out.append(f"dialog: {p.get('message')}")
    return out


def requests(events: list[dict[str, Any]]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]


def test_harness_sees_a_script_that_runs(tmp_path: Path) -> None:
    """The checks below can fail: on a page without the report's CSP, the same payload runs and is seen."""
    page = tmp_path / "unsafe.html"
    page.write_text(f"<!doctype html><title>report</title><body>{HOSTILE[0]}<script>console.error('boom')</script>")
    with chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, page.as_uri())
        assert evaluate(cdp, session, "document.title") == "pwned"
        assert any("boom" in p for p in problems(cdp.events))


def test_report_is_inert_in_chromium(full_run: Path, tmp_path: Path) -> None:
    url = (full_run / "report.html").as_uri()
    with chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, url)
        title = evaluate(cdp, session, "document.title")
        state = evaluate(cdp, session, """(() => ({
            scripts: document.scripts.length,
            svgs: document.querySelectorAll('svg').length,
            onerror: document.querySelectorAll('[onerror],[onload]').length,
            text: document.body.innerText,
            images: Array.from(document.images).map(i => ({src: i.src.slice(0, 22), w: i.naturalWidth, ok: i.complete})),
            warnTop: document.querySelector('.warn').getBoundingClientRect().top,
            verdictTop: document.querySelector('#t-verdict').getBoundingClientRect().top,
            verdictBottom: document.querySelector('#t-verdict').getBoundingClientRect().bottom,
            verdictOverflow: (b => b.scrollWidth - b.clientWidth)(document.querySelector('#t-verdict').parentElement),
        }))()""")
        shot = cdp.call("Page.captureScreenshot", session, format="png",
                        clip={"x": 0, "y": 0, "width": SCREEN[0], "height": SCREEN[1], "scale": 1})
        events = list(cdp.events)
    ARTIFACTS.mkdir(exist_ok=True)
    png = base64.b64decode(shot["data"])
    (ARTIFACTS / "report-first-screen.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

    assert title == f"evalkit report — {Run(full_run).run_id}"  # not 'pwned': the injected script never ran
    assert problems(events) == []
    assert state["scripts"] == 0 and state["svgs"] == 0 and state["onerror"] == 0
    for payload in HOSTILE:
        assert payload in state["text"], payload  # shown as text
    assert len(state["images"]) == 8
    assert all(i["src"] == "data:image/png;base64," and i["ok"] and i["w"] > 300 for i in state["images"])
    # The warning and the whole verdict are on the first screen, without scrolling sideways.
    assert 0 <= state["warnTop"] < state["verdictTop"] < state["verdictBottom"] < SCREEN[1]
    assert state["verdictOverflow"] <= 0
    assert [u for u in requests(events) if not u.startswith(("file:", "data:"))] == []  # nothing from the network
