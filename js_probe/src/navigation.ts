// The page load itself: the server that rendered the page says which trace it was with
// `Server-Timing: traceparent;desc="00-…"` (read from the navigation entry) or
// `<meta name="traceparent" content="00-…">`. The entry reports that trace and span id.
import { begin, emit } from "./core";
import { parseTraceparent } from "./traceContext";

export function navigation(record: boolean): void {
  const n = performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming | undefined;
  const tc =
    n &&
    record &&
    (parseTraceparent(n.serverTiming?.find((s) => s.name == "traceparent")?.description) ||
      parseTraceparent(document.querySelector<HTMLMetaElement>('meta[name="traceparent"]')?.content));
  if (tc) {
    const r = begin("navigation", new URL(location.href), tc, "GET");
    r.e.start_ms = 0; // the navigation entry's startTime
    r.t = n;
    emit(r);
  }
}
