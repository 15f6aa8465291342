// The instrumentation itself, in Node (which has fetch, streams and Resource Timing), against
// a real HTTP server that streams chunks at a known pace.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { begin, cfg, live, onResource, type Entry } from "../src/core";
import { hook, type Trace } from "../src/instrument";
import { resetLazy } from "../src/lazy";
import * as reader from "../src/llm";
import { session, resetSession } from "../src/session";
import { generateTraceContext, parseTraceparent } from "../src/traceContext";
import { beaconErrors } from "./schema";

const GAP_MS = 40;
const CHUNKS = 6;
const seen: Record<string, string | undefined>[] = [];
const sentAt: Record<string, number[]> = {}; // the server's clock at each chunk's write, per URL
let server: http.Server;
let origin = "";
let other = ""; // a second origin: same server, other host name
const emitted: Entry[] = [];
const w = { fetch: globalThis.fetch } as typeof globalThis & Record<string, unknown>;
let obs: PerformanceObserver;

before(async () => {
  server = http.createServer((req, res) => {
    seen.push({ url: req.url, traceparent: req.headers.traceparent as string | undefined });
    if (req.url?.startsWith("/sse")) {
      // A Chat Completions stream: the role-only delta at once, then a token every GAP_MS.
      res.writeHead(200, { "content-type": "text/event-stream" });
      const ev = (d: object | string) => `data: ${typeof d == "string" ? d : JSON.stringify(d)}\n\n`;
      res.write(ev({ choices: [{ delta: { role: "assistant", content: "" } }] }));
      let i = 0;
      const next = (): void => {
        if (i === CHUNKS) return void res.end(ev({ choices: [{ delta: {}, finish_reason: "stop" }] }) + ev("[DONE]"));
        res.write(ev({ choices: [{ delta: { content: `tok${i++} ` } }] }));
        setTimeout(next, GAP_MS);
      };
      setTimeout(next, 20);
      return;
    }
    if (req.url?.startsWith("/boom")) {
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("partial ");
      setTimeout(() => res.destroy(), 30);
      return;
    }
    res.writeHead(200, { "content-type": "text/plain", "server-timing": "app;dur=12.5" });
    let i = 0;
    const sent = (sentAt[req.url ?? ""] = [] as number[]);
    const next = (): void => {
      if (i === CHUNKS) return void res.end();
      sent.push(performance.now());
      res.write(`tok${i++} `);
      setTimeout(next, GAP_MS);
    };
    setTimeout(next, 20);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  origin = `http://127.0.0.1:${port}`;
  other = `http://localhost:${port}`;
  const trace: Trace = (u, tp) => {
    const had = parseTraceparent(tp);
    if (had || u.origin === origin) return [had || generateTraceContext(true), true, !!had];
  };
  cfg.sink = (e) => emitted.push(e);
  hook(w, trace, () => origin + "/page");
  obs = new PerformanceObserver(onResource);
  obs.observe({ type: "resource" });
});

after(() => {
  obs.disconnect();
  server.close();
});

const f = (u: string, init?: RequestInit) => (w.fetch as typeof fetch)(u, init);
async function waitFor<T>(get: () => T | undefined, ms = 4000): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = get();
    if (v !== undefined) return v;
    if (Date.now() - t0 > ms) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
}
const entryFor = (traceId: string) => waitFor(() => emitted.find((e) => e.trace_id === traceId));
const wire = (path: string) => seen.filter((s) => s.url === path).map((s) => s.traceparent);

test("same-origin stream: header on the wire, body unchanged, chunk gaps follow the server", async () => {
  const res = await f(`${origin}/s1`, { method: "POST", body: "q" });
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  let text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString();
  }
  assert.equal(text, Array.from({ length: CHUNKS }, (_, i) => `tok${i} `).join(""));
  const tp = parseTraceparent(wire("/s1")[0]);
  assert.ok(tp, "traceparent on the wire");
  const e = await entryFor(tp.traceId);
  assert.equal(e.span_id, tp.spanId);
  assert.equal(e.method, "POST");
  assert.equal(e.url, `${origin}/s1`);
  assert.equal(e.chunks, CHUNKS);
  // Each chunk timed when the app read it: never before the server wrote it (the probe rounds
  // to 0.1 ms), mostly within a few ms of it. Comparing gaps to GAP_MS failed when a loaded
  // machine delayed one read by 26 ms (gap 13.5): a stall, not the probe. Times taken at the
  // stream's end instead would lag by up to CHUNKS × GAP_MS.
  const lags = (e.chunk_ms as number[]).map((t, i) => t - sentAt["/s1"]![i]!);
  for (const l of lags) assert.ok(l >= -0.1 && l < 120, `lags ${lags}`);
  assert.ok([...lags].sort((a, b) => a - b)[CHUNKS >> 1]! < 15, `lags ${lags}`);
  assert.ok(e.request_start_ms !== undefined && e.response_start_ms !== undefined);
  assert.ok((e.first_chunk_ms as number) >= (e.response_start_ms as number));
  assert.ok(!e.coarse, "Resource Timing matched (Node's has no serverTiming: Chromium tests check it)");
  assert.deepEqual(beaconErrors({ v: 2, site: "t", session: "sess_0123456789", time_origin: performance.timeOrigin, entries: [e] }), []);
});

