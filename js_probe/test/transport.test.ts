import { test } from "node:test";
import assert from "node:assert/strict";
import type { Entry } from "../src/core";
import { LIMIT, transport, type TransportOptions } from "../src/transport";
import { beaconErrors } from "./schema";

interface Sent {
  via: "beacon" | "fetch";
  body: string;
  keepalive?: boolean | undefined;
  resolve?: (r: Response) => void;
}

function entry(i: number, chunks = 0): Entry {
  const e: Entry = {
    trace_id: (i + 1).toString(16).padStart(32, "0"),
    span_id: "00f067aa0ba902b7",
    kind: "fetch",
    start_ms: 10 + i,
    url: "https://app.example/v1/chat",
    method: "POST",
  };
  if (chunks) {
    e.chunk_ms = Array.from({ length: chunks }, (_, k) => 1000.1 + k * 40.3);
    e.first_chunk_ms = 1000.1;
    e.chunks = chunks;
  }
  return e;
}

/** A transport whose fetch/sendBeacon are recorded; fetches stay pending until resolved. */
function rig(o: Partial<TransportOptions> & { beaconOk?: () => boolean; hold?: boolean } = {}) {
  const sent: Sent[] = [];
  const t = transport({
    to: "https://collector.example/v1/beacons",
    head: () => ({ site: "test-site", session: "sess_0123456789", page: "/chat" }),
    batch: 50,
    bound: 500,
    interval: 60_000,
    post: (_url, init) => {
      const s: Sent = { via: "fetch", body: String(init.body), keepalive: init.keepalive };
      sent.push(s);
      if (!o.hold) return Promise.resolve(new Response(null, { status: 204 }));
      return new Promise<Response>((res) => (s.resolve = res));
    },
    beacon: (_url, body) => {
      const ok = o.beaconOk ? o.beaconOk() : true;
      if (ok) sent.push({ via: "beacon", body });
      return ok;
    },
    ...o,
  });
  const beacons = () => sent.map((s) => JSON.parse(s.body) as { entries: Entry[]; dropped?: number; clock_drift_ms: number });
  return { t, sent, beacons };
}

const tick = () => new Promise((r) => setTimeout(r, 0));

test("batches by maxBatch and every beacon conforms to the v1 schema", async () => {
  const { t, sent, beacons } = rig({ batch: 3 });
  for (let i = 0; i < 7; i++) t.push(entry(i, i));
  assert.equal(sent.length, 2, "two full batches go at once");
  t.flush();
  await tick();
  assert.deepEqual(beacons().map((b) => b.entries.length), [3, 3, 1]);
  assert.deepEqual(
    beacons().flatMap((b) => b.entries.map((e) => e.start_ms)),
    [10, 11, 12, 13, 14, 15, 16],
    "order kept",
  );
  for (const b of beacons()) assert.deepEqual(beaconErrors(b), []);
  assert.ok(sent.every((s) => s.via === "fetch" && s.keepalive), "visible page: fetch keepalive");
});

test("the flush interval sends a partial batch", async () => {
  const { t, sent } = rig({ interval: 100 });
  t.push(entry(0));
  assert.equal(sent.length, 0);
  await new Promise((r) => setTimeout(r, 250));
  assert.equal(sent.length, 1);
});

test("a bounded queue drops the oldest and reports the count once", async () => {
  let ok = false;
  const { t, sent, beacons } = rig({ bound: 5, post: undefined, beaconOk: () => ok });
  for (let i = 0; i < 8; i++) t.push(entry(i));
  t.flush(true);
  assert.equal(sent.length, 0, "sendBeacon refused: nothing sent, nothing lost beyond the bound");
  ok = true;
  t.flush(true);
  t.push(entry(8));
  t.flush(true);
  const [first, second] = beacons();
  assert.deepEqual(first?.entries.map((e) => e.start_ms), [13, 14, 15, 16, 17], "the newest five");
  assert.equal(first?.dropped, 3);
  assert.equal(second?.dropped, undefined, "reported once");
  for (const b of beacons()) assert.deepEqual(beaconErrors(b), []);
});

test("hidden: sendBeacon first, and fetch keepalive when it returns false", () => {
  let calls = 0;
  const { t, sent } = rig({ beaconOk: () => ++calls > 1 });
  t.push(entry(0));
  t.flush(true);
  assert.equal(sent[0]?.via, "fetch", "sendBeacon said false: the same body by fetch keepalive");
  assert.equal(sent[0]?.keepalive, true);
  t.push(entry(1));
  t.flush(true);
  assert.equal(sent[1]?.via, "beacon");
});

