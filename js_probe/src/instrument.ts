// The four ways a page talks to an AI backend, each wrapped so that the app sees exactly what
// it would see without the probe: the same Response object, events and errors. The probe
// adds listeners; it never wraps the app's handlers, so an error thrown there stays the app's.
import { now } from "./clock";
import { begin, chunk, end, headers, type Kind, type Rec } from "./core";
import { formatTraceparent, parseTraceparent, type TraceContext } from "./traceContext";

type W = typeof globalThis & Record<string, unknown>;
export interface Policy {
  /** The trace context: a valid one the app (or OpenTelemetry) already set, else a new one;
   *  `record`: this session is sampled. */
  ctx(existing?: string | null): { tc: TraceContext; record: boolean };
  /** May traceparent go to this URL (same origin, or listed in propagateTo)? */
  allowed(u: URL): boolean;
}

const failure = (err: unknown): string => (err && (err as Error).name === "AbortError" ? "abort" : "network");
const def = (o: object, k: string, v: PropertyDescriptor): void => {
  Object.defineProperty(o, k, { configurable: true, ...v });
};
const noHash = (u: URL): string => u.href.split("#")[0] as string;

export function hookFetch(w: W, p: Policy, href: () => string): void {
  const orig = w.fetch as typeof fetch;
  const nativeBody = Object.getOwnPropertyDescriptor(Response.prototype, "body")?.get;
  if (typeof orig !== "function" || !nativeBody) return;
  w.fetch = function (this: unknown, input: RequestInfo | URL, init?: RequestInit): Promise<Response> {
    let r: Rec | undefined;
    let args: unknown[] = [input, init];
    let sent: RequestInit | Request | undefined;
    try {
      const req = input instanceof Request ? input : undefined;
      const url = new URL(req ? req.url : String(input), href());
      const h = new Headers(init?.headers ?? req?.headers);
      const had = h.get("traceparent");
      if ((parseTraceparent(had) || p.allowed(url)) && (init?.mode ?? req?.mode) !== "no-cors") {
        const { tc, record } = p.ctx(had);
        const tp = formatTraceparent(tc);
        if (tp !== had) {
          // A plain object, not a Headers: OpenTelemetry's fetch instrumentation, when it runs
          // inside us, merges its header *under* a plain object's (ours wins). A Request it
          // overwrites: that case is read back below.
          const o: Record<string, string> = {};
          h.forEach((v, k) => (o[k] = v));
          o.traceparent = tp;
          const i2 = { ...init, headers: o };
          args = req ? [(sent = new Request(req, i2))] : [input, (sent = i2)];
        }
        if (record) r = begin("fetch", url, tc, init?.method ?? req?.method ?? "GET", noHash(url));
      }
    } catch {
      args = [input, init];
    }
    const res = orig.apply(this, args as Parameters<typeof fetch>);
    try {
      // Instrumentation inside us may have replaced the header (synchronously, before the
      // request left): report the id that went on the wire.
      const got = r && sent && parseTraceparent(new Headers(sent.headers).get("traceparent"));
      if (r && got) {
        r.e.trace_id = got.traceId;
        r.e.span_id = got.spanId;
        r.e.sampled = (got.flags & 1) === 1;
      }
    } catch {
      // keep ours
    }
    const rec = r;
    return rec
      ? res.then(
          (resp) => {
            try {
              headers(rec, resp.status);
              if (nativeBody.call(resp)) streamBody(resp, rec, nativeBody);
              else end(rec);
            } catch {
              // the app gets its response regardless
            }
            return resp;
          },
          (err: unknown) => {
            end(rec, failure(err));
            throw err; // the very rejection the app would have had
          },
        )
      : res;
  } as typeof fetch;
}

/** Time each chunk as the app reads `response.body`, through a pass-through stream over the
 *  original body. No tee and no read-ahead (highWaterMark 0): an endless stream costs
 *  nothing. The native body is locked only when the app first reads the wrapper, so code that
 *  merely looks at `res.body` and then calls json(), text() or clone() works as without the
 *  probe. (After a clone() the native getter returns a tee branch.) */
