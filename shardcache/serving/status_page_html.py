"""The status page's HTML, CSS and JS (strings: no package data to ship, no build step).
Every string from the document goes in as text (`textContent`, a fixed attribute), never as
HTML; it requests nothing but `status`; its only inline style and script are two hashed blocks."""

from __future__ import annotations

STYLE = r"""
:root { font: 14px/1.4 system-ui, sans-serif; color: #1d2430; background: #f4f6f9; }
body { margin: 0 auto; padding: 12px 20px 24px; max-width: 1280px; }
header { display: flex; gap: 16px; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 20px; margin: 0; }
h2 { font-size: 15px; margin: 0 0 8px; }
.muted { color: #6b7585; }
.problem { background: #fde8e8; color: #8a1c1c; padding: 8px 12px; border-radius: 6px;
  margin: 10px 0; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(180px, 1fr));
  gap: 10px; margin: 12px 0; }
.tile, .panel, figure, section.wide { background: #fff; border: 1px solid #dde2ea;
  border-radius: 8px; padding: 10px 12px; margin: 0; }
.tile .label { color: #6b7585; font-size: 12px; text-transform: uppercase; }
.tile .big { font-size: 24px; font-weight: 600; }
.tile .sub { color: #6b7585; font-size: 12px; }
.bar { height: 8px; background: #e4e8ef; border-radius: 4px; overflow: hidden; margin: 4px 0; }
.bar > div { height: 100%; width: 0; background: #3b7dd8; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr));
  gap: 10px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg.chart { width: 100%; height: 130px; display: block; }
svg.chart .grid { stroke: #e4e8ef; stroke-width: 1; }
svg.chart text { font-size: 10px; fill: #6b7585; }
svg.chart polyline { fill: none; stroke-width: 2; vector-effect: non-scaling-stroke; }
.s1 { stroke: #3b7dd8; } .s2 { stroke: #e0862b; } .s3 { stroke: #2a9d5c; }
.dashed { stroke-dasharray: 5 4; }
.legend span::before { content: "\25A0  "; }
.legend .s1::before { color: #3b7dd8; } .legend .s2::before { color: #e0862b; }
.legend .s3::before { color: #2a9d5c; }
.legend { font-size: 12px; color: #6b7585; display: flex; gap: 12px; }
.panels { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr));
  gap: 10px; margin: 12px 0; }
dl { display: grid; grid-template-columns: auto 1fr; gap: 2px 12px; margin: 0; }
dt { color: #6b7585; } dd { margin: 0; overflow-wrap: anywhere; }
section.wide { margin: 12px 0; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: #6b7585; font-weight: 500; border-bottom: 1px solid #dde2ea; }
td, th { padding: 4px 8px; vertical-align: top; }
td { border-bottom: 1px solid #f0f2f6; overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.upstream td { color: #4b5563; font-size: 12px; }
.state-closed, .state-ok { color: #2a9d5c; } .state-open { color: #c0392b; font-weight: 600; }
.state-half_open { color: #e0862b; }
"""

