// evalkit view: runs list, one run's item matrix, item drill-down, run against run, blind review.
// Every piece of model output, prompt or run metadata is put in the page as text (textContent / text
// nodes), never parsed as HTML; links are built here from '#/' routes only. No dependencies.
"use strict";

const TOKEN = document.querySelector('meta[name="evalkit-token"]').content;
const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");

// ---------------------------------------------------------------- DOM helpers (text only)

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "cls") node.className = v;
    else if (k === "href") node.setAttribute("href", safeHash(v));
    else if (k === "title") node.title = String(v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    else if (["type", "value", "checked", "placeholder", "min", "max", "selected", "disabled", "name", "id", "size"].includes(k)) node[k] = v;
    else throw new Error("el: unsupported property " + k);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function safeHash(h) { // only in-page routes: anything else (javascript:, http:) is refused
  h = String(h);
  if (!h.startsWith("#/")) throw new Error("refusing link " + h);
  return h;
}

// Control characters and bidirectional overrides are shown as visible marks, so text cannot hide or
// reorder what follows it (RTL override spoofing); everything else is plain text.
const SPECIAL = /[\u0000-\u0008\u000b-\u001f\u007f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
function visible(text) {
  const frag = document.createDocumentFragment();
  text = String(text ?? "");
  let last = 0;
  for (const m of text.matchAll(SPECIAL)) {
    if (m.index > last) frag.append(document.createTextNode(text.slice(last, m.index)));
    const code = m[0].charCodeAt(0);
    const label = code < 0x20 ? String.fromCharCode(0x2400 + code) : code === 0x7f ? "\u2421" : "U+" + code.toString(16).toUpperCase().padStart(4, "0");
    frag.append(el("span", {cls: "ctl", text: label, title: "control character " + label}));
    last = m.index + m[0].length;
  }
  if (last < text.length) frag.append(document.createTextNode(text.slice(last)));
  return frag;
}

function segmentsNode(segments) { // [[text, differs], ...] from the server's token diff
  const span = el("span");
  for (const [text, d] of segments) span.append(d ? el("span", {cls: "d"}, visible(text)) : visible(text));
  return span;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toPrecision(digits);
  return String(x);
}

async function api(path, body) {
  const opts = {credentials: "same-origin", headers: {}};
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["content-type"] = "application/json";
    opts.headers["x-evalkit-token"] = TOKEN;
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  const data = await res.json().catch(() => ({error: res.statusText}));
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => u.append(k, x));
    else if (v !== "" && v !== false && v !== undefined && v !== null) u.set(k, v === true ? "1" : String(v));
  }
  return u.toString();
}

function route() {
  const h = location.hash || "#/";
  const [path, query] = h.slice(1).split("?");
  return {parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "")};
}

function setCrumbs(...links) {
  crumbs.replaceChildren(...links.map(([text, href]) => href ? el("a", {href, text}) : el("span", {text})));
}

function busy(on) { document.body.dataset.loading = on ? "1" : "0"; }

function fail(err) {
  main.replaceChildren(el("p", {cls: "error", text: String(err && err.message || err)}));
  busy(false);
}

// ---------------------------------------------------------------- tables from the report (text cells)

function statTable(t) {
  const table = el("table", {cls: "stats", data: {key: t.key}});
  table.append(el("tr", {}, t.header.map((h) => el("th", {text: h}))));
  for (const row of t.rows) {
    table.append(el("tr", {}, row.map((c) => el("td", {title: c.note || null, cls: c.mark && c.mark !== "same" && c.mark !== "na" ? "sig" : null},
      el("div", {text: [c.value, c.interval].filter(Boolean).join(" ")}),
      c.delta || c.delta_ci ? el("div", {cls: "muted", text: (c.delta ? "Δ " + c.delta + " " : "") + (c.delta_ci || "") + (c.symbol ? " " + c.symbol : "")}) : null))));
  }
  return el("div", {}, el("h2", {text: t.title}), el("div", {cls: "scroll"}, table), t.caption ? el("p", {cls: "muted", text: t.caption}) : null);
}