function streamBody(resp: Response, r: Rec, nativeBody: (this: Response) => ReadableStream | null): void {
  let s: ReadableStream | undefined;
  const body = (): ReadableStream | null => {
    if (s) return s;
    const b = nativeBody.call(resp);
    if (!b || b.locked) return b; // a used body: the app gets the native error
    let rd: ReadableStreamDefaultReader<unknown> | undefined;
    return (s = new ReadableStream(
      {
        async pull(c) {
          // The app's first read: take the native body now (it throws, as natively, if
          // json()/text() consumed it meanwhile; the record is left alone then).
          if (!rd) {
            rd = b.getReader();
            r.b = true;
          }
          let v: ReadableStreamReadResult<unknown>;
          try {
            v = await rd.read();
          } catch (err) {
            end(r, failure(err));
            throw err; // the app's read() rejects with the original error
          }
          if (v.done) {
            end(r);
            c.close();
          } else {
            chunk(r);
            c.enqueue(v.value);
          }
        },
        cancel(reason) {
          if (!rd) return b.cancel(reason);
          end(r, "abort");
          return rd.cancel(reason);
        },
      },
      { highWaterMark: 0 },
    ));
  };
  // Only the stream is timed: text()/json()/… read the native body (the app's own code path
  // stays native), and their end comes from Resource Timing.
  def(resp, "body", { get: body });
}

interface XhrState {
  m: string;
  u: string;
  tp?: string;
  r?: Rec | undefined;
  l?: boolean; // listeners attached
}

export function hookXhr(w: W, p: Policy, href: () => string): void {
  const X = w.XMLHttpRequest as typeof XMLHttpRequest | undefined;
  if (!X) return;
  const P = X.prototype;
  const { open, send, setRequestHeader: set } = P;
  const st = new WeakMap<XMLHttpRequest, XhrState>();
  P.open = function (this: XMLHttpRequest, m: string, u: string | URL) {
    st.set(this, { m: String(m), u: String(u) });
    // eslint-disable-next-line prefer-rest-params
    return open.apply(this, arguments as unknown as Parameters<typeof open>);
  } as typeof open;
  P.setRequestHeader = function (this: XMLHttpRequest, k: string, v: string) {
    const s = st.get(this);
    if (s && String(k).toLowerCase() === "traceparent") s.tp = v;
    return set.call(this, k, v);
  };
  P.send = function (this: XMLHttpRequest, body?: Document | XMLHttpRequestBodyInit | null) {
    try {
      const s = st.get(this);
      if (s && this.readyState === 1) {
        const url = new URL(s.u, href());
        const had = parseTraceparent(s.tp);
        if (!s.l) {
          s.l = true;
          // First send on this object: listeners once, pointing at whichever send is current.
          const on = (ev: string, f: (r: Rec, x: XMLHttpRequest) => void): void =>
            this.addEventListener(ev, () => {
              try {
                if (s.r) f(s.r, this);
              } catch {
                // never into the page
              }
            });
          on("readystatechange", (r, x) => x.readyState === 2 && headers(r, x.status));
          on("progress", (r) => chunk(r));
          for (const e of ["error", "abort", "timeout"]) on(e, (r) => (r.e.error = e === "error" ? "network" : e));
          on("loadend", (r, x) => {
            r.e.status = x.status;
            end(r, r.e.error);
          });
        }
        s.r = undefined;
        // An app's own unparseable traceparent cannot be replaced (XHR headers append: the
        // server would get "theirs, ours", invalid too): leave that request alone.
        if (had || (s.tp === undefined && p.allowed(url))) {
          const { tc, record } = p.ctx(s.tp);
          if (!had) set.call(this, "traceparent", formatTraceparent(tc));
          if (record) {
            const r = (s.r = begin("xhr", url, tc, s.m, noHash(url)));
            r.e.chunks_coarse = true; // progress events are throttled (~50 ms)
            r.b = true; // it ends at loadend, not at its Resource Timing entry
          }
        }
      }
    } catch {
      // untraced
    }
    return send.call(this, body);
  };
}