SCRIPT = r"""
"use strict";
(() => {
  const every = Math.min(60, Math.max(0.2,
    Number(new URLSearchParams(location.search).get("every")) || 2));
  const HISTORY = 180;
  const history = [];
  let polls = 0;
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  const sum = (values) => values.reduce((a, b) => a + b, 0);
  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(n < 10 ? 2 : 1) : String(Math.round(n))) + " " + units[i];
  }
  const pct = (r) => (r === null || r === undefined ? "–" : (100 * r).toFixed(1) + " %");
  function secs(s) {
    if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  const text = (v) => (v === null || v === undefined ? "–" : String(v));
  function show(id, shown, value) {
    const node = $(id);
    node.textContent = shown;
    if (value !== undefined) node.dataset.value = String(value);
  }
  function pairs(id, entries) {
    const dl = $(id);
    dl.replaceChildren();
    for (const [key, value] of entries) {
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = key;
      dd.textContent = text(value);
      dl.append(dt, dd);
    }
  }
  function cell(row, value, className) {
    const td = document.createElement("td");
    td.textContent = text(value);
    if (className) td.className = className;
    row.append(td);
    return td;
  }

  function record(doc) {
    const last = history[history.length - 1];
    if (last && doc.uptime_s < last.t) history.length = 0;  // the daemon restarted
    history.push({
      t: doc.uptime_s,
      hits: doc.requests.hit,
      requests: sum(Object.values(doc.requests)),
      cache: doc.bytes.cache,
      streamed: doc.bytes.origin,
      fetched: doc.origin_bytes || 0,
      stall: doc.loader_stall_s,
      pending: doc.prefetch.pending,
      inFlight: doc.prefetch.in_flight,
    });
    if (history.length > HISTORY) history.shift();
  }
  function intervals(pick) {
    const out = [];
    for (let i = 1; i < history.length; i += 1) out.push(pick(history[i - 1], history[i]));
    return out;
  }
  const rate = (key) => (a, b) => (b.t > a.t ? (b[key] - a[key]) / (b.t - a.t) : null);

  // `floor`: the least top of the scale (a fixed one for ratios), so that noise stays flat.
  function chart(id, series, format, floor, fixed) {
    const svg = $(id);
    const width = 300, top = 8, bottom = 100;
    const values = series.flatMap((s) => s.values).filter((v) => v !== null);
    const max = fixed ? floor : Math.max(floor, ...values);
    const nodes = [];
    for (const f of [0, 0.5, 1]) {
      const y = bottom - f * (bottom - top);
      const line = document.createElementNS(SVG, "line");
      for (const [k, v] of [["x1", 0], ["x2", width], ["y1", y], ["y2", y]]) {
        line.setAttribute(k, String(v));
      }
      line.setAttribute("class", "grid");
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", "2");
      label.setAttribute("y", String(y - 2));
      label.textContent = format(f * max);
      nodes.push(line, label);
    }
    // Newest at the right; until there are 30 intervals, 30 slots, so early lines show.
    const slots = Math.max(30, ...series.map((s) => s.values.length));
    const step = width / (slots - 1);
    for (const s of series) {
      let points = [];
      const flush = () => {
        if (points.length === 1) {  // a lone value: a step-wide dash, so that it shows
          const [x, y] = points[0].split(",").map(Number);
          points.unshift(Math.max(0, x - step).toFixed(1) + "," + y.toFixed(1));
        }
        if (points.length) {
          const line = document.createElementNS(SVG, "polyline");
          line.setAttribute("points", points.join(" "));
          line.setAttribute("class", s.className);
          nodes.push(line);
        }
        points = [];
      };
      const offset = width - (s.values.length - 1) * step;
      s.values.forEach((v, i) => {
        if (v === null) { flush(); return; }
        const y = bottom - Math.min(1, v / max) * (bottom - top);
        points.push((offset + i * step).toFixed(1) + "," + y.toFixed(1));
      });
      flush();
    }
    svg.replaceChildren(...nodes);
    svg.dataset.points = String(series[0].values.length);
  }

  function drawCharts() {
    const hits = intervals((a, b) => {
      const n = b.requests - a.requests;
      return n > 0 ? (b.hits - a.hits) / n : null;
    });
    const byteHits = intervals((a, b) => {
      const n = b.cache - a.cache + b.streamed - a.streamed;
      return n > 0 ? (b.cache - a.cache) / n : null;
    });
    chart("chart-hits", [{ className: "s1", values: hits },
      { className: "s2 dashed", values: byteHits }], pct, 1, true);
    const served = intervals((a, b) => {
      const dt = b.t - a.t;
      return dt > 0 ? (b.cache - a.cache + b.streamed - a.streamed) / dt : null;
    });
    chart("chart-bytes", [{ className: "s1", values: served },
      { className: "s2", values: intervals(rate("fetched")) }], (v) => bytes(v) + "/s", 1024);
    chart("chart-stall", [{ className: "s2", values: intervals(rate("stall")) }],
      (v) => Number(v.toPrecision(2)).toString(), 0.01);
    chart("chart-prefetch", [
      { className: "s1", values: history.slice(1).map((h) => h.pending) },
      { className: "s3", values: history.slice(1).map((h) => h.inFlight) }],
    (v) => v.toFixed(v < 10 ? 1 : 0), 2);
  }

  function render(doc) {
    show("version", "v" + doc.version);
    show("listen", doc.listen);
    show("uptime", secs(doc.uptime_s));
    show("updated", "updated " + new Date().toLocaleTimeString());
    const requests = sum(Object.values(doc.requests));
    show("hit-ratio-requests", pct(doc.hit_ratio.requests), doc.hit_ratio.requests);
    show("requests-total", doc.requests.hit + " hits of " + requests + " requests", requests);
    show("hit-ratio-bytes", pct(doc.hit_ratio.bytes), doc.hit_ratio.bytes);
    show("bytes-served", bytes(doc.bytes.cache + doc.bytes.origin),
      doc.bytes.cache + doc.bytes.origin);
    show("bytes-split", bytes(doc.bytes.cache) + " from cache, " + bytes(doc.bytes.origin) +
      " streamed from origins");
    show("origin-bytes", bytes(doc.origin_bytes || 0), doc.origin_bytes || 0);
    show("loader-stall", secs(doc.loader_stall_s), doc.loader_stall_s);
    show("client-wait", "clients waited " + secs(doc.client_wait_s) + " in all");
    const c = doc.cache;
    show("cache-fill", pct(c.use_ratio), c.use_ratio);
    $("cache-bar").style.width = Math.min(100, 100 * (c.use_ratio || 0)) + "%";
    const entryBytes = c.entry_bytes === undefined ? c.size_bytes : c.entry_bytes;
    show("cache-size", bytes(entryBytes) + " in " + c.entries +
      (c.entries === 1 ? " entry of " : " entries of ") +
      bytes(c.capacity_bytes) + " (+" + bytes(c.size_bytes - entryBytes) + " index)");
    const e = c.eviction || {};
    pairs("eviction", [["policy", e.policy + (e.setting !== e.policy ? " (" + e.setting + ")"
      : "")], ["evictions", c.evictions], ["reserved for fills", bytes(c.reserved_bytes)],
    ["admission bypassed", e.bypassed],
    ["transient", bytes(e.transient_bytes || 0) + " of " + bytes(e.transient_area_bytes || 0)],
    ["transient kept / dropped", text(e.transient_kept) + " / " + text(e.transient_dropped)],
    ["resident set serving", e.resident_set_serving], ["plans", (e.plans || []).map((p) =>
      p.job + " epoch " + p.epoch + " at " + p.position + "/" + p.length).join("; ") ||
      "no plans posted"]]);
    const p = doc.prefetch;
    pairs("prefetch", [["queued", p.pending], ["in flight", p.in_flight],
      ["concurrency", p.concurrency + " (" + p.concurrency_mode + ")"],
      ["look-ahead", bytes(p.unread_bytes) + " of " + bytes(p.max_unread_bytes) + " unread"],
      ["waiting for", p.waiting_for], ["held by", Object.entries(p.held_by || {}).map(([job,
      size]) => job + " " + bytes(size)).join(", ") || "–"],
      ["done / fetched / failed", p.done + " / " + p.fetched +
      " / " + p.failed], ["read-ahead", p.readahead]]);
    const r = doc.receivers;
    const s = doc.scrub;
    pairs("receivers", [
      ["receiving processes", r ? r.alive + " of " + r.size + " alive" : "–"],
      ["their requests", r ? r.in_flight : null], ["replaced", r ? r.replaced : null],
      ["scrub", s ? (s.is_on ? bytes(s.rate_bytes_per_s) + "/s, " + s.passes + " passes" :
        "off") : null], ["corrupt found", s ? s.corrupt : null]]);
    renderOrigins(doc.origins);
    renderFailures(doc);
  }

  function renderOrigins(origins) {
    const body = $("origins");
    body.replaceChildren();
    for (const [name, o] of Object.entries(origins)) {
      const row = document.createElement("tr");
      row.dataset.origin = name;
      const first = cell(row, name, "name");
      const url = document.createElement("div");
      url.className = "muted";
      url.textContent = o.url;
      first.append(url);
      const q = o.requests;
      const n = q.hit + q.miss + q.coalesced + q.error;
      cell(row, q.hit + " / " + q.miss + " / " + q.coalesced + " / " + q.error, "num");
      cell(row, n ? pct(q.hit / n) : "–", "num");
      cell(row, bytes(o.bytes.cache + o.bytes.origin), "num");
      cell(row, bytes(o.origin_bytes || 0), "num");
      cell(row, secs(o.loader_stall_s), "num");
      cell(row, Object.entries(o.origin_errors).map(([k, v]) => k + " " + v).join(", ") ||
        "none");
      cell(row, o.origin_retries, "num");
      const gate = o.gate || {};
      const waiting = (gate.waiting || 0) + (gate.waiting_for_place || 0);
      cell(row, (o.throttled || 0) + (o.request_limit ? ", limit " + o.request_limit : "") +
        (gate.max_requests_per_second ? ", cap " + gate.max_requests_per_second + "/s" : "") +
        (gate.max_requests ? ", " + gate.max_requests + " at once" : "") +
        (waiting ? ", " + waiting + " waiting" : "") +
        (gate.shed ? ", " + gate.shed + " shed" : ""), "num");
      body.append(row);
      for (const u of o.upstreams || []) {
        const sub = document.createElement("tr");
        sub.className = "upstream";
        cell(sub, "↳ " + u.role + ": " + u.url);
        cell(sub, u.state, "state-" + u.state);
        cell(sub, u.failures + " failures, " + u.failures_in_a_row + " in a row");
        cell(sub, u.retry_in_s ? "retry in " + secs(u.retry_in_s) : "");
        const last = cell(sub, u.last_error || "");
        last.colSpan = 5;
        body.append(sub);
      }
      for (const k of o.unusable_checksums || []) {
        const sub = document.createElement("tr");
        sub.className = "upstream";
        const only = cell(sub, "↳ checksum set aside: " + Object.values(k).join(", "));
        only.colSpan = 9;
        body.append(sub);
      }
    }
  }

  function renderFailures(doc) {
    const rows = [];
    for (const f of (doc.recent_failures || []).slice().reverse()) {
      rows.push([ago(f.at), "request", f.origin, f.kind, f.message]);
    }
    for (const f of (doc.prefetch.recent_failures || []).slice().reverse()) {
      rows.push(["", "prefetch", f.url.split("/")[1], f.kind, f.url + ": " + f.error]);
    }
    const body = $("failures");
    body.replaceChildren();
    for (const values of rows) {
      const row = document.createElement("tr");
      values.forEach((v) => cell(row, v));
      body.append(row);
    }
    $("no-failures").hidden = rows.length > 0;
  }
  function ago(at) {
    return secs(Math.max(0, Date.now() / 1000 - at)) + " ago";
  }

  async function poll() {
    try {
      const url = new URL("status", location.href);
      url.username = url.password = "";  // fetch refuses a URL with credentials in it
      const response = await fetch(url, { cache: "no-store", credentials: "same-origin",
        headers: { Accept: "application/json" } });
      const doc = await response.json();
      if (!response.ok) throw new Error("HTTP " + response.status + ": " + text(doc.error));
      record(doc);
      render(doc);
      drawCharts();
      polls += 1;
      document.body.dataset.polls = String(polls);
      $("problem").hidden = true;
    } catch (error) {
      $("problem").textContent = "cannot read /_/status: " + error.message;
      $("problem").hidden = false;
    }
    setTimeout(poll, every * 1000);
  }
  show("every", String(every), every);
  poll();
})();
"""

HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>shardcache status</title>
<link rel="icon" href="data:,">
<style>{style}</style>
</head>
<body data-polls="0">
<header>
  <h1>shardcache</h1><span id="version" class="muted"></span><span id="listen"></span>
  <span>up <span id="uptime">–</span></span><span id="updated" class="muted"></span>
</header>
<div id="problem" class="problem" hidden></div>
<div class="tiles">
  <div class="tile"><div class="label">Hit ratio (requests)</div>
    <div class="big" id="hit-ratio-requests">–</div><div class="sub" id="requests-total"></div>
  </div>
  <div class="tile"><div class="label">Hit ratio (bytes)</div>
    <div class="big" id="hit-ratio-bytes">–</div><div class="sub">bytes served from the cache
    </div></div>
  <div class="tile"><div class="label">Bytes served</div>
    <div class="big" id="bytes-served">–</div><div class="sub" id="bytes-split"></div></div>
  <div class="tile"><div class="label">Bytes from origins</div>
    <div class="big" id="origin-bytes">–</div><div class="sub">what the origins sent: fills
    and pass-through</div></div>
  <div class="tile"><div class="label">Loader stall</div>
    <div class="big" id="loader-stall">–</div><div class="sub" id="client-wait"></div></div>
  <div class="tile"><div class="label">Cache fill</div>
    <div class="big" id="cache-fill">–</div><div class="bar"><div id="cache-bar"></div></div>
    <div class="sub" id="cache-size"></div></div>