// ---------------------------------------------------------------- runs list

let refreshTimer = null;

async function showRuns() {
  setCrumbs();
  const data = await api("/api/runs");
  const chosen = new Set();
  const compareBtn = el("button", {text: "Compare the two selected runs", disabled: true, onclick: () => {
    const [a, b] = [...chosen].sort(); // older run as the baseline
    location.hash = "#/compare?" + qs({baseline: a, candidate: b});
  }});
  const table = el("table", {cls: "runs", id: "runs"});
  table.append(el("tr", {}, ["", "run", "created", "config", "deployments", "reference", "recommendation", "status"].map((h) => el("th", {text: h}))));
  for (const r of data.runs) {
    const box = el("input", {type: "checkbox", onchange: (e) => {
      e.target.checked ? chosen.add(r.name) : chosen.delete(r.name);
      compareBtn.disabled = chosen.size !== 2;
    }});
    const status = el("td", {cls: "status-" + r.status}, el("span", {text: r.status}));
    if (r.status === "running" && r.progress !== null && r.progress !== undefined) status.append(" ", el("progress", {value: r.progress, max: 1}));
    if (r.line && r.line !== r.status) status.append(el("div", {cls: "muted", text: r.line}));
    table.append(el("tr", {data: {run: r.name}},
      el("td", {}, box),
      el("td", {}, el("a", {href: "#/run/" + encodeURIComponent(r.name), text: r.run_id})),
      el("td", {text: r.created || ""}), el("td", {text: r.config || ""}),
      el("td", {text: (r.deployments || []).join(", ")}), el("td", {text: r.reference || ""}),
      el("td", {title: r.decision || null, text: r.recommended || (r.decision ? "none qualifies" : "")}), status));
  }
  main.replaceChildren(el("h1", {text: "Runs in " + data.root}),
    data.runs.length ? table : el("p", {cls: "muted", text: "No run directories here yet."}), el("p", {}, compareBtn, " ",
      el("a", {href: "#/trends", id: "trends-link", text: "Trends over runs"})));
  clearTimeout(refreshTimer);
  if (data.runs.some((r) => r.status === "running")) refreshTimer = setTimeout(() => { if (route().parts.length === 0) render(); }, 5000);
}

// ---------------------------------------------------------------- one run

