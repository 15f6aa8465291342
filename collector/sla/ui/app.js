// The SLA page: no framework; reads /v1/sla, /v1/alerts, /v1/sla/history and, one click
// down, /v1/requests/slowest (a route's slowest pairs and the parts of each divergence).
"use strict";

const WORDS = {
  out_of_band: "Out of band",
  uncertain: "Not enough evidence yet",
  insufficient_data: "Too few requests",
  ok: "Inside the band",
};
const METRIC = { ttfb: "TTFB", ttft: "TTFT", visible_ttft: "Visible TTFT", itl: "Inter-token", duration: "Duration" };

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const absent = (v) => v === null || v === undefined;
const fmt = (v) => (absent(v) ? "—" : `${Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(1)} ms`);
const sgn = (v) => (absent(v) ? "?" : `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(1)}`);
// an interval bound that is null is unbounded (too few samples for that rank)
const lo = (v) => (absent(v) ? "−∞" : sgn(v));
const hi = (v) => (absent(v) ? "+∞" : sgn(v));
const clock = (iso) => new Date(iso).toLocaleTimeString([], { hour12: false });
// a sampled window's pairs may weigh unequally: they are then worth fewer samples (n_eff)
const worth = (m) => (m.n_eff < m.n ? `, worth ${m.n_eff}` : "");
function headline(name, m) {
  if (m.verdict === "insufficient_data") return `${METRIC[name]}: ${m.n} paired requests${worth(m)} (needs ${m.min_samples})`;
  return `${METRIC[name]} ${sgn(m.divergence_ms)} ms (95% CI ${lo(m.ci_low_ms)}…${hi(m.ci_high_ms)})`;
}

function worstMetric(r) {
  const order = ["out_of_band", "uncertain", "insufficient_data", "ok"];
  let best = null;
  for (const [name, m] of Object.entries(r.metrics)) {
    if (!best || order.indexOf(m.verdict) < order.indexOf(best[1].verdict) ||
        (m.verdict === best[1].verdict && Math.abs(m.divergence_ms || 0) > Math.abs(best[1].divergence_ms || 0))) {
      best = [name, m];
    }
  }
  return best;
}

function partsText(p) {
  const out = [];
  if (!absent(p.network_p95_ms)) out.push(`network δ ${fmt(p.network_p95_ms)}`);
  if (!absent(p.accept_queue_p95_ms)) out.push(`accept queue ${fmt(p.accept_queue_p95_ms)}`);
  if (!absent(p.recv_queue_p95_ms)) out.push(`receive queue ${fmt(p.recv_queue_p95_ms)}`);
  if (!absent(p.server_processing_p95_ms)) out.push(`server processing ${fmt(p.server_processing_p95_ms)}`);
  if (!absent(p.render_delay_p95_ms)) out.push(`render delay ${fmt(p.render_delay_p95_ms)}`);
  for (const h of p.hops || []) out.push(`hop ${h.index} ${h.service} adds ${fmt(h.added_p95_ms)}`);
  if (!absent(p.retransmit_share)) out.push(`retransmits in ${(100 * p.retransmit_share).toFixed(1)}% of requests`);
  return out.length ? `Parts (P95): ${out.join(", ")}` : "";
}

// The server's own view of the route: where its time goes (queue, prefill to the first token,
// decode to the last), P50 and P95 of each window, and what the GPU was doing in them.
const GPU_WORDS = { gpu_bound: "GPU-bound", before_gpu: "Waits before the GPU", clock_low: "GPU clock low" };
// [key, label, what the window is, why it can be absent]
const WINDOWS = [
  ["queue", "Queue", "kernel accept + receive queues, before the app reads the request",
    "not measured: no kernel arrival times for these requests"],
  ["prefill", "Prefill", "app reads the request → first body write (first token)",
    "not measured: no first-body-write time"],
  ["decode", "Decode", "first → last body write (the stream)",
    "none: every response was written at once (nothing after its first body write)"],
];

function gpuBadges(s) {
  const seen = new Set();
  const out = [];
  for (const f of (s && s.findings) || []) {
    if (!GPU_WORDS[f.id] || seen.has(f.id)) continue;
    seen.add(f.id);
    out.push(el("span", { class: `gpu-badge g-${f.id}` }, GPU_WORDS[f.id]));
  }
  return out;
}