</div>
<div class="charts">
  <figure><figcaption>Hit ratio per poll</figcaption>
    <svg class="chart" id="chart-hits" viewBox="0 0 300 110"></svg>
    <div class="legend"><span class="s1">requests</span><span class="s2">bytes</span></div>
  </figure>
  <figure><figcaption>Bytes per second</figcaption>
    <svg class="chart" id="chart-bytes" viewBox="0 0 300 110"></svg>
    <div class="legend"><span class="s1">served</span><span class="s2">from origins</span></div>
  </figure>
  <figure><figcaption>Loader stall (seconds per second)</figcaption>
    <svg class="chart" id="chart-stall" viewBox="0 0 300 110"></svg>
    <div class="legend"><span class="s2">time a loader waited for bytes</span></div>
  </figure>
  <figure><figcaption>Prefetch queue</figcaption>
    <svg class="chart" id="chart-prefetch" viewBox="0 0 300 110"></svg>
    <div class="legend"><span class="s1">queued</span><span class="s3">in flight</span></div>
  </figure>
</div>
<div class="panels">
  <div class="panel"><h2>Cache and eviction</h2><dl id="eviction"></dl></div>
  <div class="panel"><h2>Prefetch</h2><dl id="prefetch"></dl></div>
  <div class="panel"><h2>Receivers and scrub</h2><dl id="receivers"></dl></div>
</div>
<section class="wide"><h2>Origins and upstreams</h2>
<table><thead><tr><th>origin</th><th>hit / miss / coalesced / error</th><th>hit ratio</th>
<th>served</th><th>from origin</th><th>loader stall</th><th>origin errors</th><th>retries</th>
<th>throttled, gate</th></tr></thead><tbody id="origins"></tbody></table></section>
<section class="wide"><h2>Recent failures</h2>
<table><thead><tr><th>when</th><th>where</th><th>origin</th><th>kind</th><th>what</th></tr>
</thead><tbody id="failures"></tbody></table><p id="no-failures" class="muted">none</p>
</section>
<p class="muted">Polls /_/status every <span id="every">2</span> s and keeps the last 180 polls
in this page; the totals count from the daemon's start.</p>
<noscript><p class="muted">Scripts are off: these are the figures at the page's load; reload
for new ones.</p></noscript>
<script>{script}</script>
</body>
</html>
"""


def page() -> tuple[str, str, str]:
    """The page, and its script and style exactly as inlined (their CSP hashes are of these)."""
    return HTML.replace("{style}", STYLE).replace("{script}", SCRIPT), SCRIPT, STYLE