async function showRun(name, params) {
  setCrumbs([name, "#/run/" + encodeURIComponent(name)], ["review", "#/review/" + encodeURIComponent(name)]);
  const state = Object.fromEntries(params.entries());
  const limit = 50, offset = parseInt(state.offset || "0", 10) || 0;
  const t0 = performance.now();
  const pageP = api(`/api/runs/${encodeURIComponent(name)}/items?` + qs({...state, offset, limit}));  // both at once
  pageP.catch(() => {});  // awaited below; an early failure must not be reported as unhandled
  const ov = await api(`/api/runs/${encodeURIComponent(name)}/overview`);
  const f = ov.facets;
  const head = [el("h1", {text: "Run " + ov.run_id})];
  head.push(el("p", {cls: "muted", text: `reference ${ov.reference} · ${f.n_items} items · created ${ov.created || "?"}`}));
  if (ov.decision) {
    head.push(el("h2", {text: "Decision"}), el("p", {id: "decision-summary", text: ov.decision.summary}));
    const change = [].concat(ov.decision.what_would_change || []).filter(Boolean);
    if (change.length) head.push(el("p", {cls: "muted", text: "What would change it: " + change.join("; ")}));
    ov.decision.tables.forEach((t) => head.push(statTable(t)));
  }
  if (ov.verdict) head.push(statTable(ov.verdict));
  if (ov.sureness.length) head.push(el("ul", {}, ov.sureness.map((s) => el("li", {text: s.deployment + ": " + s.text}))));
  ov.errors.forEach((e) => head.push(el("p", {cls: "error", text: e})));

  const go = (changes) => { location.hash = `#/run/${encodeURIComponent(name)}?` + qs({...state, offset: "", ...changes}); };
  const select = (key, label, options) => el("label", {}, label + " ",
    el("select", {name: key, onchange: (e) => go({[key]: e.target.value})},
      el("option", {value: "", text: "all"}), options.map((o) => el("option", {value: o, text: o, selected: state[key] === o}))));
  const check = (key, label) => el("label", {}, el("input", {type: "checkbox", name: key, checked: state[key] === "1", onchange: (e) => go({[key]: e.target.checked ? "1" : ""})}), " " + label);
  const search = el("input", {type: "search", name: "q", value: state.q || "", placeholder: "search prompts and outputs"});
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") go({q: search.value}); });
  const controls = el("div", {cls: "controls"},
    select("suite", "suite", f.suites), select("category", "category", f.categories),
    select("deployment", "deployment", f.deployments.filter((d) => d !== f.reference)),
    check("differs", "differs from the reference"), check("flipped", "flipped"), check("failed", "failed"),
    search, el("button", {text: "search", onclick: () => go({q: search.value})}),
    select("sort", "sort by", f.sorts), check("desc", "descending"));
  const matrixBox = el("div", {id: "matrix"}, el("p", {cls: "muted", text: "Loading items…"}));
  main.replaceChildren(...head, el("h2", {text: "Items"}), controls, matrixBox);

  const page = await pageP;
  document.body.dataset.itemsMs = String(Math.round(performance.now() - t0));
  const deps = f.deployments;
  const table = el("table", {cls: "matrix", data: {total: page.total}});
  table.append(el("tr", {}, el("th", {cls: "meta", text: "item"}), deps.map((d) => el("th", {text: d + (d === f.reference ? " (reference)" : "")}))));
  for (const row of page.rows) {
    const link = el("a", {href: `#/item/${encodeURIComponent(name)}?` + qs({suite: row.suite, id: row.item_id}), text: row.suite + " / " + row.item_id});
    const meta = el("td", {cls: "meta"}, link, el("div", {cls: "muted", text: row.category}),
      el("div", {cls: "muted"}, visible(row.prompt + (row.prompt_truncated ? " …" : ""))));
    const tds = deps.map((d) => {
      const c = row.cells[d];
      if (!c) return el("td", {cls: "cell muted", text: "(no record)"});
      const td = el("td", {cls: "cell" + (d === f.reference ? " ref" : "") + (c.ok >= 0 ? " ok" + c.ok : ""), data: {dep: d, differs: c.differs ? 1 : 0}});
      if (c.flipped) td.append(el("span", {cls: "flip", text: "flipped "}));
      td.append(segmentsNode(c.segments));
      if (c.truncated) td.append(el("span", {cls: "muted", text: " …"}));
      if (c.sort_value !== undefined) td.append(el("div", {cls: "scores", text: state.sort.split("|")[1] + " = " + fmt(c.sort_value)}));
      return td;
    });
    table.append(el("tr", {data: {item: row.item_id, suite: row.suite}}, meta, tds));
  }
  const pager = el("div", {cls: "pager"},
    el("button", {text: "← previous", disabled: offset === 0, onclick: () => go({offset: Math.max(0, offset - limit)})}),
    el("span", {id: "count", text: `${page.total ? offset + 1 : 0}–${Math.min(offset + limit, page.total)} of ${page.total} items`}),
    el("button", {text: "next →", disabled: offset + limit >= page.total, onclick: () => go({offset: offset + limit})}));
  matrixBox.replaceChildren(pager, table);
}

// ---------------------------------------------------------------- one item

function idsNode(ids, firstDiff) {
  if (!ids) return el("span", {cls: "muted", text: "(not recorded)"});
  const node = el("div", {cls: "ids"});
  ids.forEach((id, i) => node.append(i === firstDiff ? el("span", {cls: "firstdiff", text: String(id)}) : String(id), i + 1 < ids.length ? " " : ""));
  return node;
}

