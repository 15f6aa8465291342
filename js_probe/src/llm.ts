// LLM streams: tokens, not chunks. The agent's rules (agent/protocols/streams) applied in the
// page to what the app reads — a fetch body through the probe's pass-through stream, or an
// EventSource's messages — so both sides of a request name the same event its first token.
// The dialect comes from the content type (the framing) and the first events, never from the
// URL; a stream in no dialect gets no `llm` object. Nothing of the text is kept.
//
// A module of its own (dist/parallax-llm.min.js), imported by the core when a page's first
// LLM candidate stream arrives (src/lazy.ts). Its exports open, read and summary are that
// interface (lazy.ts's Reader); it reads the core's Rec by its field names.
import type { Rec } from "./core";

/** Token times kept exactly (as many as the agent exports); later gaps go to gap_hist. */
export const MAX_TOKENS = 1024;
/** An event longer than this is not read (the agent's bound): counted in bad_events. */
export const MAX_EVENT = 65536;

/** What a beacon entry says of an LLM stream (beacon v2, parallax_contracts/beacon.py). */
export interface LlmEntry {
  dialect: string;
  first_token_ms?: number;
  first_output_ms?: number;
  token_ms?: number[];
  gap_hist?: number[];
  tokens?: number;
  tokens_source?: string;
  end?: string | undefined;
  bad_events?: number;
}

/** One stream's state (Rec.k). */
export interface Llm {
  f: number; // framing: 0 messages framed by the browser (EventSource), 1 SSE, 2 NDJSON
  b: string; // text not yet cut into lines
  u?: TextDecoder;
  D?: string | undefined; // SSE: the data lines of the event in progress
  o?: unknown; // the event in progress outgrew MAX_EVENT: dropped
  n: number; // events seen
  d?: number; // the dialect: 1 anthropic.messages, 2 openai.responses, 3 openai.chat, 4 ollama
  c: number; // output token events (answer and reasoning)
  l?: number; // the last one's time
  F?: unknown; // the dialect's final event was seen
  E?: unknown; // an error event was seen
  O?: number; // output tokens as the stream's usage states them
  e?: LlmEntry; // the entry's llm object, from the dialect on
}

/** A stream begins: `q` is its framing, then what the core held for it until this module
 *  came — time, chunk, time, chunk, … — read now at the times it arrived (src/lazy.ts). */
export const open = (r: Rec, q: unknown[]): void => {
  r.k = { f: q[0] as number, b: "", n: 0, c: 0 };
  for (let i = 1; i < q.length; i += 2) read(r, q[i] as number, q[i + 1] as Uint8Array | string);
};

const bad = (s: Llm): void => void (s.e && (s.e.bad_events = (s.e.bad_events || 0) + 1));

/** A chunk of a fetch body arrived at `t`: its complete lines, in order. SSE: an event is its
 *  `data:` lines (joined by \n) up to a blank line (comments are heartbeats). NDJSON: one
 *  event per non-empty line. A final "\r" waits: it may be half of "\r\n". */
export function bytes(r: Rec, t: number, v: Uint8Array): void {
  const s = r.k!;
  const lines = (s.b + (s.u ||= new TextDecoder()).decode(v, { stream: true })).split(/\r\n|\r(?!$)|\n/);
  s.b = lines.pop()!;
  for (const x of lines)
    if (s.f > 1 ? x.trim() : !x) {
      const data = s.f > 1 ? x : s.D;
      if (s.o) (s.o = 0), bad(s);
      else if (data != null) event(r, t, data);
      s.D = undefined;
    } else if (/^data:/.test(x)) s.D = (s.D != null ? s.D + "\n" : "") + x.replace(/^data: ?/, "");
  // Bounded: the event in progress is dropped past MAX_EVENT (and counted at its end).
  if (s.b.length + (s.D || "").length > MAX_EVENT) (s.o = 1), (s.b = ""), (s.D = undefined);
}

/** One event (an SSE event's data, an NDJSON line) complete at `t`. The rules read `v`: the
 *  event's type, then its JSON text, keys at any depth ("x": a non-empty string). */