// An LLM route (its pairs read a stream dialect) says its server side per answer in tokens,
// the engine's queue first: [key of server.llm, label, what it is, unit]
const TOKEN_ROWS = [
  ["queue", "Queued in the engine", "the engine served other streams while this one waited (seen on the wire)", "ms"],
  ["first_token_after_queue", "First token after the queue", "end of that wait → the first output token (prefill)", "ms"],
  ["first_token", "First token", "app reads the request → its first answer token", "ms"],
  ["tokens", "Tokens", "output tokens per answer (the stream's usage, else its token events)", "n"],
  ["gap_p95", "Gap between tokens (P95 of each answer)", "each answer's P95 gap between tokens", "ms"],
];
const dur = (v) => (absent(v) ? "—" : Math.abs(v) >= 1000 ? `${(v / 1000).toFixed(1)} s` : fmt(v));

function tokenTable(l) {
  const t = el("table", { class: "split tokens" }, el("tr", {}, ...["Per answer", "P50", "P95"].map((h) => el("th", {}, h))));
  for (const [k, label, what, unit] of TOKEN_ROWS) {
    const [p50, p95] = unit === "n" ? [l[`${k}_p50`], l[`${k}_p95`]] :
      k === "gap_p95" ? [l.gap_p95_p50_ms, l.gap_p95_p95_ms] : [l[`${k}_p50_ms`], l[`${k}_p95_ms`]];
    const show = (v) => (absent(v) ? "—" : unit === "n" ? v.toFixed(0) : dur(v));
    const row = el("tr", { "data-token-row": k, title: what }, el("td", {}, label), el("td", {}, show(p50)), el("td", {}, show(p95)));
    if (absent(p95)) row.classList.add("absent");  // not measured: a dash, never "0"
    t.append(row);
  }
  return t;
}

function windowTable(s, why) {
  const t = el("table", { class: "split" }, el("tr", {}, ...["Window", "P50", "P95"].map((h) => el("th", {}, h))));
  for (const [k, label, what, gone] of WINDOWS) {
    const p50 = s[`${k}_p50_ms`], p95 = s[`${k}_p95_ms`];
    const row = el("tr", { "data-window": k, title: what }, el("td", {}, label));
    if (absent(p95)) {  // absent is not zero: a dash and the reason, never "0.0 ms"
      row.classList.add("absent");
      row.append(el("td", { title: gone }, "—"), el("td", { title: gone }, "—"));
      why.push(`${label} — ${gone}.`);
    } else {
      row.append(el("td", {}, fmt(p50)), el("td", {}, fmt(p95)));
    }
    t.append(row);
  }
  return t;
}

function serverBlock(s) {
  // without the agent's kernel timings there is no first-token time to split at
  if (absent(s.prefill_p95_ms) && !s.gpu && !s.llm) return null;
  const llm = s.llm;
  const box = el("div", { class: "server" }, el("h3", {}, llm ? "Server time per answer, in tokens" : "Server time per request"));
  const why = [];
  box.append(llm ? tokenTable(llm) : windowTable(s, why));
  for (const w of why) box.append(el("p", { class: "hint absent-why" }, w));
  if (llm && llm.sentence) box.append(el("p", { class: "token-sentence" }, llm.sentence));
  box.append(el("p", { class: "hint" }, llm ?
    `${llm.n} answers read as token streams. P50 is the typical answer, P95 the tail the SLA judges; percentiles of parts do not add up.` :
    `${s.n} paired requests. P50 is the typical request, P95 the tail the SLA judges; percentiles of parts do not add up.`));
  if (s.gpu) {
    const cov = absent(s.gpu.sample_coverage) ? "" : ` · NVML samples cover ${(100 * s.gpu.sample_coverage).toFixed(0)} % of their time`;
    const n = s.gpu.gpus.length;
    const on = n ? ` on ${n} GPU${n === 1 ? "" : "s"}` : "";
    box.append(el("p", { class: "gpu-head" }, `GPU: ${s.gpu.requests} requests with GPU figures${on}${cov}`));
  }
  const ul = el("ul", { class: "findings" });
  for (const f of s.findings) ul.append(el("li", { class: `f-${f.id}`, "data-finding": f.id }, f.sentence));
  if (s.findings.length) box.append(ul);
  return box;
}

// The agent's sampling: the share of this route's requests it traced (from its pairs).
function samplingBadge(s) {
  if (!s || !s.sentence) return [];
  const share = s.pair_share;
  if (absent(share) || share >= 1) return [];
  const pct = 100 * share;
  return [el("span", { class: "sampling-badge", title: s.sentence }, `traced ${pct >= 10 ? pct.toFixed(0) : pct.toFixed(1)} %`)];
}