/** EventSource and WebSocket cannot send headers: the trace context rides in the query.
 *  Each constructor becomes a Proxy (statics, prototype and instanceof unchanged), and the
 *  instance's `url` reads back what the app passed. */
function hookCtor<T extends EventTarget>(
  w: W,
  name: string,
  p: Policy,
  href: () => string,
  kind: Kind,
  started: (o: T, r: Rec, tc: TraceContext) => void,
): void {
  const C = w[name] as (new (...a: unknown[]) => T) | undefined;
  if (!C) return;
  w[name] = new Proxy(C, {
    construct(target, a: unknown[], nt) {
      let t: { u: URL; tc: TraceContext; record: boolean; orig: string } | undefined;
      try {
        const url = new URL(String(a[0]), href());
        const q = url.searchParams.get("traceparent");
        const had = parseTraceparent(q);
        if (had || p.allowed(url)) {
          t = { u: new URL(url.href), orig: url.href, ...p.ctx(q) };
          if (!had) t.u.searchParams.set("traceparent", formatTraceparent(t.tc));
          a = [t.u.href, ...a.slice(1)];
        }
      } catch {
        t = undefined;
      }
      const o = Reflect.construct(target, a, nt) as T;
      try {
        if (t) {
          def(o, "url", { value: t.orig });
          if (t.record) started(o, begin(kind, t.u, t.tc, "GET", kind === "websocket" ? undefined : t.u.href), t.tc);
        }
      } catch {
        // untraced
      }
      return o;
    },
  });
}

export function hookEventSource(w: W, p: Policy, href: () => string): void {
  const ES = w.EventSource as typeof EventSource | undefined;
  if (!ES) return;
  const recs = new WeakMap<EventSource, Rec>();
  const close = ES.prototype.close;
  ES.prototype.close = function (this: EventSource) {
    const r = recs.get(this);
    if (r) end(r);
    return close.call(this);
  };
  hookCtor<EventSource>(w, "EventSource", p, href, "eventsource", (es, r) => {
    let opened = false;
    recs.set(es, r);
    es.addEventListener("open", () => {
      opened = true;
      headers(r, 200);
    });
    es.addEventListener("message", () => chunk(r));
    // After the last event the server closes and the browser would reconnect: that 'error'
    // is the stream's end; before 'open' it is a failure.
    es.addEventListener("error", () => end(r, opened ? undefined : "network"));
  });
}

interface WsState {
  r: Rec;
  tc: TraceContext;
  n: number;
  cur?: Rec | undefined;
}

export function hookWebSocket(w: W, p: Policy, href: () => string): void {
  const WS = w.WebSocket as typeof WebSocket | undefined;
  if (!WS) return;
  const sockets = new WeakMap<WebSocket, WsState>();
  const send = WS.prototype.send;
  const finish = (s: WsState): void => {
    if (s.cur) end(s.cur, undefined, s.cur.l ?? now());
    s.cur = undefined;
  };
  WS.prototype.send = function (this: WebSocket, data: string | ArrayBufferLike | Blob | ArrayBufferView) {
    try {
      const s = sockets.get(this);
      if (s && this.readyState === 1) {
        // Each message the page sends starts exchange n (1, 2, 3, … as the agent numbers
        // them); the server's messages until the next send belong to it.
        finish(s);
        s.cur = begin("websocket", new URL(s.r.e.url as string), s.tc);
        s.cur.e.seq = ++s.n;
      }
    } catch {
      // untraced
    }
    return send.call(this, data);
  };
  hookCtor<WebSocket>(w, "WebSocket", p, href, "websocket", (ws, r, tc) => {
    r.e.seq = 0; // the handshake
    const s: WsState = { r, tc, n: 0 };
    sockets.set(ws, s);
    ws.addEventListener("open", () => {
      headers(r, 101);
      end(r);
    });
    ws.addEventListener("message", () => {
      const c = s.cur;
      if (!c) return; // server pushes before the page's first message: no exchange
      headers(c);
      chunk(c); // an exchange ends with its last message (Rec.l), not at the next send
    });
    ws.addEventListener("close", () => {
      end(r, "network"); // a no-op after a successful open
      finish(s);
    });
  });
}
