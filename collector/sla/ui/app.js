// The SLA page: no framework; reads /v1/sla, /v1/alerts and /v1/sla/history.
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
const fmt = (v) => (v === null || v === undefined ? "—" : `${Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(1)} ms`);
const sgn = (v) => (v === null || v === undefined ? "?" : `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(1)}`);
// an interval bound that is null is unbounded (too few samples for that rank)
const lo = (v) => (v === null || v === undefined ? "−∞" : sgn(v));
const hi = (v) => (v === null || v === undefined ? "+∞" : sgn(v));
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
  if (p.network_p95_ms !== null) out.push(`network δ ${fmt(p.network_p95_ms)}`);
  if (p.accept_queue_p95_ms !== null) out.push(`accept queue ${fmt(p.accept_queue_p95_ms)}`);
  if (p.recv_queue_p95_ms !== null) out.push(`receive queue ${fmt(p.recv_queue_p95_ms)}`);
  if (p.server_processing_p95_ms !== null) out.push(`server processing ${fmt(p.server_processing_p95_ms)}`);
  if (p.render_delay_p95_ms !== null) out.push(`render delay ${fmt(p.render_delay_p95_ms)}`);
  for (const h of p.hops || []) out.push(`hop ${h.index} ${h.service} adds ${fmt(h.added_p95_ms)}`);
  if (p.retransmit_share !== null) out.push(`retransmits in ${(100 * p.retransmit_share).toFixed(1)}% of requests`);
  return out.length ? `Parts (P95): ${out.join(", ")}` : "";
}

