// One record per traced request: its beacon entry (docs/contracts/beacon.v2.schema.json)
// and what the probe waits for before sending it — the stream's end, the Resource Timing
// entry (which only exists once a stream has ended, and never for WebSocket), and the paint.
import { now, r1 } from "./clock";
import { fin, settle, type Load } from "./lazy";
import type { Llm, LlmEntry } from "./llm";
import type { TraceContext } from "./traceContext";

export type Kind = "fetch" | "xhr" | "eventsource" | "websocket" | "navigation";
export interface ServerTiming {
  name: string;
  dur_ms?: number;
  desc?: string;
}
export interface Entry {
  trace_id: string;
  span_id: string;
  sampled?: boolean;
  kind: Kind;
  seq?: number;
  method?: string;
  url?: string;
  status?: number;
  start_ms: number;
  request_start_ms?: number;
  response_start_ms?: number;
  response_end_ms?: number;
  dns_ms?: number;
  connect_ms?: number;
  tls_ms?: number;
  first_chunk_ms?: number;
  chunk_ms?: number[];
  chunks?: number;
  rendered_ms?: number;
  coarse?: boolean;
  chunks_coarse?: boolean;
  transfer_size?: number;
  protocol?: string;
  server_timing?: ServerTiming[];
  error?: string;
  hidden?: boolean;
  llm?: LlmEntry; // an LLM stream in a known dialect (src/llm.ts; beacon v2)
  reason?: string; // why an LLM candidate stream has no llm (src/lazy.ts)
}

export interface Rec {
  e: Entry;
  n?: string | undefined; // the URL Resource Timing will name; absent: no entry will come (WebSocket)
  t?: PerformanceResourceTiming; // the matched Resource Timing entry
  h?: number; // when the probe saw the response headers
  x?: number; // when the probe saw the end (or failure)
  b?: boolean; // the app reads the body through the probe's pass-through stream
  l?: number; // last chunk time
  w?: boolean; // waiting for the paint after the first chunk (an LLM stream's: answer token)
  m?: number | undefined; // the last chunk time before a mutation of renderTarget seen while held
  y?: number; // an LLM stream's first answer token time; -1: its answer has not begun (llm.ts)
  d?: boolean; // sent
  k?: Llm; // an event stream's token state (the reader's)
  q?: unknown[] | 0; // held for the reader: its framing, then time, chunk, time, chunk, …
  c?: boolean; // the page ended it (EventSource close(), the page left)
}

type Num<T> = { [K in keyof T]-?: T[K] extends number | undefined ? K : never }[keyof T];
type RT = Num<PerformanceResourceTiming>;
/** [entry field, Resource Timing time, its start when the field is a duration], each only
 *  when not 0: cross-origin without Timing-Allow-Origin only responseEnd is, and a reused
 *  connection has no phases. */
const TIMES: [Num<Entry>, RT, RT?][] = [
  ["request_start_ms", "requestStart"],
  ["response_start_ms", "responseStart"],
  ["response_end_ms", "responseEnd"],
  ["dns_ms", "domainLookupEnd", "domainLookupStart"],
  ["connect_ms", "connectEnd", "connectStart"],
  ["tls_ms", "connectEnd", "secureConnectionStart"],
];

export const MAX_CHUNKS = 256;
/** How long a finished request waits for its Resource Timing entry and its paint. */
export const WAIT_MS = 1500;
const MAX_LIVE = 200;

export const live = new Set<Rec>();
const awaiting: Rec[] = [];
export const cfg: { render: boolean; sink: (e: Entry) => void; load?: Load | undefined } = {
  render: false,
  sink: () => {},
};

export const isHidden = (): boolean => globalThis.document?.visibilityState == "hidden";
/** URL without query string or fragment (privacy: queries carry prompts and tokens). */
export const bare = (u: URL): string => (u.origin + u.pathname).slice(0, 2048);

/** The beacon fields of a trace context. */
export const ids = (tc: TraceContext): Pick<Entry, "trace_id" | "span_id" | "sampled"> => ({
  trace_id: tc.traceId,
  span_id: tc.spanId,
  sampled: (tc.flags & 1) == 1,
});

/** A new record. Resource Timing will name it by its URL without the fragment — except a
 *  WebSocket, which has no Resource Timing entry. */
export function begin(kind: Kind, url: URL, tc: TraceContext, method?: string): Rec {
  const e: Entry = { ...ids(tc), kind, url: bare(url), start_ms: now() };
  // The contract's method pattern is ^[A-Z]{1,16}$: one odd value must not void a beacon.
  if (method) e.method = method.toUpperCase().replace(/[^A-Z]/g, "").slice(0, 16) || "GET";
  if (isHidden()) e.hidden = true;
  const r: Rec = { e };
  if (kind != "websocket") r.n = url.href.split("#")[0];
  live.add(r);
  // A page that opens requests and never reads them must not grow the probe without bound.
  if (live.size > MAX_LIVE) emit([...live][0]!);
  return r;
}

/** A body chunk or message arrived. */
export function chunk(r: Rec, t = now()): void {
  const e = r.e;
  if (r.d) return;
  e.chunks = (e.chunks || 0) + 1;
  r.l = t;
  if (!e.chunk_ms) {
    e.chunk_ms = [];
    e.first_chunk_ms = t;
    if (cfg.render && !e.hidden && !isHidden()) {
      r.w = true;
      awaiting.push(r);
    }
  }
  if (e.chunk_ms.length < MAX_CHUNKS) e.chunk_ms.push(t);
}