async function showItem(name, params) {
  const suite = params.get("suite") || "", id = params.get("id") || "";
  setCrumbs([name, "#/run/" + encodeURIComponent(name)], [suite + " / " + id, null]);
  const it = await api(`/api/runs/${encodeURIComponent(name)}/item?` + qs({suite, id}));
  const parts = [el("h1", {}, "Item ", el("span", {id: "item-id", text: `${it.suite} / ${it.item_id}`})),
    el("p", {cls: "muted", text: "category " + it.category}), el("h2", {text: "Prompt"}), el("div", {cls: "out", id: "prompt"}, visible(it.prompt))];
  for (const d of it.deployments) {
    const c = it.cells[d];
    const card = el("div", {cls: "card", data: {dep: d}}, el("h3", {text: d + (d === it.reference ? " (reference)" : "")}));
    if (!c) { card.append(el("p", {cls: "muted", text: "no record for this item"})); parts.push(card); continue; }
    if (c.ok >= 0) card.append(el("p", {cls: "ok" + c.ok, text: c.ok ? "pass" : "fail"}));
    card.append(el("div", {cls: "out output"}, segmentsNode(c.segments)));
    const scores = Object.entries(c.scores || {}).map(([k, v]) => `${k} = ${fmt(v)}`).join(" · ");
    if (scores) card.append(el("p", {cls: "scores", text: scores}));
    const extra = Object.entries(c.extra || {}).map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(", ") : v}`).join(" · ");
    if (extra) card.append(el("p", {cls: "scores"}, visible(extra)));
    for (const j of c.judge || []) {  // a model judge's answer: untrusted text, shown inert like the output
      const what = j.mode === "pointwise" ? `judge, pass ${j.pass}: ` + (j.parsed ? `score ${j.score}` : "unparseable")
        : `judge vs reference, order ${j.order}: ` + (j.parsed ? `${j.verdict} (${j.outcome} for ${d})` : "unparseable");
      card.append(el("p", {cls: "scores judge"}, el("strong", {text: what}), " — ",
        visible(j.parsed ? j.reason : `${j.problem}; raw answer: ${j.raw}`)));
    }
    if (c.prompt_token_ids || c.output_token_ids) {
      const det = el("details", {}, el("summary", {text: "token ids" + (c.same_source_as_reference ? " (same source model as the reference: ids should match)" : "")}));
      if (c.prompt_token_ids) det.append(el("div", {text: `${it.suite === "perplexity" ? "scored tokens" : "prompt"} (${c.prompt_token_ids.length})` + (c.prompt_ids_first_difference != null ? `, first differs from the reference at ${c.prompt_ids_first_difference}` : "")}), idsNode(c.prompt_token_ids, c.prompt_ids_first_difference));
      if (c.output_token_ids) det.append(el("div", {text: `output (${c.output_token_ids.length})` + (c.output_ids_first_difference != null ? `, first differs from the reference at ${c.output_ids_first_difference}` : "")}), idsNode(c.output_token_ids, c.output_ids_first_difference));
      card.append(det);
    }
    parts.push(card);
  }
  main.replaceChildren(...parts);
}

// ---------------------------------------------------------------- run against run

async function showCompare(params) {
  const candidate = params.get("candidate") || "", baseline = params.get("baseline") || "";
  setCrumbs([`${candidate} vs ${baseline}`, null]);
  main.replaceChildren(el("p", {cls: "muted", text: "Comparing (the suites re-pair the shared items)…"}));
  const pairs = params.getAll("pair");
  const data = await api("/api/compare?" + qs({candidate, baseline, pair: pairs}));
  const parts = [el("h1", {text: `Run ${data.candidate} against run ${data.baseline}`}),
    el("p", {cls: "muted", text: "Each row: the candidate run's deployment minus the baseline run's, paired over the items both have, by the same suite code and statistics as comparisons.csv."})];
  if (data.note) parts.push(el("p", {cls: "error", text: data.note}));
  // Pairing editor: which candidate deployment against which baseline deployment.
  const first = data.pairs[0] || {};
  const candSel = el("select", {name: "cand"}, data.candidate_deployments.map((d) => el("option", {value: d, text: d, selected: d === first.deployment})));
  const baseSel = el("select", {name: "base"}, data.baseline_deployments.map((d) => el("option", {value: d, text: d, selected: d === first.baseline_deployment})));
  parts.push(el("div", {cls: "controls"}, "pair ", candSel, ` (${data.candidate}) against `, baseSel, ` (${data.baseline}) `,
    el("button", {text: "compare this pair", onclick: () => { location.hash = "#/compare?" + qs({candidate, baseline, pair: [candSel.value + "|" + baseSel.value]}); }})));
  for (const p of data.pairs) {
    parts.push(el("h2", {text: `${p.deployment} (${data.candidate}) − ${p.baseline_deployment} (${data.baseline})`}),
      el("p", {cls: "what-changed", data: {dep: p.deployment}}, "what changed: ", visible(p.what_changed || "")));
    const t = el("table", {cls: "stats compare", data: {dep: p.deployment, base: p.baseline_deployment}});
    t.append(el("tr", {}, ["suite", "category", "metric", "candidate", "baseline", "difference", "interval", "n", "significant", "method"].map((h) => el("th", {text: h}))));
    for (const r of p.rows) {
      t.append(el("tr", {data: {suite: r.suite, category: r.category, metric: r.metric}},
        el("td", {text: r.suite}), el("td", {text: r.category}), el("td", {text: r.metric}),
        el("td", {text: fmt(r.value)}), el("td", {text: fmt(r.reference_value)}), el("td", {cls: "diff", text: fmt(r.diff)}),
        el("td", {cls: "interval", data: {low: r.ci_low ?? "", high: r.ci_high ?? ""}, text: r.ci_low === null ? "none" : `[${fmt(r.ci_low)}, ${fmt(r.ci_high)}]`}),
        el("td", {text: r.n}), el("td", {cls: r.significant ? "sig" : null, text: r.significant ? "yes" : "no"}), el("td", {cls: "muted", text: r.method})));
    }
    parts.push(p.rows.length ? t : el("p", {cls: "muted", text: "No shared items to compare."}));
    p.errors.forEach((e) => parts.push(el("p", {cls: "error", text: e})));
    parts.push(el("p", {text: `${p.shared_items} shared items; ${p.n_output_changed} outputs changed; ${p.n_changed} pass/fail outcomes changed.`}));
    if (p.changed.length) {
      const ct = el("table", {cls: "changed"});
      ct.append(el("tr", {}, ["item", "category", data.baseline, data.candidate].map((h) => el("th", {text: h}))));
      p.changed.forEach((c) => ct.append(el("tr", {},
        el("td", {}, el("a", {href: `#/item/${encodeURIComponent(data.candidate)}?` + qs({suite: c.suite, id: c.item_id}), text: c.suite + " / " + c.item_id})),
        el("td", {text: c.category}), el("td", {cls: c.before === "pass" ? "ok1" : "ok0", text: c.before}), el("td", {cls: c.after === "pass" ? "ok1" : "ok0", text: c.after}))));
      parts.push(ct);
    }
  }
  main.replaceChildren(...parts);
}