test("looking at res.body leaves json()/text()/clone() to the app, as without the probe", async () => {
  const expected = Array.from({ length: CHUNKS }, (_, i) => `tok${i} `).join("");
  const a = await f(`${origin}/lazy1`);
  assert.ok(a.body, "the app checks that there is a body …");
  assert.equal(await a.text(), expected, "… and then reads it with text()");
  const b = await f(`${origin}/lazy2`);
  assert.ok(b.body);
  const copy = b.clone();
  assert.equal(await copy.text(), expected);
  assert.equal(await b.text(), expected);
  // the stream, once read, is timed as before
  const c = await f(`${origin}/lazy3`);
  const tp = parseTraceparent(wire("/lazy3")[0]);
  assert.ok(tp);
  const reader = (c.body as ReadableStream<Uint8Array>).getReader();
  while (!(await reader.read()).done);
  assert.equal((await entryFor(tp.traceId)).chunks, CHUNKS);
});

test("an existing traceparent is kept and reported", async () => {
  const mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const res = await f(`${origin}/s2`, { headers: { traceparent: mine } });
  await res.text();
  assert.deepEqual(wire("/s2"), [mine]);
  const e = await entryFor("4bf92f3577b34da6a3ce929d0e0e4736");
  assert.equal(e.span_id, "00f067aa0ba902b7");
});

test("cross-origin not in propagateTo: no header, no entry", async () => {
  const res = await f(`${other}/s3`);
  await res.text();
  assert.deepEqual(wire("/s3"), [undefined]);
});

test("several requests to one URL in flight are matched to their own timings", async () => {
  const rs = await Promise.all([0, 1, 2].map(() => f(`${origin}/same`)));
  await Promise.all(rs.map((r) => r.text()));
  const ids = wire("/same").map((t) => parseTraceparent(t)?.traceId as string);
  assert.equal(new Set(ids).size, 3);
  const es = await Promise.all(ids.map(entryFor));
  for (const e of es) {
    assert.ok(!e.coarse, "each got a Resource Timing entry");
    assert.ok((e.request_start_ms as number) >= e.start_ms - 2);
  }
});

test("a stream that fails: the app's read rejects with the original error; entry says network", async () => {
  const res = await f(`${origin}/boom`);
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  await reader.read();
  await assert.rejects(reader.read(), (err: Error) => err instanceof TypeError);
  const tp = parseTraceparent(wire("/boom")[0]) as { traceId: string };
  const e = await entryFor(tp.traceId);
  assert.equal(e.error, "network");
});

test("a fetch that cannot connect rejects exactly as without the probe", async () => {
  const dead = `${origin.replace(/:\d+$/, "")}:1/x`;
  const a = await (w.fetch as typeof fetch)(dead).catch((e: unknown) => e);
  const b = await globalThis.fetch(dead).catch((e: unknown) => e);
  assert.equal((a as Error).constructor, (b as Error).constructor);
  assert.equal((a as Error).message, (b as Error).message);
});

test("Resource Timing: the latest request started before the entry wins", () => {
  const tc = () => generateTraceContext(true);
  const url = new URL("https://api.example/v1/chat");
  const recs = [0, 1, 2].map(() => begin("fetch", url, tc(), "POST"));
  recs.forEach((r, i) => {
    r.e.start_ms = 100 + i * 10;
    r.b = true; // still streaming: matched but not ended
  });
  const fake = (startTime: number) =>
    ({ getEntries: () => [{ name: url.href, startTime, requestStart: startTime + 1 } as unknown as PerformanceResourceTiming] }) as unknown as PerformanceObserverEntryList;
  onResource(fake(120.5)); // the third request's entry arrives first (it ended first)
  onResource(fake(100.2));
  onResource(fake(110.1));
  assert.deepEqual(recs.map((r) => r.t?.startTime), [100.2, 110.1, 120.5]);
  for (const r of recs) live.delete(r);
});

test("session: sampling decided once per session, rotated after inactivity", () => {
  resetSession();
  const t0 = 1_700_000_000_000;
  const a = session(1, 60_000, t0);
  assert.equal(session(1, 60_000, t0 + 30_000).id, a.id);
  assert.equal(session(1, 60_000, t0 + 80_000).id, a.id, "activity at +30 s kept it alive");
  const b = session(1, 60_000, t0 + 200_000);
  assert.notEqual(b.id, a.id, "rotated after 120 s idle");
  assert.match(b.id, /^[A-Za-z0-9_-]{8,64}$/);
  resetSession();
  assert.equal(session(0, 60_000, t0).sampled, false);
  let n = 0;
  for (let i = 0; i < 2000; i++) {
    resetSession();
    if (session(0.25, 60_000, t0).sampled) n++;
  }
  assert.ok(n > 380 && n < 620, `${n}/2000 sampled at 0.25`);
});

