// The probe's LLM stream reader (src/llm.ts) against the agent's: the shared vectors
// (docs/contracts/llm-stream-vectors.json, written from agent/protocols/streams), then what
// only the page meets — bytes split inside a UTF-8 character or a CRLF, a 1 MB event,
// garbage, answers longer than the exact times kept, how a stream ended.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import type { Entry, Rec } from "../src/core";
import { bytes, event, MAX_EVENT, MAX_TOKENS, open, summary } from "../src/llm";
import { beaconErrors } from "./schema";

interface Vector {
  name: string;
  framing: "sse" | "ndjson";
  writes: string[];
  expect: {
    dialect: string | null;
    first_token?: number | null;
    first_output?: number | null;
    token_writes?: number[];
    tokens?: number;
    tokens_source?: string;
    end?: string;
  };
}
const VECTORS = (
  JSON.parse(readFileSync(new URL("../../../docs/contracts/llm-stream-vectors.json", import.meta.url), "utf8")) as {
    vectors: Vector[];
  }
).vectors;

const enc = new TextEncoder();
const rec = (framing: number): Rec => {
  const r: Rec = { e: { trace_id: "4bf92f3577b34da6a3ce929d0e0e4736", span_id: "00f067aa0ba902b7", kind: "fetch", start_ms: 0 } };
  open(r, [framing]);
  return r;
};
/** Each piece one chunk, chunk i at (i + 1) * 10 ms; the stream then ends (read to its end). */
const read = (framing: number, pieces: (string | Uint8Array)[]): Entry => {
  const r = rec(framing);
  pieces.forEach((p, i) => bytes(r, (i + 1) * 10, typeof p == "string" ? enc.encode(p) : p));
  r.x = pieces.length * 10;
  summary(r);
  return r.e;
};
const at = (i: number | null | undefined) => (i == null ? undefined : (i + 1) * 10);
const beacon = (e: Entry) => ({ v: 2, site: "t", session: "sess_0123456789", time_origin: 1.7e12, entries: [e] });

test("the shared vectors: the probe reads each stream as the agent does", () => {
  assert.ok(VECTORS.length >= 20);
  for (const v of VECTORS) {
    const e = read(v.framing == "sse" ? 1 : 2, v.writes);
    const x = v.expect;
    if (!x.dialect) {
      assert.equal(e.llm, undefined, v.name);
      continue;
    }
    const L = e.llm!;
    assert.equal(L.dialect, x.dialect, v.name);
    assert.equal(L.first_token_ms, at(x.first_token), `${v.name}: first answer token`);
    assert.equal(L.first_output_ms, at(x.first_output), `${v.name}: first output token`);
    assert.deepEqual(L.token_ms ?? [], x.token_writes!.map(at), `${v.name}: every token's write`);
    assert.equal(L.tokens, x.tokens, `${v.name}: tokens`);
    assert.equal(L.tokens_source, x.tokens_source, v.name);
    assert.equal(L.end, x.end, v.name);
    assert.deepEqual(beaconErrors(beacon(e)), [], v.name);
  }
});

const chat = (content: string, extra = "") =>
  `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":${JSON.stringify(content)}}${extra}}]}\n\n`;

test("a chunk boundary inside a UTF-8 character, or between \\r and \\n, changes nothing", () => {
  const body = enc.encode(
    ': hb\r\n\r\ndata: {"choices":[{"delta":{"role":"assistant","content":""}}]}\r\n\r\n' +
      'data: {"choices":[{"delta":\r\ndata: {"content":"é"}}]}\r\n\r\n' + // one event, two data lines
      'data: {"choices":[{"delta":{"content":"ü"},"finish_reason":"stop"}]}\r\n\r\ndata: [DONE]\r\n\r\n',
  );
  const whole = read(1, [body]).llm!;
  assert.equal(whole.tokens, 2);
  assert.equal(whole.end, "complete");
  for (let cut = 1; cut < body.length; cut++) {
    const e = read(1, [body.slice(0, cut), body.slice(cut)]);
    assert.equal(e.llm?.tokens, 2, `cut at ${cut}`);
    assert.equal(e.llm?.bad_events, undefined, `cut at ${cut}`);
    assert.equal(e.llm?.end, "complete", `cut at ${cut}`);
  }
});

test("a 1 MB event is not read, counted, and the events after it are", () => {
  const big = chat("y".repeat(1 << 20));
  const pieces = [chat(""), chat("a"), ...(big.match(/[^]{1,65536}/g) as string[]), chat("b"), chat("c", ',"finish_reason":"stop"')];
  const e = read(1, pieces);
  assert.ok(e.llm);
  assert.equal(e.llm.bad_events, 1);
  assert.equal(e.llm.tokens, 3); // a, b, c: the event over MAX_EVENT is not a token here
  assert.equal(e.llm.end, "complete");
  const oneWrite = read(1, [chat("a") + big + chat("b")]);
  assert.equal(oneWrite.llm?.bad_events, 1);
  assert.equal(oneWrite.llm?.tokens, 2);
  assert.ok(MAX_EVENT < big.length);
});