// ---------------------------------------------------------------- trends over runs

const SVGNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) { // SVG nodes: attributes set one by one, text only as text nodes
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
const LINE_COLOURS = ["#1f5fa8", "#b3541e", "#2e7d32", "#7b3fa0", "#8a6d00", "#00838f", "#ad1457", "#455a64"];
const GROUP_COLOURS = {"first run": "#9e9e9e", "nothing": "#ffffff", "not comparable": "#000000", "weights": "#d32f2f",
  "engine": "#f57c00", "options": "#fbc02d", "sampling": "#7b1fa2", "settings only": "#4fc3f7", "environment only": "#a5d6a7"};

async function showTrends(params) {
  setCrumbs(["trends", null]);
  const data = await api("/api/trends?" + qs({suite: params.get("suite") || "", metric: params.get("metric") || "", category: params.get("category") || ""}));
  const go = (changes) => { location.hash = "#/trends?" + qs({suite: data.suite, metric: data.metric, category: data.category, ...changes}); };
  const parts = [el("h1", {text: "Trends over runs"}),
    el("p", {cls: "muted", text: "A metric per deployment over the folder's runs (oldest left), each point with its interval. A point's fill says what changed in what the result depends on since that deployment's previous run (weights, engine, options, ...); a ringed point is a step: its interval does not overlap the previous one's. `evalkit diff` gives the paired test."})];
  if (!data.series.length) { main.replaceChildren(...parts, el("p", {cls: "muted", text: "No scored runs in this folder."})); return; }
  const metricSel = el("select", {name: "metric", onchange: (e) => { const [suite, metric] = e.target.value.split("\u0000"); go({suite, metric, category: ""}); }},
    data.metrics.map((m) => el("option", {value: m.suite + "\u0000" + m.metric, text: m.suite + " / " + m.metric, selected: m.suite === data.suite && m.metric === data.metric})));
  const catSel = el("select", {name: "category", onchange: (e) => go({category: e.target.value})},
    data.categories.map((c) => el("option", {value: c, text: c, selected: c === data.category})));
  parts.push(el("div", {cls: "controls"}, "metric ", metricSel, " category ", catSel,
    el("span", {cls: "muted", text: data.direction === "higher" ? "higher is better" : data.direction === "lower" ? "lower is better" : ""})));
  // Scales: x by run (ordinal, in creation order), y over every value and interval bound.
  const runs = data.runs.map((r) => r.run);
  const xs = new Map(runs.map((r, i) => [r, i]));
  const ys = data.series.flatMap((s) => s.points.flatMap((p) => [p.value, p.ci_low, p.ci_high])).filter((v) => typeof v === "number" && isFinite(v));
  let lo = Math.min(...ys), hi = Math.max(...ys);
  if (!(hi > lo)) { lo -= 0.5 * (Math.abs(lo) || 1); hi += 0.5 * (Math.abs(hi) || 1); }
  const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
  const W = 900, H = 360, L = 90, R = 20, T = 20, B = 70;
  const X = (i) => L + (runs.length === 1 ? (W - L - R) / 2 : i * (W - L - R) / (runs.length - 1));
  const Y = (v) => T + (hi - v) * (H - T - B) / (hi - lo);
  const chart = svg("svg", {id: "trend-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img"},
    svg("title", {}, `${data.suite} / ${data.metric} (${data.category}) over ${runs.length} runs`));
  chart.append(svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"}), svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"}));
  for (let k = 0; k <= 4; k++) {
    const v = lo + (hi - lo) * k / 4;
    chart.append(svg("line", {x1: L - 4, y1: Y(v), x2: W - R, y2: Y(v), stroke: "#eee"}), svg("text", {x: L - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11}, fmt(v, 3)));
  }
  runs.forEach((r, i) => chart.append(svg("text", {x: X(i), y: H - B + 14, "text-anchor": "end", "font-size": 10, transform: `rotate(-30 ${X(i)} ${H - B + 14})`}, r)));
  data.series.forEach((s, k) => {
    const colour = LINE_COLOURS[k % LINE_COLOURS.length];
    const pts = s.points.filter((p) => typeof p.value === "number" && xs.has(p.run));
    const dx = (k - (data.series.length - 1) / 2) * 4; // deployments side by side at one run
    if (pts.length > 1) chart.append(svg("polyline", {points: pts.map((p) => `${X(xs.get(p.run)) + dx},${Y(p.value)}`).join(" "), fill: "none", stroke: colour, "stroke-width": 1.5}));
    for (const p of pts) {
      const x = X(xs.get(p.run)) + dx;
      const g = svg("g", {class: "point" + (p.step ? " step" : ""), "data-run": p.run, "data-deployment": s.deployment, "data-group": p.group});
      if (typeof p.ci_low === "number" && typeof p.ci_high === "number") g.append(svg("line", {class: "ci", x1: x, y1: Y(p.ci_low), x2: x, y2: Y(p.ci_high), stroke: colour, "stroke-width": 1.2}));
      if (p.step) g.append(svg("circle", {class: "step-ring", cx: x, cy: Y(p.value), r: 9, fill: "none", stroke: "#d32f2f", "stroke-width": 2}));
      g.append(svg("circle", {cx: x, cy: Y(p.value), r: 5, fill: GROUP_COLOURS[p.group] || "#9e9e9e", stroke: colour, "stroke-width": 2}),
        svg("title", {}, `${s.deployment} @ ${p.run}: ${fmt(p.value)} [${fmt(p.ci_low)}, ${fmt(p.ci_high)}]${p.step ? " — step change" : ""}\nchanged: ${p.changed || "(first run)"}`));
      chart.append(g);
    }
  });
  parts.push(el("div", {cls: "scroll"}, chart));
  // Legend, drawn as SVG too (colours are attributes: the page allows no inline style).
  const used = data.groups.filter((g) => data.series.some((s) => s.points.some((p) => p.group === g)));
  const rows = Math.max(data.series.length, used.length);
  const legend = svg("svg", {id: "trend-legend", width: W, height: 18 * rows + 24, viewBox: `0 0 ${W} ${18 * rows + 24}`},
    svg("text", {x: 0, y: 12, "font-size": 12, "font-weight": 600}, "deployment (line)"), svg("text", {x: 320, y: 12, "font-size": 12, "font-weight": 600}, "what changed since its previous run (fill)"));
  data.series.forEach((s, k) => legend.append(svg("line", {x1: 0, y1: 26 + 18 * k, x2: 24, y2: 26 + 18 * k, stroke: LINE_COLOURS[k % LINE_COLOURS.length], "stroke-width": 3}),
    svg("text", {x: 30, y: 30 + 18 * k, "font-size": 12}, s.deployment)));
  used.forEach((g, k) => legend.append(svg("circle", {cx: 326, cy: 26 + 18 * k, r: 5, fill: GROUP_COLOURS[g] || "#9e9e9e", stroke: "#333"}),
    svg("text", {x: 338, y: 30 + 18 * k, "font-size": 12}, g)));
  legend.append(svg("circle", {cx: 646, cy: 26, r: 9, fill: "none", stroke: "#d32f2f", "stroke-width": 2}), svg("text", {x: 662, y: 30, "font-size": 12}, "step change"));
  parts.push(el("div", {cls: "scroll"}, legend));
  const t = el("table", {cls: "stats trend"});
  t.append(el("tr", {}, ["run", "deployment", data.metric, "interval", "n", "step", "changed since its previous run"].map((h) => el("th", {text: h}))));
  for (const s of data.series) for (const p of s.points) {
    t.append(el("tr", {data: {run: p.run, deployment: s.deployment, step: p.step ? "1" : "0"}},
      el("td", {}, el("a", {href: "#/run/" + encodeURIComponent(p.run), text: p.run})), el("td", {text: s.deployment}),
      el("td", {text: fmt(p.value)}), el("td", {text: p.ci_low === null ? "none" : `[${fmt(p.ci_low)}, ${fmt(p.ci_high)}]`}),
      el("td", {text: fmt(p.n)}), el("td", {cls: p.step ? "flip" : null, text: p.step ? "step" : ""}), el("td", {}, visible(p.changed || "(first run)"))));
  }
  parts.push(t);
  main.replaceChildren(...parts);
}