function metricTable(r) {
  const head = ["Metric", "Verdict", "Divergence", "95% CI", "Band", "User P95", "Server P95", "n", "Alert"];
  const t = el("table", { class: "metrics" }, el("tr", {}, ...head.map((h) => el("th", {}, h))));
  for (const [name, m] of Object.entries(r.metrics)) {
    t.append(el("tr", { "data-metric": name },
      el("td", {}, METRIC[name]),
      el("td", { class: "verdict-cell" }, el("span", { class: `verdict v-${m.verdict}` }, WORDS[m.verdict])),
      el("td", { class: "div" }, `${sgn(m.divergence_ms)} ms`),
      el("td", {}, `${lo(m.ci_low_ms)}…${hi(m.ci_high_ms)}`),
      el("td", { class: "band", title: "this metric's band: the divergence may go this far either way" }, `±${m.band_ms} ms`),
      el("td", {}, fmt(m.user_p95_ms)), el("td", {}, fmt(m.server_p95_ms)),
      el("td", { class: "n", title: m.n_eff < m.n ? "pairs (effective sample size: the sampling rate varied)" : "pairs" },
        m.n_eff < m.n ? `${m.n} (${m.n_eff} eff.)` : m.n),
      el("td", { class: "alert-cell" }, m.alert_state)));
  }
  return el("div", { class: "table-wrap" }, t);
}

function routeBlock(r, win) {
  const [wname, wm] = worstMetric(r);
  const d = el("details", { class: "route", "data-route": r.route, "data-service": r.service });
  const summary = el("summary", {},
    el("span", { class: "route-name" }, r.route),
    el("span", { class: "route-head" }, el("span", { class: `verdict v-${r.verdict}` }, WORDS[r.verdict]), " ",
      headline(wname, wm), ...samplingBadge(r.sampling), ...gpuBadges(r.server)),
    el("span", { class: "service" }, r.service));
  d.append(summary);
  const body = el("div", { class: "body" });
  if (r.sampling && r.sampling.sentence) body.append(el("p", { class: "sampling" }, r.sampling.sentence));
  const user = el("div", { class: "user" }, el("h3", {}, "What users see against what the app reports"), metricTable(r));
  for (const [, m] of Object.entries(r.metrics)) {
    if (m.verdict === "out_of_band") user.append(el("p", { class: "sentence" }, m.sentence));
  }
  user.append(el("p", { class: "parts" }, partsText(wm.parts)));
  // the browser's view and the server's, side by side
  const side = el("div", { class: "views" }, user);
  const server = r.server ? serverBlock(r.server) : null;
  if (server) side.append(server);
  body.append(side);
  const chart = el("div", { class: "chart-box" });
  const slow = el("div", { class: "slowest" });
  body.append(chart, slow);
  d.append(body);
  d.addEventListener("toggle", () => {
    if (!d.open) return;
    drawHistory(chart, r.service, r.route, wname);
    drawSlowest(slow, r, wname, win);
  });
  return d;
}

// -- the chart: user vs server P95 per minute, the band around the server line ---------------
const NS = "http://www.w3.org/2000/svg";

function ticks(t0, t1, width) {
  // whole minutes, about one label per 110 px
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 240].map((m) => m * 60000);
  const want = Math.max(2, Math.floor(width / 110));
  const step = steps.find((s) => (t1 - t0) / s <= want) || steps[steps.length - 1];
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}