test("Resource Timing fields: phases of new connections, Server-Timing, coarse without TAO", () => {
  const url = new URL("https://api.example/v1/complete");
  const got: Entry[] = [];
  const sink = cfg.sink;
  cfg.sink = (e) => got.push(e);
  try {
    const full = begin("fetch", url, generateTraceContext(true), "GET");
    const hidden = begin("fetch", url, generateTraceContext(true), "GET");
    full.e.start_ms = 10;
    hidden.e.start_ms = 50;
    const rt = (o: Record<string, unknown>) =>
      ({ getEntries: () => [{ name: url.href, ...o } as unknown as PerformanceResourceTiming] }) as unknown as PerformanceObserverEntryList;
    onResource(
      rt({
        startTime: 10.2, domainLookupStart: 10.3, domainLookupEnd: 12.34, connectStart: 12.4,
        secureConnectionStart: 13, connectEnd: 20.04, requestStart: 20.1, responseStart: 80.55,
        responseEnd: 90, transferSize: 300, nextHopProtocol: "h2",
        serverTiming: [{ name: "app", duration: 41.5, description: "" }, { name: "cache", duration: -1, description: "hit" }],
      }),
    );
    // Cross-origin without Timing-Allow-Origin: every phase is 0 except start and end.
    onResource(rt({ startTime: 50.3, requestStart: 0, responseStart: 0, responseEnd: 99.5, domainLookupStart: 0, domainLookupEnd: 0, connectStart: 0, connectEnd: 0, secureConnectionStart: 0 }));
    const [a, b] = got;
    assert.deepEqual(
      [a?.request_start_ms, a?.response_start_ms, a?.response_end_ms, a?.dns_ms, a?.connect_ms, a?.tls_ms, a?.coarse],
      [20.1, 80.6, 90, 2, 7.6, 7, undefined],
    );
    assert.deepEqual(a?.server_timing, [{ name: "app", dur_ms: 41.5 }, { name: "cache", desc: "hit" }]);
    assert.equal(a?.protocol, "h2");
    assert.equal(b?.coarse, true);
    assert.equal(b?.request_start_ms, 50, "the probe's own start");
    assert.equal(b?.response_end_ms, 99.5);
    assert.equal(b?.dns_ms, undefined);
    for (const e of got)
      assert.deepEqual(beaconErrors({ v: 2, site: "t", session: "sess_0123456789", time_origin: 1, entries: [e] }), []);
  } finally {
    cfg.sink = sink;
  }
});

test("an event stream whose first tokens came before the reader: token times are chunk times", async () => {
  resetLazy();
  // The reader arrives 100 ms after it is asked for: the role-only delta and the first tokens
  // (20 ms, then every 40 ms) are held, then replayed.
  let asked = 0;
  cfg.load = (done) => void (asked++, setTimeout(done, 100, reader));
  const res = await f(`${origin}/sse1`);
  const rd = (res.body as ReadableStream<Uint8Array>).getReader();
  let text = "";
  for (;;) {
    const { done, value } = await rd.read();
    if (done) break;
    text += Buffer.from(value).toString();
  }
  assert.ok(text.endsWith("data: [DONE]\n\n"), "the app read the stream unchanged");
  assert.equal(asked, 1);
  const e = await entryFor(parseTraceparent(wire("/sse1")[0])!.traceId);
  const L = e.llm!;
  assert.equal(L.dialect, "openai.chat");
  assert.equal(L.tokens, CHUNKS);
  assert.equal(L.end, "complete");
  assert.equal(e.reason, undefined);
  // each token is dated by the read that returned its chunk, held or not
  assert.ok(L.token_ms!.every((t) => e.chunk_ms!.includes(t)), JSON.stringify([L.token_ms, e.chunk_ms]));
  assert.ok(L.first_token_ms! < e.start_ms + 100, "the first token came while the reader loaded");
  assert.deepEqual(beaconErrors({ v: 2, site: "t", session: "sess_0123456789", time_origin: performance.timeOrigin, entries: [e] }), []);
});

test("an event stream without a reader (the import fails): chunk times, no llm, reason llm_unread", async () => {
  resetLazy();
  cfg.load = (done) => void setTimeout(done, 10, new TypeError("Failed to fetch dynamically imported module"));
  const res = await f(`${origin}/sse2`);
  const text = await new Response(res.body).text();
  assert.ok(text.endsWith("data: [DONE]\n\n"));
  const e = await entryFor(parseTraceparent(wire("/sse2")[0])!.traceId);
  assert.equal(e.llm, undefined);
  assert.equal(e.reason, "llm_unread");
  assert.equal(e.chunks! >= 2, true);
  assert.deepEqual(beaconErrors({ v: 2, site: "t", session: "sess_0123456789", time_origin: performance.timeOrigin, entries: [e] }), []);
});
