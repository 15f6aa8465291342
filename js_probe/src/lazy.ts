// The token reader (src/llm.ts) is a module of its own — dist/parallax-llm.min.js, next to
// parallax.min.js and parallax.esm.js, which import() it — loaded when the page's first LLM
// candidate stream arrives, once per page. Until it is there a candidate stream's chunks are
// held (bounded) with their arrival times and replayed into it: a token's time is when the
// app's read of it returned, never when the reader caught up. A stream it never reads keeps
// its chunk times and says why (Entry.reason). Nothing here throws into the page.
import { cfg, type Rec } from "./core";

/** What the reader module exports (src/llm.ts). */
export interface Reader {
  open(r: Rec, q: unknown[]): void; // q: the framing, then time, chunk, time, chunk, … held
  read(r: Rec, t: number, v: Uint8Array | string): void;
  summary(r: Rec): void;
}

/** Bytes held at once while the reader loads, every stream's chunks together (an
 *  EventSource's messages: their characters); the stream whose chunk passes it is let go and
 *  not read (reason llm_overflow). */
export const MAX_HELD = 131072;
let R: Reader | 0 | null | undefined; // the reader; 0: it cannot load; null: asked for
let bytes = 0; // held now
/** How to get the reader (init sets cfg.load: from(), or the ESM build's import()). It hands
 *  `done` the reader — or anything else (an error, nothing): then there is none. */
export type Load = (done: (x?: unknown) => void) => void;

/** The framing a content type announces — what makes a fetch response an LLM candidate:
 *  1 SSE, 2 NDJSON, 0 none (bytes: no reader). The one place of this rule. */
export const framing = (ct: string | null): number =>
  /event-stream/i.test(ct!) ? 1 : /ndjson|jsonl/i.test(ct!) ? 2 : 0;

/** A held stream that will not be read: what it held is let go, and the entry says why. */
const drop = (r: Rec, why: string): void => {
  for (const x of r.q as { length?: number }[]) bytes -= x.length || 0;
  r.q = 0;
  r.e.reason = why;
};

/** Once the loader has answered, a held stream is handed to the reader — what was held
 *  replayed at the times it arrived — or marked unread. (The reader throws nothing.) */
export const settle = (r: Rec): void => {
  const q = r.q;
  if (q && R != null) R ? ((r.q = 0), R.open(r, q)) : drop(r, "llm_unread");
};

/** A response that may be an LLM stream: framing `f` (0: an EventSource's messages). */
export function llm(r: Rec, f: number): void {
  // Asked for once per page; a loader that fails or brings no reader: R = 0. (Neither
  // loader throws: a throw here would leave the streams held until they are sent, unread.)
  if (R === undefined) (R = null), cfg.load!((x) => (R = (x as Reader | undefined)?.read ? (x as Reader) : 0));
  r.q = [f];
  settle(r);
}

/** A chunk (bytes) or an EventSource message (text) the app read at `t`. */
export function feed(r: Rec, t: number, v: Uint8Array | string): void {
  settle(r);
  if (r.q) r.q.push(t, v), (bytes += v.length) > MAX_HELD && drop(r, "llm_overflow");
  else if (r.k) (R as Reader).read(r, t, v);
}

/** The entry is being sent: the reader's summary, or why it has no `llm`. A stream still held
 *  has waited as long as any entry waits (core.ts WAIT_MS). */
export function fin(r: Rec): void {
  settle(r);
  if (r.q) drop(r, "llm_unread"); // the reader has not come (yet)
  else if (r.k) (R as Reader).summary(r);
}

/** A loader of the reader module at `u` — `import(u)`: in the <script> build a relative `u`
 *  resolves against that script's own URL, so "./parallax-llm.min.js" is the file next to it.
 *  A 404, a CSP refusal, a network error, a module that is not the reader: no reader. (The
 *  comments keep the consumer's bundler from chasing a URL known only at run time.) */
export const from =
  (u: string): Load =>
  (done) =>
    void import(/* webpackIgnore: true */ /* @vite-ignore */ u).then(done, done);

/** Forget the reader (tests: each starts a page afresh). */
export const resetLazy = (): void => void ((R = undefined), (bytes = 0));
