// Batching and delivery of beacons (docs/contracts/beacon.v2.schema.json).
//
// The keepalive/sendBeacon quota is 64 KB in flight per page and shared with the app, so the
// probe keeps at most LIMIT bytes of its own in flight. While the page is visible it posts
// with fetch(keepalive): it can then see 429/503 and back off, and it knows when bytes leave
// the quota. When the page is being hidden (perhaps for good) it uses sendBeacon, checking
// its return value (false = quota full), then fetch(keepalive). Both send text/plain: a CORS
// simple request, no preflight.
import { drift, now } from "./clock";
import type { Entry } from "./core";

export const LIMIT = 32 * 1024;
export const VERSION = "0.1.0";

export interface TransportOptions {
  to: string; // the collector's beacon URL
  head: () => { site: string; session: string; page: string }; // when the beacon is sent
  batch: number; // entries per beacon (schema: ≤ 500)
  bound: number; // queue bound: the oldest entries are dropped beyond it
  interval: number; // the longest an entry waits, ms
  post?: ((url: string, init: RequestInit) => Promise<Response>) | undefined; // fetch
  beacon?: ((url: string, body: string) => boolean) | undefined; // navigator.sendBeacon
}

export interface Transport {
  push(e: Entry): void;
  /** Send what is queued within the in-flight budget; `hiding`: the page may be going away. */
  flush(hiding?: boolean): void;
}

export function transport(o: TransportOptions): Transport {
  // Each queued entry with the clock drift it was taken with.
  let q: [Entry, number][] = [];
  let dropped = 0;
  let inflight = 0; // bytes of ours in the keepalive quota
  let until = 0; // performance.now() before which a visible page does not send (back-off)
  let backoff = 0;
  let timer: ReturnType<typeof setTimeout> | 0 = 0;

  const trim = (): void => {
    for (; q.length > o.bound; dropped++) q.shift();
  };
  const schedule = (ms: number): void => {
    if (!timer && q.length) timer = setTimeout(flush, ms);
  };
  const requeue = (batch: [Entry, number][], d: number): void => {
    q = batch.concat(q);
    dropped += d;
    trim();
  };
  const backOff = (retryAfterMs: number): void => {
    backoff = Math.min(Math.max(backoff * 2, 1000), 60000);
    until = now() + Math.max(backoff, Math.min(retryAfterMs || 0, 300000));
    flush(); // re-arms the timer for the end of the wait
  };

  /** Hand one beacon to the browser; false: it took nothing (quota full). */
  const send = (body: string, size: number, hiding: boolean, batch: [Entry, number][], d: number): unknown => {
    let ok: unknown;
    if ((hiding || !o.post) && o.beacon)
      try {
        // No completion signal: count the bytes as in flight for a while.
        if ((ok = o.beacon(o.to, body))) setTimeout(() => (inflight -= size), 2000);
      } catch {
        // a bad URL or a detached document: try fetch
      }
    if (!ok && o.post)
      try {
        o.post(o.to, { method: "POST", body, keepalive: true, credentials: "omit" }).then(
          (res) => {
            inflight -= size;
            if (res.status == 429 || res.status == 503) {
              // Not accepted: keep the entries and wait (Retry-After if given, else doubling).
              requeue(batch, d);
              backOff(+res.headers.get("retry-after")! * 1000);
            } else backoff = 0;
          },
          () => {
            // A network error, or a collector without CORS headers (delivered but unreadable):
            // do not resend (no duplicates), but slow down in case the collector is down.
            inflight -= size;
            backOff(0);
          },
        );
        ok = 1;
      } catch {
        // keepalive quota exceeded (TypeError): try later
      }
    if (ok) inflight += size;
    return ok;
  };

  function flush(hiding?: boolean): void {
    clearTimeout(timer);
    timer = 0;
    const t = now();
    if (!hiding && t < until) return schedule(until - t);
    while (q.length) {
      // One beacon, one clock offset: stop at the first entry taken after a clock jump.
      const k = q.findIndex((x) => x[1] != q[0]![1]);
      let n = Math.min(k > 0 ? k : q.length, o.batch);
      let body: string;
      let size: number;
      // Halve the batch until it fits the in-flight limit.
      while (
        (size = new Blob([
          (body = JSON.stringify({
            v: 2, // beacon v2: entries may carry llm (docs/contracts/beacon.v2.schema.json)
            ...o.head(),
            time_origin: performance.timeOrigin,
            clock_drift_ms: q[0]![1],
            sent_ms: now(),
            sdk: "parallax-js/" + VERSION,
            entries: q.slice(0, n).map((x) => x[0]),
            dropped: dropped || undefined,
          })),
        ]).size) > LIMIT &&
        n > 1
      )
        n = Math.ceil(n / 2);
      if (size > LIMIT) {
        // An entry that can never fit (it cannot: 256 chunk times and 1 024 token times are
        // ~12 KB): do not loop.
        q.shift();
        dropped++;
        continue;
      }
      if (inflight + size > LIMIT) break;
      const batch = q.splice(0, n);
      const d = dropped;
      dropped = 0;
      if (!send(body, size, !!hiding, batch, d)) {
        requeue(batch, d);
        break;
      }
    }
    schedule(o.interval);
  }

  return {
    push(e) {
      const d = drift();
      const last = q.length ? q[q.length - 1]![1] : d;
      // Each entry keeps the drift it was taken with (the previous entry's value unless the
      // clocks jumped: sleep/resume), also while sending is blocked (back-off, quota), so one
      // beacon never mixes two clock offsets; a jump sends the older entries first.
      const jumped = Math.abs(d - last) > 25; // Date.now() has 1 ms steps: 25 ms is a jump
      if (jumped) flush();
      q.push([e, jumped ? d : last]);
      trim();
      if (q.length >= o.batch) flush();
      else schedule(o.interval);
    },
    flush,
  };
}
