// Parallax browser probe: `Parallax.init({...})` once, from a <script> tag or a bundler.
import { cfg, hide, markRendered as mark, mutated, onResource } from "./core";
import { hookEventSource, hookFetch, hookWebSocket, hookXhr, type Policy } from "./instrument";
import { navigation } from "./navigation";
import { session } from "./session";
import { generateTraceContext, parseTraceparent } from "./traceContext";
import { transport as makeTransport, type Transport } from "./transport";

export { parseTraceparent, formatTraceparent, generateTraceContext } from "./traceContext";
export const version = "0.1.0";

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
}

type W = typeof globalThis & Record<string, unknown>;
const MARK = "__parallax";
let transport: Transport | undefined;

/** Start the probe. Idempotent; a no-op where the browser lacks what it needs; never throws. */
export function init(o: Options): void {
  try {
    const w = globalThis as W;
    const doc = w.document;
    // What every browser since 2018 has; elsewhere (old browsers, server-side rendering,
    // workers) the probe stays out of the way.
    if (w[MARK] || !o || !o.endpoint || !doc || !performance.timeOrigin || !w.crypto || !w.Proxy) return;
    w[MARK] = 1;
    const rate = Math.min(1, Math.max(0, o.sampleRate ?? 1));
    const idle = o.sessionIdleMs ?? 1800000;
    const href = (): string => location.href;
    const sess = () => session(rate, idle);
    const to = o.propagateTo || [];
    const policy: Policy = {
      ctx(existing) {
        const s = sess();
        const had = parseTraceparent(existing);
        return { tc: had || generateTraceContext(s.sampled), record: s.sampled };
      },
      allowed(u) {
        const origin = u.protocol.replace(/^ws/, "http") + "//" + u.host;
        // A string is an origin or a URL prefix, matched at a "/" boundary so that
        // https://api.example.com never matches https://api.example.com.evil.net.
        const path = origin + u.pathname + "/";
        return (
          origin === location.origin ||
          to.some((p) => (typeof p === "string" ? path.startsWith(p.replace(/\/?$/, "/")) : p.test(u.href)))
        );
      },
    };
    const ep = new URL(o.endpoint, href());
    const origFetch = typeof w.fetch === "function" ? (w.fetch as typeof fetch).bind(w) : undefined;
    const nav = w.navigator as Navigator | undefined;
    const sb = nav && typeof nav.sendBeacon === "function" ? nav.sendBeacon.bind(nav) : undefined;
    const t = (transport = makeTransport({
      endpoint: ep.href,
      site: String(o.site).replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 64) || "_",
      page: () => location.pathname.slice(0, 2048),
      maxBatch: Math.min(500, Math.max(1, o.maxBatch ?? 50)),
      maxQueue: Math.max(1, o.maxQueue ?? 500),
      flushIntervalMs: Math.max(100, o.flushIntervalMs ?? 5000),
      session: () => sess().id,
      fetch: origFetch,
      sendBeacon: sb,
    }));
    cfg.sink = (e) => t.push(e);

    // Never trace the probe's own beacons (they go through the saved original fetch anyway).
    const allowed = policy.allowed;
    policy.allowed = (u) => u.origin + u.pathname !== ep.origin + ep.pathname && allowed(u);
    hookFetch(w, policy, href);
    hookXhr(w, policy, href);
    hookEventSource(w, policy, href);
    hookWebSocket(w, policy, href);

    const guard =
      <A extends unknown[]>(f: (...a: A) => void) =>
      (...a: A): void => {
        try {
          f(...a);
        } catch {
          // never into the page
        }
      };
    if (typeof PerformanceObserver === "function")
      try {
        new PerformanceObserver(guard(onResource)).observe({ type: "resource" });
      } catch {
        // no Resource Timing: every entry is coarse
      }
    const rt = o.renderTarget;
    if (rt && typeof MutationObserver === "function" && typeof requestAnimationFrame === "function") {
      cfg.render = true;
      const inside = (n: Node): boolean => {
        const el = n.nodeType === 1 ? (n as Element) : n.parentElement;
        return !!el && (typeof rt === "string" ? !!el.closest(rt) : rt.contains(el));
      };
      new MutationObserver(
        guard((ms: MutationRecord[]) => {
          if (ms.some((m) => inside(m.target))) mutated();
        }),
      ).observe(typeof rt === "string" ? doc : rt, { childList: true, subtree: true, characterData: true });
    }
    doc.addEventListener(
      "visibilitychange",
      guard(() => {
        if (doc.visibilityState === "hidden") {
          hide(false);
          t.flush(true);
        }
      }),
    );
    w.addEventListener(
      "pagehide",
      guard(() => {
        hide(true);
        t.flush(true);
      }),
    );
    const navNow = guard(() => navigation(sess().sampled));
    if (doc.readyState === "complete") setTimeout(navNow);
    else w.addEventListener("load", () => setTimeout(navNow));
  } catch {
    // a probe that cannot start must not break the page
  }
}

/** The app tells the probe it has shown the first chunk of the request with this trace id —
 *  or, without an id, of every request whose first chunk has arrived and is not yet painted
 *  (for pages where renderTarget cannot say where answers appear). */
export function markRendered(traceId?: string): void {
  try {
    mark(traceId);
  } catch {
    // never into the page
  }
}

/** Send what is queued now (e.g. before a single-page app navigates away). */
export function flush(): void {
  try {
    transport?.flush();
  } catch {
    // never into the page
  }
}

