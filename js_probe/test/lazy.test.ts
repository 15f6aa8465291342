// The token reader loaded lazily (src/lazy.ts): streams that start before it has loaded are
// held and replayed at the times their chunks arrived — the same llm object as a direct read;
// past the bound, or without a reader, a stream keeps its chunk times and says why; the
// paint of an LLM stream is the one after its first answer token.
import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";
import { cfg, chunk, end, live, mutated, type Entry, type Rec } from "../src/core";
import { feed, fin, framing, llm, MAX_HELD, resetLazy, type Load } from "../src/lazy";
import * as reader from "../src/llm";
import { beaconErrors } from "./schema";

const enc = new TextEncoder();
const chat = (content: string, extra = "") =>
  `data: {"choices":[{"index":0,"delta":{"content":${JSON.stringify(content)}}${extra}}]}\n\n`;
// A Chat Completions stream cut into chunks (one event across two of them), chunk i at
// (i + 1) * 10 ms: the role-only delta, reasoning, then the answer.
const ROLE = 'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n';
const CHUNKS = [
  ROLE,
  'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n',
  chat("a").slice(0, 20),
  chat("a").slice(20) + chat("b"),
  chat("c", ',"finish_reason":"stop"'),
  "data: [DONE]\n\n",
].map((c) => enc.encode(c));
const at = (i: number) => (i + 1) * 10;

let loads = 0;
let answer: ((x?: unknown) => void) | undefined;
/** A loader the test answers when it chooses (the reader module, an error, nothing). */
const later: Load = (done) => {
  loads++;
  answer = done;
};
const rec = (): Rec => ({ e: { trace_id: "4bf92f3577b34da6a3ce929d0e0e4736", span_id: "00f067aa0ba902b7", kind: "fetch", start_ms: 0 } });
const beacon = (e: Entry) => ({ v: 2, site: "t", session: "sess_0123456789", time_origin: 1.7e12, entries: [e] });
/** What the reader makes of the stream read directly, the module loaded before it began. */
const direct = (x: number): Entry => {
  const r = rec();
  reader.open(r, [1]);
  CHUNKS.forEach((c, i) => reader.read(r, at(i), c));
  r.x = x;
  reader.summary(r);
  return r.e;
};

beforeEach(() => {
  resetLazy();
  loads = 0;
  answer = undefined;
  cfg.load = later;
});

test("the candidate rule: event streams and NDJSON by content type, nothing else", () => {
  assert.deepEqual(
    ["text/event-stream; charset=utf-8", "application/x-ndjson", "application/jsonl", "application/json", "text/csv", null].map(framing),
    [1, 2, 2, 0, 0, 0],
  );
});

test("held while the reader loads, then replayed at the times they arrived: the same llm object", () => {
  const a = rec(); // its first chunks before the reader, the rest after
  const b = rec(); // the whole stream before the reader, ended before it came
  llm(a, 1);
  llm(b, 1);
  assert.equal(loads, 1, "asked for once per page");
  CHUNKS.slice(0, 3).forEach((c, i) => feed(a, at(i), c));
  CHUNKS.forEach((c, i) => feed(b, at(i), c));
  assert.ok(a.q && b.q && !a.k, "held, not read");
  answer!(reader); // the module arrives (at, say, 35 ms)
  CHUNKS.slice(3).forEach((c, i) => feed(a, at(i + 3), c));
  for (const r of [a, b]) {
    r.x = 70;
    fin(r);
    assert.equal(r.q, 0);
    assert.deepEqual(r.e, direct(70), "token times are arrival times, not replay times");
    assert.deepEqual(beaconErrors(beacon(r.e)), []);
  }
  const L = a.e.llm!;
  assert.deepEqual([L.first_output_ms, L.first_token_ms, L.token_ms, L.end], [20, 40, [20, 40, 40, 50], "complete"]);
  const c = rec(); // after the reader came: read at once
  llm(c, 1);
  assert.ok(c.k && !c.q);
  assert.equal(loads, 1);
});

test("an EventSource's messages are held and replayed too", () => {
  const r = rec();
  llm(r, 0);
  feed(r, 5, JSON.stringify({ choices: [{ delta: { role: "assistant" } }] }));
  feed(r, 6, JSON.stringify({ choices: [{ delta: { content: "x" } }] }));
  answer!(reader);
  feed(r, 7, "[DONE]");
  r.c = true;
  fin(r);
  assert.deepEqual([r.e.llm?.first_token_ms, r.e.llm?.tokens, r.e.llm?.end], [6, 1, "complete"]);
});

