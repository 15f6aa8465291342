// What each feature of the probe costs in the <script> build: the build of src/ as it is,
// then once per feature with that feature cut out of a copy of src/ (exact text patches
// below), each through the same pipeline as dist/parallax.min.js (iife.mjs). Prints a
// Markdown table: feature → gzip bytes it costs (and raw bytes). The token reader
// (dist/parallax-llm.min.js, loaded on demand) is measured the same way, in rows of its own.
//
//   node sizes.mjs            (docs/probe.md "Size" holds its output)
//   node sizes.mjs --cut XMLHttpRequest --cut "transport: clock"
//                             the size with those rows (name prefixes) cut together
//
// A patch whose text is no longer in src/ fails loudly: update it with the code.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipBytes, iife } from "./iife.mjs";

/** [feature, [file, text, replacement][]] — each cut leaves a probe that builds. */
const FEATURES = [
  ["fetch (wrapper, header, Response kept, errors)", [
    ["instrument.ts", "if (orig && nativeBody)\n    w.fetch =", "if (0)\n    w.fetch ="],
  ]],
  ["… its stream pass-through (per-chunk times of fetch bodies)", [
    ["instrument.ts", "if (nativeBody.call(resp)) {\n                  timeBody(resp, rec, nativeBody);", "if (0) {\n                  timeBody(resp, rec, nativeBody);"],
  ]],
  ["… reading back the header OpenTelemetry set (loaded before the probe)", [
    ["instrument.ts", "const got = r && sent && parseTraceparent(new Headers(sent.headers).get(TP));\n        if (got) Object.assign(r!.e, ids(got));", ""],
  ]],
  ["LLM streams, the core's part (src/lazy.ts: which streams, the reader imported once, chunks held until it comes, why a stream was not read; the answer's paint)", [
    ["instrument.ts", "                  const f = framing(resp.headers.get(\"content-type\"));\n                  if (f) llm(rec, f);\n", ""],
    ["instrument.ts", "else llm(r, 0);", ""],
    ["instrument.ts", "            feed(r, r.l!, v.value as Uint8Array); // (throws nothing: the reader catches its own)\n", ""],
    ["instrument.ts", "if (!ws) feed(r, r.l!, (ev as MessageEvent).data); // an EventSource's message", ""],
    ["core.ts", "  fin(r); // (before r.d: the reader reads nothing into an entry sent)\n", ""],
    ["core.ts", "    r.c ||= all && !r.x; // a stream still open when the page leaves: the user left it\n", ""],
    ["instrument.ts", "        s.r.c ||= !s.r.x; // the page closed it before the server did\n", ""],
    ["core.ts", "      settle(r);\n", ""],
    ["core.ts", "      if (r.q || r.y! < 0) r.q && (r.m = r.l), r.d || awaiting.push(r);\n      else return !r.m || r.y! > r.m;", "      return 1;"],
    ["core.ts", " && !r.q) emit(r);", ") emit(r);"],
    ["probe.ts", "  cfg.load = load || from(o.llmReader || \"./parallax-llm.min.js\");\n", ""],
  ]],
  ["… the answer's paint (an LLM stream's: after its first answer token, not its first chunk)", [
    ["core.ts", "      settle(r);\n", ""],
    ["core.ts", "      if (r.q || r.y! < 0) r.q && (r.m = r.l), r.d || awaiting.push(r);\n      else return !r.m || r.y! > r.m;", "      return 1;"],
  ]],
  ["XMLHttpRequest", [["instrument.ts", "if (X) {", "if (0) {"]]],
  ["EventSource", [["instrument.ts", "if (ES) {", "if (0) {"]]],
  ["WebSocket (handshake and exchanges)", [["instrument.ts", "if (WS) {", "if (0) {"]]],
  ["EventSource and WebSocket both (adds their shared Proxy constructor)", [
    ["instrument.ts", "if (ES) {", "if (0) {"], ["instrument.ts", "if (WS) {", "if (0) {"],
  ]],
  ["… WebSocket exchanges (seq 1, 2, …; the handshake entry stays)", [
    ["instrument.ts", "    WS.prototype.send = function", "    0 && function"],
    ["instrument.ts", "const c = ws ? s.cur : r;", "const c = ws ? undefined : r;"],
  ]],
  ["Resource Timing for requests (observer, matching)", [
    ["probe.ts", "new PerformanceObserver(guard(onResource)).observe({ type: \"resource\" });", ""],
  ]],
  ["… Resource Timing as a whole: also the entry's t0, t3, end, phases, size, protocol, status (the navigation entry's too)", [
    ["probe.ts", "new PerformanceObserver(guard(onResource)).observe({ type: \"resource\" });", ""],
    ["core.ts", "  const t = r.t;", "  const t = undefined as PerformanceResourceTiming | undefined;"],
  ]],
  ["… Server-Timing entries (server_timing)", [
    ["core.ts", "    const st = (t.serverTiming || []).slice(0, 16).map((s) => {\n      const o: ServerTiming = { name: s.name.slice(0, 64) };\n      if (s.duration > 0) o.dur_ms = s.duration;\n      if (s.description) o.desc = s.description.slice(0, 256);\n      return o;\n    });\n    if (st.length) e.server_timing = st;", ""],
  ]],
  ["render timing (renderTarget, markRendered, paint)", [
    ["probe.ts", "  if (rt)\n    try {", "  if (0)\n    try {"],
    ["global.ts", "  markRendered,\n", ""],
    ["core.ts", "if (cfg.render && !e.hidden && !isHidden()) {", "if (0) {"],
  ]],
  ["navigation entry (Server-Timing / <meta> traceparent)", [
    ["probe.ts", "const navNow = guard(() => navigation(sess().sampled));\n  if (doc.readyState == \"complete\") setTimeout(navNow);\n  else w.addEventListener(\"load\", () => setTimeout(navNow));", ""],
  ]],
  ["session kept in localStorage (else: per page)", [
    ["session.ts", "  try {\n    const x = JSON.parse(localStorage.getItem(KEY)!)", "  if (0) {\n    const x = JSON.parse(localStorage.getItem(KEY)!)"],
    ["session.ts", "  } catch {\n    // no storage (privacy mode, sandboxed iframe): the session lives as long as the page\n  }", "  }"],
    ["session.ts", "    try {\n      localStorage.setItem(KEY, JSON.stringify(s));\n    } catch {\n      // see above\n    }", ""],
  ]],
  ["propagateTo (other origins)", [
    ["probe.ts", "(origin == location.origin ||\n          to.some((p) => (typeof p == \"string\" ? path.startsWith(p.replace(/\\/?$/, \"/\")) : p.test(u.href))))", "origin == location.origin"],
  ]],
  ["page hide: hidden flags, open streams sent, sendBeacon flush", [
    ["probe.ts", "doc.addEventListener(\"visibilitychange\", bye(false));\n  w.addEventListener(\"pagehide\", bye(true));", ""],
  ]],
  ["transport: 32 KB in flight, batches halved to fit", [
    ["transport.ts", "      while (\n        (size", "      if (\n        (size"],
    ["transport.ts", "        n = Math.ceil(n / 2);", "        n = 1;"],
    ["transport.ts", "      if (size > LIMIT) {", "      if (0) {"],
    ["transport.ts", "      if (inflight + size > LIMIT) break;", ""],
    ["transport.ts", "if ((ok = o.beacon(o.to, body))) setTimeout(() => (inflight -= size), 2000);", "ok = o.beacon(o.to, body);"],
    ["transport.ts", "    if (ok) inflight += size;\n", ""],
    ["transport.ts", "            inflight -= size;\n            if (res", "            if (res"],
    ["transport.ts", "            inflight -= size;\n            backOff(0);", "            backOff(0);"],
  ]],
  ["transport: 429/503 back-off (Retry-After, doubling)", [
    ["transport.ts", "            if (res.status == 429 || res.status == 503) {", "            if (0) {"],
    ["transport.ts", "            backOff(0);", ""],
  ]],
  ["transport: clock-drift split (sleep/resume)", [
    ["transport.ts", "const k = q.findIndex((x) => x[1] != q[0]![1]);", "const k = 0;"],
    ["transport.ts", "const jumped = Math.abs(d - last) > 25;", "const jumped = false;"],
  ]],
];