// The server's own view of the route: where its time goes (queue, prefill to the first token,
// decode to the last), P50 and P95 of each window, and what the GPU was doing in them.
const GPU_WORDS = { gpu_bound: "GPU-bound", before_gpu: "Waits before the GPU", clock_low: "GPU clock low" };
const WINDOWS = [
  ["queue", "Queue", "kernel accept + receive queues, before the app reads the request"],
  ["prefill", "Prefill", "app reads the request → first body write (first token)"],
  ["decode", "Decode", "first → last body write (the stream)"],
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

function serverBlock(s) {
  // without the agent's kernel timings there is no first-token time to split at
  if ((s.prefill_p95_ms === null || s.prefill_p95_ms === undefined) && !s.gpu) return null;
  const rows = WINDOWS.filter(([k]) => s[`${k}_p95_ms`] !== null && s[`${k}_p95_ms`] !== undefined);
  const box = el("div", { class: "server" }, el("h3", {}, "Server time per request"));
  const t = el("table", { class: "split" }, el("tr", {}, ...["Window", "P50", "P95"].map((h) => el("th", {}, h))));
  for (const [k, label, what] of rows) {
    t.append(el("tr", { "data-window": k, title: what },
      el("td", {}, label), el("td", {}, fmt(s[`${k}_p50_ms`])), el("td", {}, fmt(s[`${k}_p95_ms`]))));
  }
  box.append(t, el("p", { class: "hint" }, `${s.n} paired requests. P50 is the typical request, P95 the tail the SLA judges; percentiles of parts do not add up.`));
  if (s.gpu) {
    const cov = s.gpu.sample_coverage === null ? "" : ` · NVML samples cover ${(100 * s.gpu.sample_coverage).toFixed(0)} % of their time`;
    const n = s.gpu.gpus.length;
    const on = n ? ` on ${n} GPU${n === 1 ? "" : "s"}` : "";
    box.append(el("p", { class: "gpu-head" }, `GPU: ${s.gpu.requests} requests with GPU figures${on}${cov}`));
  }
  const ul = el("ul", { class: "findings" });
  for (const f of s.findings) ul.append(el("li", { class: `f-${f.id}`, "data-finding": f.id }, f.sentence));
  if (s.findings.length) box.append(ul);
  return box;
}

// The agent's sampling: the share of the service's requests it traced (its exact counts).
function samplingBadge(s) {
  if (!s || !s.sentence) return [];
  const share = s.traced_share;
  if (share === null || share === undefined) return [el("span", { class: "sampling-badge" }, "sampled")];
  if (share >= 1) return [];
  const pct = 100 * share;
  return [el("span", { class: "sampling-badge", title: s.sentence }, `traced ${pct >= 10 ? pct.toFixed(0) : pct.toFixed(1)} %`)];
}

function routeBlock(r) {
  const [wname, wm] = worstMetric(r);
  const d = el("details", { class: "route", "data-route": r.route, "data-service": r.service });
  const summary = el("summary", {},
    el("span", { class: "route-name" }, r.route),
    el("span", {}, el("span", { class: `verdict v-${r.verdict}` }, WORDS[r.verdict]), " ",
      headline(wname, wm), ...samplingBadge(r.sampling), ...gpuBadges(r.server)),
    el("span", { class: "service" }, r.service));
  d.append(summary);
  const body = el("div", { class: "body" });
  if (r.sampling && r.sampling.sentence) body.append(el("p", { class: "sampling" }, r.sampling.sentence));
  const user = el("div", { class: "user" }, el("h3", {}, "What users see against what the app reports"));
  const t = el("table", {}, el("tr", {}, ...["Metric", "Verdict", "Divergence", "95% CI", "User P95", "Server P95", "n", "Alert"].map((h) => el("th", {}, h))));
  for (const [name, m] of Object.entries(r.metrics)) {
    t.append(el("tr", { "data-metric": name },
      el("td", {}, METRIC[name]),
      el("td", { class: "verdict-cell" }, el("span", { class: `verdict v-${m.verdict}` }, WORDS[m.verdict])),
      el("td", { class: "div" }, `${sgn(m.divergence_ms)} ms`),
      el("td", {}, `${lo(m.ci_low_ms)}…${hi(m.ci_high_ms)}`),
      el("td", {}, fmt(m.user_p95_ms)), el("td", {}, fmt(m.server_p95_ms)),
      el("td", { class: "n", title: m.n_eff < m.n ? "pairs (effective sample size: the sampling rate varied)" : "pairs" },
        m.n_eff < m.n ? `${m.n} (${m.n_eff} eff.)` : m.n),
      el("td", {}, m.alert_state)));
  }
  user.append(t);
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
  body.append(chart);
  d.append(body);
  d.addEventListener("toggle", () => { if (d.open) drawHistory(chart, r.service, r.route, wname); });
  return d;
}

async function drawHistory(box, service, route, metric) {
  const q = new URLSearchParams({ service, route, metric, minutes: "60" });
  const res = await fetch(`/v1/sla/history?${q}`);
  if (!res.ok) { box.textContent = "No history."; return; }
  const h = await res.json();
  const pts = h.points.filter((p) => p.user_p95_ms !== null && p.server_p95_ms !== null);
  box.textContent = "";
  if (!pts.length) { box.textContent = "No history yet."; return; }
  const W = 1000, H = 180, P = 34;
  const t0 = Date.parse(pts[0].minute), t1 = Math.max(Date.parse(pts[pts.length - 1].minute), t0 + 60000);
  const vals = pts.flatMap((p) => [p.user_p95_ms, p.server_p95_ms + h.band_ms, p.server_p95_ms - h.band_ms]);
  const lo = Math.min(...vals), hi = Math.max(...vals), span = hi - lo || 1;
  const x = (m) => P + ((Date.parse(m) - t0) / (t1 - t0)) * (W - 2 * P);
  const y = (v) => H - P / 2 - ((v - lo) / span) * (H - P);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart"); svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const add = (tag, a) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(a)) e.setAttribute(k, v); svg.append(e); return e; };
  const upper = pts.map((p) => `${x(p.minute)},${y(p.server_p95_ms + h.band_ms)}`);
  const lower = pts.map((p) => `${x(p.minute)},${y(p.server_p95_ms - h.band_ms)}`).reverse();
  add("polygon", { points: [...upper, ...lower].join(" "), fill: "#2563eb", "fill-opacity": "0.12" });
  add("polyline", { points: pts.map((p) => `${x(p.minute)},${y(p.server_p95_ms)}`).join(" "), fill: "none", stroke: "#2563eb", "stroke-width": "2" });
  add("polyline", { points: pts.map((p) => `${x(p.minute)},${y(p.user_p95_ms)}`).join(" "), fill: "none", stroke: "#f97316", "stroke-width": "2" });
  const label = add("text", { x: 4, y: 14, "font-size": "12", fill: "#444" }); label.textContent = `${hi.toFixed(0)} ms`;
  const label2 = add("text", { x: 4, y: H - 4, "font-size": "12", fill: "#444" }); label2.textContent = `${lo.toFixed(0)} ms`;
  box.append(svg, el("div", { class: "legend" },
    el("span", {}, el("span", { class: "sw", style: "background:#f97316" }), `user P95 (${METRIC[metric]})`),
    el("span", {}, el("span", { class: "sw", style: "background:#2563eb" }), "server P95"),
    el("span", {}, el("span", { class: "sw", style: "background:rgba(37,99,235,.12)" }), `band ±${h.band_ms} ms`)));
}

async function refresh() {
  const [sla, alerts] = await Promise.all([fetch("/v1/sla").then((r) => r.json()), fetch("/v1/alerts").then((r) => r.json())]);
  const w = sla.window;
  document.getElementById("window").textContent =
    `Window ${new Date(w.start).toLocaleTimeString()} – ${new Date(w.end).toLocaleTimeString()} · ${sla.routes.length} routes`;
  const ul = document.getElementById("alerts");
  ul.textContent = "";
  for (const a of alerts.current) {
    ul.append(el("li", { class: `${a.state} sev-${a.severity}`, "data-route": a.route, "data-metric": a.metric },
      el("strong", {}, `${a.state === "firing" ? "Firing" : "Pending"}: ${a.route} ${METRIC[a.metric]} ${sgn(a.divergence_ms)} ms`),
      el("div", {}, a.sentence)));
  }
  if (!alerts.current.length) ul.append(el("li", { class: "none" }, "None."));
  const open = new Set([...document.querySelectorAll("details.route[open]")].map((d) => d.dataset.service + " " + d.dataset.route));
  const box = document.getElementById("routes");
  box.textContent = "";
  if (!sla.routes.length) box.append(el("p", {}, "No paired requests in the window."));
  for (const r of sla.routes) {
    const b = routeBlock(r);
    box.append(b);
    if (open.has(r.service + " " + r.route)) b.open = true;
  }
  document.body.dataset.loaded = "1";
}

refresh().catch((e) => { document.getElementById("window").textContent = `Could not load: ${e.message}`; });
setInterval(() => refresh().catch(() => {}), 15000);