test("at most 32 KB of beacons in flight; the rest waits for the quota", async () => {
  const { t, sent } = rig({ hold: true, batch: 500 });
  for (let i = 0; i < 60; i++) t.push(entry(i, 256)); // ~3 KB each
  t.flush();
  const bytes = (ss: Sent[]) => ss.reduce((n, s) => n + Buffer.byteLength(s.body), 0);
  assert.ok(sent.length >= 1);
  assert.ok(bytes(sent) <= LIMIT, `in flight ${bytes(sent)} B`);
  const first = sent.length;
  const sentEntries = () => sent.reduce((n, s) => n + (JSON.parse(s.body) as { entries: unknown[] }).entries.length, 0);
  assert.ok(sentEntries() < 60, "not everything fits at once");
  for (const s of [...sent]) s.resolve?.(new Response(null, { status: 204 }));
  await tick();
  t.flush();
  assert.ok(sent.length > first, "the quota freed: more sent");
  assert.ok(bytes(sent.slice(first)) <= LIMIT);
  for (let k = 0; k < 10 && sentEntries() < 60; k++) {
    for (const s of sent) s.resolve?.(new Response(null, { status: 204 }));
    await tick();
    t.flush();
  }
  assert.equal(sentEntries(), 60, "all delivered, none twice");
});

test("429/503: keeps the entries, backs off while visible, sends on hide", async () => {
  let status = 429;
  const sent: string[] = [];
  const t = transport({
    to: "https://collector.example/v1/beacons",
    head: () => ({ site: "s", session: "sess_0123456789", page: "/" }),
    batch: 50,
    bound: 500,
    interval: 60_000,
    post: (_u, init) => {
      sent.push(String(init.body));
      return Promise.resolve(new Response(null, { status, headers: { "retry-after": "1" } }));
    },
    beacon: (_u, body) => (sent.push("beacon:" + body), true),
  });
  t.push(entry(0));
  t.flush();
  await tick();
  assert.equal(sent.length, 1);
  t.push(entry(1));
  t.flush();
  await tick();
  assert.equal(sent.length, 1, "backing off: nothing sent while visible");
  status = 503;
  t.flush(true);
  assert.equal(sent.length, 2);
  const b = JSON.parse((sent[1] as string).slice("beacon:".length)) as { entries: Entry[] };
  assert.deepEqual(b.entries.map((e) => e.start_ms), [10, 11], "the refused entry was kept");
});

test("clock drift: a jump splits the batch; each beacon carries the drift of its entries", () => {
  const { t, beacons } = rig();
  const realNow = Date.now;
  try {
    t.push(entry(0));
    t.push(entry(1));
    const base = realNow.call(Date);
    Date.now = () => base + 5000 + (realNow.call(Date) - base); // the machine slept 5 s
    t.push(entry(2));
    t.flush();
  } finally {
    Date.now = realNow;
  }
  const [a, b] = beacons();
  assert.deepEqual(a?.entries.map((e) => e.start_ms), [10, 11]);
  assert.deepEqual(b?.entries.map((e) => e.start_ms), [12]);
  assert.ok(Math.abs((b?.clock_drift_ms ?? 0) - (a?.clock_drift_ms ?? 0) - 5000) < 5, `${a?.clock_drift_ms} → ${b?.clock_drift_ms}`);
  for (const x of beacons()) assert.deepEqual(beaconErrors(x), []);
});

test("clock drift: entries queued while sending is blocked keep their own drift", async () => {
  const sent: string[] = [];
  const t = transport({
    to: "https://collector.example/v1/beacons",
    head: () => ({ site: "s", session: "sess_0123456789", page: "/" }),
    batch: 50,
    bound: 500,
    interval: 60_000,
    post: (_u, init) => {
      sent.push(String(init.body));
      return Promise.resolve(new Response(null, { status: 429, headers: { "retry-after": "60" } }));
    },
    beacon: (_u, body) => (sent.push(body), true),
  });
  const realNow = Date.now;
  try {
    t.push(entry(0));
    t.flush();
    await tick(); // refused: backing off, the entry is queued again
    t.push(entry(1));
    const base = realNow.call(Date);
    Date.now = () => base + 5000 + (realNow.call(Date) - base); // the machine slept 5 s
    t.push(entry(2)); // the jump's flush is blocked by the back-off
    t.push(entry(3));
    t.flush(true);
  } finally {
    Date.now = realNow;
  }
  const out = sent.slice(1).map((s) => JSON.parse(s) as { entries: Entry[]; clock_drift_ms: number });
  assert.deepEqual(out.map((b) => b.entries.map((e) => e.start_ms)), [[10, 11], [12, 13]]);
  const [a, b] = out;
  assert.ok(Math.abs((b?.clock_drift_ms ?? 0) - (a?.clock_drift_ms ?? 0) - 5000) < 5, `${a?.clock_drift_ms} → ${b?.clock_drift_ms}`);
});
