// The page load itself: the server that rendered the page says which trace it was with
// `Server-Timing: traceparent;desc="00-…"` (read from the navigation entry) or
// `<meta name="traceparent" content="00-…">`. The entry reports that trace and span id.
import { r1 } from "./clock";
import { begin, emit } from "./core";
import { parseTraceparent } from "./traceContext";

export function navigation(record: boolean): void {
  const n = performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming | undefined;
  if (!n || !record) return;
  const st = (n.serverTiming || []).find((s) => s.name === "traceparent");
  const meta = document.querySelector('meta[name="traceparent"]');
  const tc = parseTraceparent(st?.description) || parseTraceparent(meta?.getAttribute("content"));
  if (!tc) return;
  const r = begin("navigation", new URL(location.href), tc, "GET", n.name);
  r.e.start_ms = r1(n.startTime);
  r.t = n;
  r.x = n.responseEnd;
  emit(r);
}
