// Parallax browser probe: `Parallax.init({...})` once, from a <script> tag or a bundler.
// Its two entries (global.ts: the <script> build; index.ts: the ESM build) differ only in how
// they fetch the token reader (src/lazy.ts).
import { cfg, hide, isHidden, markRendered as mark, mutated, onResource } from "./core";
import { hook, type Trace } from "./instrument";
import { from, type Load } from "./lazy";
import { navigation } from "./navigation";
import { session } from "./session";
import { generateTraceContext, parseTraceparent } from "./traceContext";
import { transport as makeTransport, type Transport } from "./transport";

export { VERSION as version } from "./transport";

export interface Options {
  /** Beacon URL, e.g. https://collector.example.com/v1/beacons. */
  endpoint: string;
  /** Site key (letters, digits, . _ -). */
  site: string;
  /** Fraction of sessions traced, 0..1 (default 1). Drives the traceparent sampled flag. */
  sampleRate?: number;
  /** Other origins (or URL prefixes, or RegExps on the URL) that may receive traceparent. */
  propagateTo?: (string | RegExp)[];
  /** Element (or selector) where streamed answers appear: its next mutation after a first
   *  chunk marks the paint (visible TTFT). */
  renderTarget?: string | Element;
  /** Beacon batching interval (default 5000 ms). */
  flushIntervalMs?: number;
  /** Entries per beacon (default 50, at most 500). */
  maxBatch?: number;
  /** Queue bound; the oldest entries are dropped beyond it (default 500). */
  maxQueue?: number;
  /** A session without requests for this long starts a new one (default 30 min). */
  sessionIdleMs?: number;
  /** URL of the token reader module, parallax-llm.min.js: absolute, or a path from "/"
   *  (default: the file next to parallax.min.js; the ESM build imports its own). Loaded once,
   *  when the page's first LLM candidate stream arrives. */
  llmReader?: string;
}

type W = typeof globalThis & Record<string, unknown>;
const MARK = "__parallax";
let transport: Transport | undefined;

/** `f`, except that it never throws (into the page). */
const guard =
  <A extends unknown[]>(f: (...a: A) => void) =>
  (...a: A): void => {
    try {
      f(...a);
    } catch {
      // never into the page
    }
  };

/** Start the probe; `load` gets the token reader (default: import() of `o.llmReader`, else of
 *  the file next to this script). Idempotent; a no-op where the browser lacks what it needs;
 *  never throws. */
export const start = guard((o: Options, load?: Load): void => {
  const w = globalThis as W;
  const doc = w.document;
  // What every browser since 2018 has; elsewhere (old browsers, server-side rendering,
  // workers) the probe stays out of the way.
  if (w[MARK] || !o?.endpoint || !doc || !performance.timeOrigin || !w.crypto || !w.Proxy) return;
  w[MARK] = 1;
  cfg.load = load || from(o.llmReader || "./parallax-llm.min.js");
  const rate = o.sampleRate ?? 1; // below 0 is 0, above 1 is 1: Math.random() < rate
  const idle = o.sessionIdleMs ?? 1800000;
  const sess = () => session(rate, idle);
  const to = o.propagateTo || [];
  const ep = new URL(o.endpoint, location.href);
  const epPath = ep.origin + ep.pathname;
  const trace: Trace = (u, tp, fixed) => {
    const had = parseTraceparent(tp);
    const origin = u.protocol.replace(/^ws/, "http") + "//" + u.host;
    // A string is an origin or a URL prefix, matched at a "/" boundary so that
    // https://api.example.com never matches https://api.example.com.evil.net.
    const path = origin + u.pathname + "/";
    if (
      had ||
      (!fixed &&
        u.origin + u.pathname != epPath && // never the probe's own beacons
        (origin == location.origin ||
          to.some((p) => (typeof p == "string" ? path.startsWith(p.replace(/\/?$/, "/")) : p.test(u.href)))))
    ) {
      const s = sess();
      return [had || generateTraceContext(s.sampled), s.sampled, !!had];
    }
  };
  const site = String(o.site).replace(/[^\w.-]/g, "_").slice(0, 64) || "_";
  const nav = w.navigator;
  const t = (transport = makeTransport({
    to: ep.href,
    head: () => ({
      site,
      session: sess().id,
      page: location.pathname.slice(0, 2048),
    }),
    batch: Math.min(500, Math.max(1, o.maxBatch ?? 50)),
    bound: Math.max(1, o.maxQueue ?? 500),
    interval: Math.max(100, o.flushIntervalMs ?? 5000),
    post: w.fetch?.bind(w),
    beacon: nav.sendBeacon?.bind(nav),
  }));
  cfg.sink = (e) => t.push(e);
  hook(w, trace, () => location.href);

  try {
    new PerformanceObserver(guard(onResource)).observe({ type: "resource" });
  } catch {
    // no Resource Timing: every entry is coarse
  }
  const rt = o.renderTarget;
  if (rt)
    try {
      // An element: every mutation it reports is inside. A selector: the nearest element of
      // each mutation, matched (the element may come and go).
      const sel = typeof rt == "string";
      new MutationObserver(
        guard((ms: MutationRecord[]) => {
          if (!sel || ms.some(({ target: n }) => (n.nodeType == 1 ? (n as Element) : n.parentElement)?.closest(rt)))
            mutated();
        }),
      ).observe(sel ? doc : rt, { childList: true, subtree: true, characterData: true });
      cfg.render = !!requestAnimationFrame;
    } catch {
      // no paint timing
    }
  const bye = (all: boolean) =>
    guard(() => {
      if (all || isHidden()) {
        hide(all);
        t.flush(true);
      }
    });
  doc.addEventListener("visibilitychange", bye(false));
  w.addEventListener("pagehide", bye(true));
  const navNow = guard(() => navigation(sess().sampled));
  if (doc.readyState == "complete") setTimeout(navNow);
  else w.addEventListener("load", () => setTimeout(navNow));
});

/** The app tells the probe it has shown the first chunk of the request with this trace id —
 *  or, without an id, of every request whose first chunk has arrived and is not yet painted
 *  (for pages where renderTarget cannot say where answers appear). */
export const markRendered: (traceId?: string) => void = guard(mark);

/** Send what is queued now (e.g. before a single-page app navigates away). */
export const flush = guard((): void => transport?.flush());