test("garbage never throws, and a stream in no dialect gets no llm object", () => {
  let seed = 7;
  const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  for (let n = 0; n < 300; n++) {
    const bytesIn = Uint8Array.from({ length: 1 + Math.floor(rnd() * 400) }, () => Math.floor(rnd() * 256));
    for (const framing of [1, 2]) {
      const e = read(framing, [bytesIn.slice(0, 150), bytesIn.slice(150)]);
      assert.deepEqual(beaconErrors(beacon(e)), []);
    }
  }
  // After a chat stream is recognised, malformed events are counted, not tokens.
  const e = read(1, [chat(""), chat("a"), "data: {oops\n\n", 'data: {"choices": 5}\n\n', "data: [1,2\n\n", chat("b")]);
  assert.equal(e.llm?.tokens, 2);
  assert.equal(e.llm?.bad_events, 2); // not JSON twice; {"choices": 5} is JSON without a token
  // a CSV body announced as an event stream by mistake: no dialect
  assert.equal(read(1, ["id,value\n1,1\n\n2,4\n\n3,9\n\n4,16\n\n5,25\n\n"]).llm, undefined);
});

test("a long answer: exact times for the first 1024 tokens, every later gap in the histogram", () => {
  const r = rec(1);
  const n = 1500;
  bytes(r, 5, enc.encode(chat("")));
  for (let i = 0; i < n; i++) bytes(r, 100 + i * 20 + (i >= 1200 ? 300 : 0), enc.encode(chat(`w${i}`)));
  bytes(r, 100 + n * 20 + 300, enc.encode('data: {"choices":[],"usage":{"completion_tokens":1500}}\n\ndata: [DONE]\n\n'));
  r.x = 1e6;
  summary(r);
  const L = r.e.llm!;
  assert.equal(L.token_ms!.length, MAX_TOKENS);
  assert.equal(L.tokens, n);
  assert.equal(L.tokens_source, "usage");
  const h = L.gap_hist!;
  assert.equal(h.length, 56);
  assert.equal(
    h.reduce((a, b) => a + b, 0),
    n - MAX_TOKENS,
    "each gap after the exact times: once",
  );
  // 20 ms = 20,000 µs → bucket ⌊2·log2(20000)⌋ = 28; the 320 ms stall → 36
  assert.equal(h[28], n - MAX_TOKENS - 1);
  assert.equal(h[36], 1);
});

test("endings: complete whatever the connection did after, client_aborted, server_cut, absent", () => {
  const done = [chat(""), chat("a", ',"finish_reason":"stop"'), "data: [DONE]\n\n"];
  const end = (pieces: string[], f: (r: Rec) => void) => {
    const r = rec(1);
    pieces.forEach((p, i) => bytes(r, i + 1, enc.encode(p)));
    f(r);
    summary(r);
    return r.e.llm?.end;
  };
  assert.equal(end(done, (r) => ((r.x = 9), (r.e.error = "abort"))), "complete", "the SDK cancels after [DONE]");
  assert.equal(end(done.slice(0, 1).concat(chat("a")), (r) => ((r.x = 9), (r.e.error = "abort"))), "client_aborted");
  assert.equal(end([chat(""), chat("a")], (r) => (r.c = true)), "client_aborted", "EventSource close() / the page left");
  assert.equal(end([chat(""), chat("a")], (r) => ((r.x = 9), (r.e.error = "network"))), "server_cut");
  assert.equal(end([chat(""), chat("a")], () => {}), undefined, "still open: not known");
});

test("EventSource messages: the browser frames them, the same rules read them", () => {
  const r = rec(0);
  event(r, 1, JSON.stringify({ choices: [{ delta: { role: "assistant" } }] }));
  event(r, 2, JSON.stringify({ choices: [{ delta: { reasoning: "hm" } }] }));
  event(r, 3, JSON.stringify({ choices: [{ delta: { content: "x" } }] }));
  event(r, 4, "[DONE]");
  r.c = true; // the page closed it after [DONE]
  summary(r);
  const L = r.e.llm!;
  assert.deepEqual([L.first_output_ms, L.first_token_ms, L.tokens, L.end], [2, 3, 2, "complete"]);
  // a message over the bound is not read, whatever the browser delivered
  event(r, 5, JSON.stringify({ choices: [{ delta: { content: "y".repeat(MAX_EVENT) } }] }));
  assert.equal(L.bad_events, 1);
  assert.equal(L.token_ms!.length, 2);
});