test("past the bound (MAX_HELD in all): that stream is not read (llm_overflow); the others are", () => {
  const a = rec();
  const b = rec();
  llm(a, 1);
  llm(b, 1);
  CHUNKS.slice(0, 4).forEach((c, i) => feed(a, at(i), c));
  const big = enc.encode(`: ${"x".repeat(MAX_HELD)}\n\n`); // one heartbeat comment, 128 KiB
  feed(b, 5, ROLE);
  feed(b, 6, big);
  assert.equal(b.q, 0);
  assert.equal(b.e.reason, "llm_overflow");
  // b's bytes were let go: a stream after it is held again
  const c = rec();
  llm(c, 1);
  CHUNKS.forEach((x, i) => feed(c, at(i), x));
  assert.ok(c.q);
  answer!(reader);
  CHUNKS.slice(4).forEach((x, i) => feed(a, at(i + 4), x));
  feed(b, 7, enc.encode(chat("late")));
  for (const r of [a, b, c]) (r.x = 70), fin(r);
  assert.deepEqual(c.e, direct(70));
  assert.deepEqual(a.e, direct(70));
  assert.equal(b.e.llm, undefined, "no llm object: its first chunks are gone");
  assert.equal(b.e.reason, "llm_overflow");
  assert.deepEqual(beaconErrors(beacon(b.e)), []);
});

test("no reader (404, CSP, network: the import rejects; or not the reader): llm_unread", () => {
  for (const outcome of [new TypeError("Failed to fetch dynamically imported module"), { default: 1 }, undefined]) {
    resetLazy();
    const asked = loads;
    const held = rec();
    llm(held, 1);
    feed(held, 10, CHUNKS[0]!);
    answer!(outcome);
    feed(held, 20, CHUNKS[1]!);
    const after = rec(); // a stream after the failure: not held at all
    llm(after, 2);
    for (const r of [held, after]) {
      fin(r);
      assert.equal(r.e.llm, undefined);
      assert.equal(r.e.reason, "llm_unread");
      assert.equal(r.q, 0);
    }
    assert.equal(loads, asked + 1, "asked for once per page");
  }
});

test("an entry sent while the reader is still loading: llm_unread", () => {
  const r = rec();
  llm(r, 1);
  feed(r, 10, CHUNKS[0]!);
  fin(r);
  assert.equal(r.e.reason, "llm_unread");
  assert.equal(r.e.llm, undefined);
  answer!(reader); // too late for that one
  feed(r, 20, CHUNKS[1]!);
  assert.equal(r.e.llm, undefined);
});

test("an ended stream's entry waits for the reader (as long as any entry waits)", async () => {
  const got: Entry[] = [];
  const sink = cfg.sink;
  cfg.sink = (e) => got.push(e);
  try {
    const r = rec(); // no Resource Timing will come for it (no r.n): only the reader holds it
    live.add(r);
    llm(r, 1);
    CHUNKS.forEach((c, i) => feed(r, at(i), c));
    end(r, "", 70);
    assert.equal(got.length, 0, "held: not sent yet");
    answer!(reader);
    await new Promise((res) => setTimeout(res, 1600)); // core.ts WAIT_MS
    assert.equal(got.length, 1);
    assert.deepEqual(got[0]!.llm, direct(70).llm);
  } finally {
    cfg.sink = sink;
  }
});

test("paint: an LLM stream's is the one after its first answer token", async () => {
  const g = globalThis as { requestAnimationFrame?: (f: () => void) => void };
  g.requestAnimationFrame = (f) => void setTimeout(f, 1);
  cfg.render = true;
  const frames = () => new Promise((res) => setTimeout(res, 20));
  const step = (r: Rec, i: number) => {
    chunk(r, at(i));
    feed(r, at(i), CHUNKS[i]!);
  };
  try {
    // held, a mutation before the answer (a spinner on the role-only delta), the reader, the answer
    const held = rec();
    // held, the answer's first paint while held: not known
    const missed = rec();
    const plain = rec(); // no LLM stream: the paint after the first chunk
    for (const r of [held, missed, plain]) live.add(r);
    llm(held, 1);
    llm(missed, 1);
    step(held, 0);
    chunk(plain, 5);
    for (let i = 0; i < 4; i++) step(missed, i); // its first answer token at 40
    mutated();
    await frames();
    assert.ok(plain.e.rendered_ms, "painted");
    assert.equal(held.e.rendered_ms, undefined, "held: cannot tell yet");
    answer!(reader);
    step(held, 1); // reasoning: not the answer
    mutated();
    await frames();
    assert.equal(held.e.rendered_ms, undefined, "reasoning shown: not the answer's paint");
    step(held, 2);
    step(held, 3); // the first answer token (40)
    mutated();
    await frames();
    assert.ok(held.e.rendered_ms, "the paint after the first answer token");
    assert.equal(held.e.llm?.first_token_ms, 40);
    assert.equal(missed.e.rendered_ms, undefined, "its answer was painted while it was held");
    assert.equal(missed.e.llm?.first_token_ms, 40);
    for (const r of [held, missed, plain]) live.delete(r);
  } finally {
    cfg.render = false;
    delete g.requestAnimationFrame;
  }
});