async function drawHistory(box, service, route, metric) {
  const q = new URLSearchParams({ service, route, metric, minutes: "60" });
  const res = await fetch(`/v1/sla/history?${q}`);
  if (!res.ok) { box.textContent = "No history."; return; }
  const h = await res.json();
  const pts = h.points.filter((p) => !absent(p.user_p95_ms) && !absent(p.server_p95_ms));
  box.textContent = "";
  if (!pts.length) { box.textContent = "No history yet."; return; }
  // drawn at the box's own size (no stretched text); redrawn on each refresh
  const W = Math.max(320, Math.round(box.clientWidth || 640)), H = 200;
  const L = 52, R = 12, T = 10, B = 34;  // room for the axes' labels
  const t0 = Date.parse(pts[0].minute), t1 = Math.max(Date.parse(pts[pts.length - 1].minute), t0 + 60000);
  const vals = pts.flatMap((p) => [p.user_p95_ms, p.server_p95_ms + h.band_ms, p.server_p95_ms - h.band_ms]);
  const vlo = Math.min(...vals), vhi = Math.max(...vals), span = vhi - vlo || 1;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - (v - vlo) / span) * (H - T - B);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  const add = (tag, a, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(a)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  // axes: time along the bottom (local clock, whole minutes), ms up the left
  const axis = add("g", { class: "x-axis" });
  const xline = document.createElementNS(NS, "line");
  for (const [k, v] of Object.entries({ x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#999" })) xline.setAttribute(k, v);
  axis.append(xline);
  for (const t of ticks(t0, t1, W - L - R)) {
    const tick = document.createElementNS(NS, "line");
    for (const [k, v] of Object.entries({ x1: x(t), x2: x(t), y1: H - B, y2: H - B + 4, stroke: "#999" })) tick.setAttribute(k, v);
    const label = document.createElementNS(NS, "text");
    for (const [k, v] of Object.entries({ x: x(t), y: H - B + 16, "font-size": "11", fill: "#444", "text-anchor": "middle", class: "x-tick" })) label.setAttribute(k, v);
    // the labels at the ends stay inside the drawing
    label.setAttribute("text-anchor", x(t) > W - R - 20 ? "end" : x(t) < L + 20 ? "start" : "middle");
    label.textContent = new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
    axis.append(tick, label);
  }
  add("text", { x: W - R, y: H - 3, "font-size": "11", fill: "#666", "text-anchor": "end" }, "time (per minute, local)");
  for (const v of [vlo, (vlo + vhi) / 2, vhi]) {
    add("line", { x1: L - 4, x2: W - R, y1: y(v), y2: y(v), stroke: "#eee" });
    add("text", { x: L - 6, y: y(v) + 4, "font-size": "11", fill: "#444", "text-anchor": "end", class: "y-tick" }, `${v.toFixed(0)} ms`);
  }
  const upper = pts.map((p) => `${x(Date.parse(p.minute))},${y(p.server_p95_ms + h.band_ms)}`);
  const lower = pts.map((p) => `${x(Date.parse(p.minute))},${y(p.server_p95_ms - h.band_ms)}`).reverse();
  add("polygon", { points: [...upper, ...lower].join(" "), fill: "#2563eb", "fill-opacity": "0.12" });
  add("polyline", { points: pts.map((p) => `${x(Date.parse(p.minute))},${y(p.server_p95_ms)}`).join(" "), fill: "none", stroke: "#2563eb", "stroke-width": "2" });
  add("polyline", { points: pts.map((p) => `${x(Date.parse(p.minute))},${y(p.user_p95_ms)}`).join(" "), fill: "none", stroke: "#f97316", "stroke-width": "2" });
  box.append(svg, el("div", { class: "legend" },
    el("span", {}, el("span", { class: "sw", style: "background:#f97316" }), `user P95 (${METRIC[metric]})`),
    el("span", {}, el("span", { class: "sw", style: "background:#2563eb" }), "server P95"),
    el("span", {}, el("span", { class: "sw", style: "background:rgba(37,99,235,.12)" }), `band ±${h.band_ms} ms`)));
}

// -- the drill-down: a route's slowest pairs and the parts of each divergence ------------------
// [field, label]; what the pairs table holds per request (null: not measured, never 0)
const REQ_PARTS = [
  ["network_ms", "network δ"],
  ["accept_queue_ms", "accept queue"],
  ["recv_queue_ms", "receive queue"],
  ["server_ttfb_ms", "server TTFB"],
  ["server_ttft_ms", "server TTFT"],
  ["render_delay_ms", "render delay"],
  ["wire_hold_ms", "wire hold"],
];
// and on an LLM answer (llm_dialect set), the engine's side of it
const REQ_LLM_PARTS = [
  ["llm_queue_ms", "queued in the engine"],
  ["llm_prefill_ms", "first token after the queue"],
  ["server_token_gap_p95_ms", "server gap P95"],
  ["user_token_gap_p95_ms", "user gap P95"],
];

function requestParts(q) {
  const cell = el("td", { class: "req-parts" });
  const missing = [];
  for (const [k, label] of q.llm_dialect ? [...REQ_PARTS, ...REQ_LLM_PARTS] : REQ_PARTS) {
    if (absent(q[k])) { missing.push(label); continue; }
    const why = k === "wire_hold_ms" && q.wire_hold_reason ? ` (${q.wire_hold_reason})` : "";
    cell.append(el("span", { class: "part", "data-part": k }, `${label} ${k === "llm_queue_ms" ? dur(q[k]) : fmt(q[k])}${why}`));
  }
  for (const h of q.hops.slice(0, -1)) cell.append(el("span", { class: "part", "data-part": "hop" }, `${h.service} adds ${fmt(h.added_ms)}`));
  if (q.llm_dialect && !absent(q.server_tokens)) cell.append(el("span", { class: "part", "data-part": "tokens" }, `${q.server_tokens} tokens`));
  if (!absent(q.retransmits) && q.retransmits > 0) cell.append(el("span", { class: "part", "data-part": "retransmits" }, `${q.retransmits} retransmits`));
  if (missing.length) cell.append(el("span", { class: "not-measured" }, `not measured: ${missing.join(", ")}`));
  return cell;
}

async function drawSlowest(box, r, metric, win) {
  box.textContent = "";
  const pick = el("select", { class: "slow-metric", "aria-label": "metric" });
  for (const name of Object.keys(r.metrics)) {
    const o = el("option", { value: name }, METRIC[name]);
    if (name === metric) o.selected = true;
    pick.append(o);
  }
  const head = el("h3", {}, "Slowest requests of the window ", pick);
  const out = el("div", { class: "table-wrap" });
  box.append(head, out);
  const load = async () => {
    const m = pick.value;
    const q = new URLSearchParams({ service: r.service, route: r.route, metric: m, since: win.start, until: win.end, limit: "10" });
    const res = await fetch(`/v1/requests/slowest?${q}`);
    out.textContent = "";
    if (!res.ok) { out.append(el("p", { class: "hint" }, `Could not load the requests (${res.status}).`)); return; }
    const doc = await res.json();
    if (!doc.requests.length) { out.append(el("p", { class: "hint" }, "No paired request with both sides of this metric measured.")); return; }
    const t = el("table", { class: "slow" }, el("tr", {}, ...["When", "Trace", "User", "Server", "Gap"].map((h) => el("th", {}, h)),
      el("th", { class: "req-parts" }, "Parts of the gap")));
    for (const q of doc.requests) {
      t.append(el("tr", { "data-trace": q.trace_id },
        el("td", {}, clock(q.time)),
        el("td", { class: "trace" }, el("a", { href: `/v1/requests/${q.trace_id}`, title: `${q.trace_id}: every hop of this request (JSON)` }, q.trace_id.slice(0, 8))),
        el("td", {}, fmt(q.user_ms)), el("td", {}, fmt(q.server_ms)), el("td", { class: "gap" }, `${sgn(q.gap_ms)} ms`),
        requestParts(q)));
    }
    out.append(t, el("p", { class: "hint" }, `${METRIC[m]}: the ${doc.requests.length} slowest as users saw them; gap = user − server. Per request the parts add up where they apply (TTFB: network δ + hops + queues).`));
  };
  pick.addEventListener("change", () => load().catch(() => {}));
  await load();
}

// -- alerts: firing first, then those waiting to fire (pending), then any other state --------
function alertItem(a) {
  const sev = a.severity ? ` sev-${a.severity}` : "";
  const since = a.since ? ` since ${clock(a.since)}` : "";
  return el("li", { class: `${a.state}${sev}`, "data-route": a.route, "data-metric": a.metric },
    el("strong", {}, `${a.route} ${METRIC[a.metric] || a.metric} ${sgn(a.divergence_ms)} ms${since}`),
    el("div", {}, a.sentence));
}

function drawAlerts(current) {
  const groups = { firing: [], pending: [], other: [] };
  // an alert held for lack of data still fires in Alertmanager: it is listed with the firing
  // ones (its summary says "Insufficient data since …")
  const group = { firing: "firing", insufficient_data: "firing", pending: "pending" };
  for (const a of current) groups[group[a.state] || "other"].push(a);
  const fill = (id, items, none) => {
    const ul = document.getElementById(id);
    ul.textContent = "";
    for (const a of items) ul.append(alertItem(a));
    if (!items.length && none) ul.append(el("li", { class: "none" }, none));
  };
  fill("alerts", groups.firing, "None.");
  fill("pending", groups.pending, "None.");
  fill("other-alerts", groups.other, "");
  document.getElementById("other-section").hidden = !groups.other.length;
}

async function refresh() {
  const [sla, alerts] = await Promise.all([fetch("/v1/sla").then((r) => r.json()), fetch("/v1/alerts").then((r) => r.json())]);
  const w = sla.window;
  document.getElementById("window").textContent =
    `Window ${clock(w.start)} – ${clock(w.end)} · ${sla.routes.length} routes`;
  drawAlerts(alerts.current);
  const open = new Set([...document.querySelectorAll("details.route[open]")].map((d) => d.dataset.service + " " + d.dataset.route));
  const box = document.getElementById("routes");
  box.textContent = "";
  if (!sla.routes.length) box.append(el("p", {}, "No paired requests in the window."));
  for (const r of sla.routes) {
    const b = routeBlock(r, w);
    box.append(b);
    if (open.has(r.service + " " + r.route)) b.open = true;
  }
  document.body.dataset.loaded = "1";
}

refresh().catch((e) => { document.getElementById("window").textContent = `Could not load: ${e.message}`; });
setInterval(() => refresh().catch(() => {}), 15000);