/** The token reader's rows: [feature, patches of src/llm.ts]. */
const READER = [
  ["… its SSE/NDJSON framing of fetch bodies (EventSource messages come framed)", [
    ["llm.ts", "typeof v == \"string\" ? event(r, t, v) : bytes(r, t, v);", "typeof v == \"string\" && event(r, t, v);"],
  ]],
];

async function measure(patches, reader = false) {
  const dir = mkdtempSync(join(tmpdir(), "parallax-size-"));
  try {
    cpSync("src", dir, { recursive: true });
    for (const [file, text, repl] of patches) {
      const f = join(dir, file);
      const s = readFileSync(f, "utf8");
      if (!s.includes(text)) throw new Error(`sizes.mjs: src/${file} no longer has ${JSON.stringify(text.slice(0, 80))}`);
      writeFileSync(f, s.replace(text, repl));
    }
    const code = await iife(join(dir, reader ? "llm.ts" : "global.ts"), reader);
    return { gz: gzipBytes(code), raw: code.length };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const all = await measure([]);
const dedupe = (ps) => {
  const seen = new Set();
  return ps.filter(([f, t]) => !seen.has(f + t) && seen.add(f + t));
};
const cuts = process.argv.flatMap((a, i, v) => (v[i - 1] === "--cut" ? [a] : []));
if (cuts.length) {
  const rows = cuts.map((c) => FEATURES.find(([n]) => n.replace(/^… /, "").startsWith(c)) ?? c);
  const unknown = rows.filter((r) => typeof r == "string");
  if (unknown.length) throw new Error(`sizes.mjs: no feature named ${unknown.join(", ")}`);
  const m = await measure(dedupe(rows.flatMap(([, ps]) => ps)));
  console.log(`${rows.map(([n]) => n).join(" + ")}: ${m.gz} B gzip (saves ${all.gz - m.gz}), ${m.raw} B raw`);
  process.exit(0);
}
console.log(`| Feature | gzip B | raw B |\n|---|---:|---:|`);
for (const [name, patches] of FEATURES) {
  const m = await measure(patches);
  console.log(`| ${name} | ${all.gz - m.gz} | ${all.raw - m.raw} |`);
}
// Everything above cut at once: what every feature stands on (init and its options, trace
// context, sessions and sampling, records and entries, the batching transport).
const base = await measure(dedupe(FEATURES.flatMap(([, ps]) => ps)));
console.log(`| the base all of them stand on (init, trace context, sessions, entries, batching) | ${base.gz} | ${base.raw} |`);
console.log(`| **whole probe** (dist/parallax.min.js) | **${all.gz}** | **${all.raw}** |`);
const rd = await measure([], true);
console.log(`| token reader, loaded on demand (dist/parallax-llm.min.js: src/llm.ts — dialects, token times, counts, endings) | ${rd.gz} | ${rd.raw} |`);
for (const [name, patches] of READER) {
  const m = await measure(patches, true);
  console.log(`| ${name} | ${rd.gz - m.gz} | ${rd.raw - m.raw} |`);
}