// ---------------------------------------------------------------- blind review

async function showReview(name, params) {
  setCrumbs([name, "#/run/" + encodeURIComponent(name)], ["review", null]);
  const rater = params.get("rater") || localStorage.getItem("evalkit-rater") || "";
  const input = el("input", {type: "text", name: "rater", value: rater, placeholder: "your reviewer name"});
  const start = el("button", {text: "start reviewing", onclick: () => { localStorage.setItem("evalkit-rater", input.value); location.hash = `#/review/${encodeURIComponent(name)}?` + qs({rater: input.value}); }});
  const parts = [el("h1", {text: "Blind review of run " + name}),
    el("p", {cls: "muted", text: "Outputs are shown as A, B, … in a shuffled order per item, as `evalkit rate export` does; ratings are stored in your own rating sheet and enter scores.csv at the next `evalkit report`."}),
    el("div", {cls: "controls"}, "reviewer ", input, start)];
  main.replaceChildren(...parts);
  if (!params.get("rater")) return;
  const sheet = await api(`/api/runs/${encodeURIComponent(name)}/review/sheet`, {rater: params.get("rater")});
  const status = el("p", {id: "review-status", cls: "muted", text: `sheet ${sheet.sheet}`});
  parts.push(status);
  for (const item of sheet.items) {
    const card = el("div", {cls: "card review-item", data: {item: item.item_id}},
      el("h3", {text: `${item.item_id} · ${item.category}`}), el("div", {cls: "out"}, visible(item.prompt)));
    if (item.reference) card.append(el("p", {cls: "muted", text: "reference answer:"}), el("div", {cls: "out"}, visible(item.reference)));
    card.append(el("details", {}, el("summary", {text: "rubric: " + item.rubric}), el("div", {cls: "rubric", text: sheet.rubrics[item.category] || ""})));
    for (const o of item.outputs) {
      const comment = el("input", {type: "text", name: "comment", value: o.comment || "", placeholder: "comment (optional)"});
      const buttons = [];
      for (let s = sheet.score_min; s <= sheet.score_max; s++) {
        const b = el("button", {text: String(s), cls: o.score === s ? "chosen" : null, data: {score: s}, onclick: async () => {
          b.disabled = true;
          try {
            const res = await api(`/api/runs/${encodeURIComponent(name)}/review/rate`, {rater: sheet.rater_id, row_id: o.row_id, score: s, comment: comment.value});
            buttons.forEach((x) => x.classList.toggle("chosen", x === b));
            status.textContent = `saved ${o.row_id} = ${s}; ${res.rated} of ${res.rows} rated`;
          } catch (e) { status.textContent = "not saved: " + e.message; }
          b.disabled = false;
        }});
        buttons.push(b);
      }
      card.append(el("div", {cls: "card output", data: {row: o.row_id, letter: o.letter}}, el("h3", {text: "Output " + o.letter}),
        el("div", {cls: "out"}, visible(o.output)), el("div", {cls: "rate"}, "score ", buttons, " ", comment)));
    }
    parts.push(card);
  }
  main.replaceChildren(...parts);
}

// ---------------------------------------------------------------- router

async function render() {
  busy(true);
  const {parts, params} = route();
  document.body.dataset.view = parts[0] || "runs";
  try {
    if (parts.length === 0) await showRuns();
    else if (parts[0] === "run" && parts[1]) await showRun(parts[1], params);
    else if (parts[0] === "item" && parts[1]) await showItem(parts[1], params);
    else if (parts[0] === "compare") await showCompare(params);
    else if (parts[0] === "trends") await showTrends(params);
    else if (parts[0] === "review" && parts[1]) await showReview(parts[1], params);
    else main.replaceChildren(el("p", {text: "Nothing here."}));
  } catch (e) { fail(e); return; }
  busy(false);
}

window.addEventListener("hashchange", render);
render();
