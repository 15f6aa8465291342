// Batching and delivery of beacons (docs/contracts/beacon.v1.schema.json).
//
// The keepalive/sendBeacon quota is 64 KB in flight per page and shared with the app, so the
// probe keeps at most LIMIT bytes of its own in flight. While the page is visible it posts
// with fetch(keepalive): it can then see 429/503 and back off, and it knows when bytes leave
// the quota. When the page is being hidden (perhaps for good) it uses sendBeacon, checking
// its return value (false = quota full), then fetch(keepalive). Both send text/plain: a CORS
// simple request, no preflight.
import { DRIFT_JUMP_MS, drift, now } from "./clock";
import type { Entry } from "./core";

export const LIMIT = 32 * 1024;
export const SDK = "parallax-js/0.1.0";

export interface TransportOptions {
  endpoint: string;
  site: string;
  page: () => string; // the page path when the beacon is sent (single-page apps change it)
  maxBatch: number; // entries per beacon (schema: ≤ 500)
  maxQueue: number; // bounded queue: the oldest entries are dropped beyond it
  flushIntervalMs: number;
  session: () => string;
  fetch?: ((url: string, init: RequestInit) => Promise<Response>) | undefined;
  sendBeacon?: ((url: string, body: string) => boolean) | undefined;
}

export interface Transport {
  push(e: Entry): void;
  /** Send what is queued within the in-flight budget; `hiding`: the page may be going away. */
  flush(hiding?: boolean): void;
}

export function transport(o: TransportOptions): Transport {
  let q: Entry[] = [];
  let qd: number[] = []; // the clock drift each queued entry was taken with
  let dropped = 0;
  let inflight = 0; // bytes of ours in the keepalive quota
  let until = 0; // performance.now() before which a visible page does not send (back-off)
  let backoff = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;

  const trim = (): void => {
    while (q.length > o.maxQueue) {
      q.shift();
      qd.shift();
      dropped++;
    }
  };
  const schedule = (ms: number): void => {
    if (timer === undefined && q.length)
      timer = setTimeout(() => {
        timer = undefined;
        flush();
      }, ms);
  };
  const requeue = (batch: Entry[], bd: number[], d: number): void => {
    q = batch.concat(q);
    qd = bd.concat(qd);
    dropped += d;
    trim();
  };
  const backOff = (retryAfterMs: number): void => {
    backoff = Math.min(Math.max(backoff * 2, 1000), 60000);
    const wait = Math.max(backoff, Math.min(retryAfterMs || 0, 300000));
    until = now() + wait;
    flush(); // re-arms the timer for the end of the wait
  };

  const send = (body: string, size: number, hiding: boolean, batch: Entry[], bd: number[], d: number): boolean => {
    const url = o.endpoint;
    if ((hiding || !o.fetch) && o.sendBeacon) {
      let ok = false;
      try {
        ok = o.sendBeacon(url, body);
      } catch {
        // a bad URL or a detached document: try fetch
      }
      if (ok) {
        // No completion signal: count the bytes as in flight for a while.
        inflight += size;
        setTimeout(() => (inflight -= size), 2000);
        return true;
      }
    }
    if (!o.fetch) return false;
    inflight += size;
    try {
      o.fetch(url, { method: "POST", body, keepalive: true, credentials: "omit" }).then(
        (res) => {
          inflight -= size;
          if (res.status === 429 || res.status === 503) {
            // Not accepted: keep the entries and wait (Retry-After if given, else doubling).
            requeue(batch, bd, d);
            backOff(Number(res.headers.get("retry-after")) * 1000);
          } else backoff = 0;
        },
        () => {
          // A network error, or a collector without CORS headers (delivered but unreadable):
          // do not resend (no duplicates), but slow down in case the collector is down.
          inflight -= size;
          backOff(0);
        },
      );
      return true;
    } catch {
      inflight -= size; // keepalive quota exceeded (TypeError): try later
      return false;
    }
  };

  const beacon = (entries: Entry[]): Record<string, unknown> => {
    const b: Record<string, unknown> = {
      v: 1,
      site: o.site,
      session: o.session(),
      page: o.page(),
      time_origin: performance.timeOrigin,
      clock_drift_ms: qd[0],
      sent_ms: now(),
      sdk: SDK,
      entries,
    };
    if (dropped) b.dropped = dropped;
    return b;
  };

  function flush(hiding = false): void {
    clearTimeout(timer);
    timer = undefined;
    const t = now();
    if (!hiding && t < until) return schedule(until - t);
    while (q.length) {
      // One beacon, one clock offset: stop at the first entry taken after a clock jump.
      const k = qd.findIndex((x) => x !== qd[0]);
      let n = Math.min(k > 0 ? k : q.length, o.maxBatch);
      let body: string;
      let size: number;
      for (;;) {
        body = JSON.stringify(beacon(q.slice(0, n)));
        size = new Blob([body]).size;
        if (size <= LIMIT || n < 2) break;
        n = Math.ceil(n / 2);
      }
      if (size > LIMIT) {
        // An entry that can never fit (it cannot: 256 chunk times are ~2 KB): do not loop.
        q.shift();
        qd.shift();
        dropped++;
        continue;
      }
      if (inflight + size > LIMIT) break;
      const batch = q.splice(0, n);
      const bd = qd.splice(0, n);
      const d = dropped;
      dropped = 0;
      if (!send(body, size, hiding, batch, bd, d)) {
        requeue(batch, bd, d);
        break;
      }
    }
    schedule(o.flushIntervalMs);
  }

  return {
    push(e) {
      const d = drift();
      const last = qd[qd.length - 1];
      // Each entry keeps the drift it was taken with (the previous entry's value unless the
      // clocks jumped: sleep/resume), also while sending is blocked (back-off, quota), so one
      // beacon never mixes two clock offsets; a jump sends the older entries first.
      const jumped = last !== undefined && Math.abs(d - last) > DRIFT_JUMP_MS;
      if (jumped) flush();
      qd.push(last === undefined || jumped ? d : last);
      q.push(e);
      trim();
      if (q.length >= o.maxBatch) flush();
      else schedule(o.flushIntervalMs);
    },
    flush,
  };
}