/** Response headers seen (coarse t3 when Resource Timing cannot say better). */
export function headers(r: Rec, status?: number): void {
  r.h ||= now();
  if (status! >= 0) r.e.status = status!;
}

export function end(r: Rec, error?: string, t = now()): void {
  if (r.x || r.d) return;
  r.x = t;
  if (error) r.e.error = error;
  if (!check(r)) setTimeout(() => emit(r), WAIT_MS);
}

export function check(r: Rec): boolean | undefined {
  if (r.x && (r.t || !r.n) && !r.w && !r.q) emit(r);
  return r.d;
}

export function emit(r: Rec): void {
  if (r.d) return;
  fin(r); // (before r.d: the reader reads nothing into an entry sent)
  r.d = true;
  r.w = false;
  live.delete(r);
  const e = r.e;
  const t = r.t;
  if (!(t?.requestStart! > 0)) {
    // Cross-origin without Timing-Allow-Origin (requestStart is 0), or no entry at all.
    e.coarse = true;
    e.request_start_ms = e.start_ms;
    if (r.h) e.response_start_ms = r.h;
  }
  if (t) {
    for (const [k, b, a] of TIMES) {
      const s = a ? t[a] : 0;
      if (t[a || b] > 0 && t[b] > s) e[k] = r1(t[b] - s);
    }
    if (t.transferSize) e.transfer_size = t.transferSize;
    if (t.nextHopProtocol) e.protocol = t.nextHopProtocol.slice(0, 16);
    const st = (t.serverTiming || []).slice(0, 16).map((s) => {
      const o: ServerTiming = { name: s.name.slice(0, 64) };
      if (s.duration > 0) o.dur_ms = s.duration;
      if (s.description) o.desc = s.description.slice(0, 256);
      return o;
    });
    if (st.length) e.server_timing = st;
    const status = (t as { responseStatus?: number }).responseStatus;
    if (status) e.status ??= status;
  }
  if (!e.response_end_ms && r.x && !e.error) e.response_end_ms = r.x;
  try {
    cfg.sink(e);
  } catch {
    // never into the page
  }
}

/** PerformanceObserver callback: match each Resource Timing entry to its record — by URL,
 *  then, with several requests to one URL in flight, the latest one started before it. */
export function onResource(list: PerformanceObserverEntryList): void {
  for (const t of list.getEntries() as PerformanceResourceTiming[]) {
    const n = t.name.split("#")[0];
    let best: Rec | undefined;
    for (const r of live)
      if (r.n === n && !r.t && r.e.start_ms <= t.startTime + 2 && (!best || r.e.start_ms > best.e.start_ms))
        best = r;
    if (!best) continue;
    best.t = t;
    // The network has the whole response; if the app is not streaming it, it is done.
    if (!best.b) end(best);
    else check(best);
  }
}

/** Visible TTFT: the frame after the one that painted — two animation frames later. */
export function paint(rs: Rec[]): void {
  if (!rs.length) return;
  requestAnimationFrame(() =>
    requestAnimationFrame(() => {
      const t = now();
      for (const r of rs) {
        // rAF stops in hidden pages; a frame that comes after a hide is not the paint.
        if (!isHidden() && !r.e.hidden && !r.d && !r.e.rendered_ms) r.e.rendered_ms = t;
        r.w = false;
        check(r);
      }
    }),
  );
}

/** A DOM mutation inside renderTarget: whatever first chunk came before it is being shown —
 *  on an LLM stream, the first answer token: a role-only delta, reasoning or a spinner shown
 *  before it is not its paint. A stream held for the token reader cannot tell yet: it waits,
 *  and its paint is not known (no render sample) if a mutation it skipped so came after its
 *  first answer token — or after its first chunk, if it is no LLM stream after all. */
export function mutated(): void {
  paint(
    awaiting.splice(0).filter((r) => {
      settle(r);
      // (a mutation after a chunk read at t has r.l >= t: the first answer token's chunk
      // was read before a mutation held back iff its time is at most that mutation's r.m)
      if (r.q || r.y! < 0) r.q && (r.m = r.l), r.d || awaiting.push(r);
      else return !r.m || r.y! > r.m;
    }),
  );
}

export function markRendered(traceId?: string): void {
  cfg.render = true; // from now on, wait for the paint before sending
  const rs: Rec[] = [];
  // (these wait for it too: the first stream the app marks started before cfg.render, and
  // its end could otherwise send it before the paint came)
  for (const r of live)
    if ((traceId ? r.e.trace_id == traceId : r.e.chunk_ms) && !r.e.rendered_ms) rs.push(r), (r.w = !isHidden());
  paint(rs);
}

/** The page is being hidden: no render samples; send what is finished. On pagehide
 *  (`all`), also what is still open — a stream the user abandons is still a measurement; a
 *  WebSocket exchange ends with its last message. */
export function hide(all: boolean): void {
  awaiting.length = 0;
  for (const r of live) {
    // `hidden` says why a request has no render sample; one painted before stays valid.
    if ((!r.x || r.w) && !r.e.rendered_ms) r.e.hidden = true;
    r.w = false;
    if (all && r.e.seq && r.l) end(r, "", r.l);
    r.c ||= all && !r.x; // a stream still open when the page leaves: the user left it
    if (all || r.x) emit(r);
  }
}