export function event(r: Rec, t: number, data: string): void {
  const s = r.k!;
  // An event over the bound is not read (an EventSource's too: the browser has no bound).
  if (data.length > MAX_EVENT) return bad(s);
  let o: { type?: unknown } | undefined;
  try {
    o = JSON.parse(data);
  } catch {
    // not JSON: garbage once the dialect is known (or a Chat Completions stream's end)
  }
  const v = o?.type + data; // "undefined…" when there is no type
  // Recognised from the first 4 events (heartbeats are not events), or never.
  const d = (s.d ||=
    ++s.n > 4
      ? 0
      : s.f > 1
        ? +/^undefined{(?=.*"done")(?=.*"model")|^undefined{.*"error"/.test(v) && 4
        : /^(message_start|ping|content_block_delta){/.test(v)
          ? 1
          : /^response\./.test(v)
            ? 2
            : +/^undefined{[^]*"choices"/.test(v) && 3);
  if (!d || r.d) return;
  // (r.y: the core's paint waits for the answer, core.ts mutated())
  const L = (s.e ||= ((r.y = -1),
  (r.e.llm = { dialect: ["anthropic.messages", "openai.responses", "openai.chat", "ollama"][d - 1]! })));
  if (v == "undefined[DONE]" && d == 3) return void (s.F = 1);
  if (!o || typeof o != "object") return bad(s);
  // Usage as the stream states it: the last statement wins (Anthropic's count runs; its
  // message_start holds a placeholder).
  const n = /^(?!message_start).*"(completion_tokens|output_tokens|eval_count)":\s*(\d{1,9})\b/.exec(v);
  if (n) s.O = +n[2]!;
  // An error event inside the stream (its type, an error object, an error line).
  s.E ||= /^(error|response\.failed){|"error":\s*[^n\s]/.test(v);
  s.F ||= /^(message_stop|response\.(completed|incomplete)){|"finish_reason":\s*"|"done":\s*true/.test(v);
  // An output token: an answer token (text, a tool call: 1) or reasoning (2). OpenAI
  // Responses says which by the event's type.
  const k =
    d == 2
      ? /^response\.(output_text|refusal|function_call_arguments|custom_tool_call_input)\.delta.*"delta":\s*"[^"]/.test(v) ||
        (/^response\.reasoning\S*\.delta{.*"delta":\s*"[^"]/.test(v) && 2)
      : // (an Anthropic tool call's first output is its content_block_start)
        /"(content|text|partial_json|response|refusal)":\s*"[^"]|"(tool_calls|function_call)":\s*[[{]|^content_block_start{.*"(server_)?tool_use"/.test(v) ||
        (/"(reasoning(_content)?|thinking)":\s*"[^"]/.test(data) && 2);
  if (!k) return;
  const i = s.c++; // this token's index: the gap before it is gap i
  if (k != 2 && !L.first_token_ms) L.first_token_ms = r.y = t;
  if (!i) L.first_output_ms = t;
  // Past the exact times, each gap into the agent's histogram buckets (µs, 2 per octave).
  else if (i >= MAX_TOKENS) {
    const h = (L.gap_hist ||= Array(56).fill(0));
    const b = Math.min(55, (2 * Math.log2((t - s.l!) * 1e3)) | 0);
    h[b] = h[b]! + 1;
  }
  s.l = t;
  if (i < MAX_TOKENS) (L.token_ms ||= []).push(t);
}

/** A fetch body's chunk (bytes) or an EventSource's message (text), read by the app at `t`. */
export const read = (r: Rec, t: number, v: Uint8Array | string): void => {
  try {
    typeof v == "string" ? event(r, t, v) : bytes(r, t, v);
  } catch {
    // never into the page (a value that is no bytes: no tokens)
  }
};

/** When the entry is sent: the token count and its source, the ending. */
export function summary(r: Rec): void {
  const s = r.k;
  const L = s?.e;
  if (L) {
    L.tokens = s!.O ?? s!.c;
    L.tokens_source = s!.O == null ? "events" : "usage";
    L.end = s!.E
      ? "error"
      : s!.F
        ? "complete" // whatever the connection did after (the openai SDK cancels after [DONE])
        : r.e.error == "abort" || r.c
          ? "client_aborted"
          : r.x
            ? "server_cut"
            : undefined;
  }
}
