// The four ways a page talks to an AI backend, each wrapped so that the app sees exactly what
// it would see without the probe: the same Response object, events and errors. The probe
// adds listeners; it never wraps the app's handlers, so an error thrown there stays the app's.
import { now } from "./clock";
import { begin, chunk, end, headers, ids, type Kind, type Rec } from "./core";
import { feed, framing, llm } from "./lazy";
import { formatTraceparent, parseTraceparent, type TraceContext } from "./traceContext";

type W = typeof globalThis & Record<string, unknown>;

/** Whether and how to trace a request to `url` whose own traceparent (header or query
 *  parameter) is `tp`: [the context to send, record it (a sampled session), `tp` is valid and
 *  kept]; nothing when the request must go untouched (another origin, or `fixed`: an invalid
 *  `tp` that cannot be replaced). */
export type Trace = (url: URL, tp?: string | null, fixed?: boolean) => [TraceContext, boolean, boolean] | undefined;

interface XhrState {
  m: string; // method
  u: string; // URL
  tp?: string | undefined; // the app's own traceparent header
  r?: Rec | undefined; // the current send's record
}
/** An EventSource's or WebSocket's record; a WebSocket's exchanges: the last number, the
 *  current one. */
interface StreamState {
  r: Rec;
  tc: TraceContext;
  n: number;
  cur?: Rec | undefined;
}

const failure = (err: unknown): string => ((err as Error)?.name == "AbortError" ? "abort" : "network");
const TP = "traceparent";

/** Wrap fetch, XMLHttpRequest, EventSource and WebSocket of `w` (those it has). `base`: the
 *  URL relative request URLs resolve against. */
export function hook(w: W, trace: Trace, base: () => string): void {
  // One map for the state the probe keeps per XHR, EventSource (its record) and WebSocket.
  const st = new WeakMap<object, unknown>();

  const orig = w.fetch as typeof fetch | undefined;
  const nativeBody = Object.getOwnPropertyDescriptor(Response.prototype, "body")?.get;
  if (orig && nativeBody)
    w.fetch = function (this: unknown, input: RequestInfo | URL, init?: RequestInit): Promise<Response> {
      let r: Rec | undefined;
      let args: unknown[] = [input, init];
      let sent: RequestInit | Request | undefined;
      try {
        const req = input instanceof Request ? input : undefined;
        // What the request will have: init's, else the Request's.
        const get = (k: "headers" | "mode" | "method"): unknown => init?.[k] ?? req?.[k];
        const url = new URL(req ? req.url : String(input), base());
        const h = new Headers(get("headers") as HeadersInit);
        const had = h.get(TP);
        const t = get("mode") != "no-cors" && trace(url, had);
        if (t) {
          const tp = formatTraceparent(t[0]);
          if (tp != had) {
            // A plain object, not a Headers: OpenTelemetry's fetch instrumentation, when it
            // runs inside us, merges its header *under* a plain object's (ours wins). A Request
            // it overwrites: that case is read back below.
            const i2 = { ...init, headers: { ...Object.fromEntries(h), [TP]: tp } };
            args = req ? [(sent = new Request(req, i2))] : [input, (sent = i2)];
          }
          if (t[1]) r = begin("fetch", url, t[0], (get("method") as string) || "GET");
        }
      } catch {
        // untraced (args is only ever set to a complete, valid call)
      }
      const res = orig.apply(this, args as Parameters<typeof fetch>);
      try {
        // Instrumentation inside us may have replaced the header (synchronously, before the
        // request left): report the id that went on the wire.
        const got = r && sent && parseTraceparent(new Headers(sent.headers).get(TP));
        if (got) Object.assign(r!.e, ids(got));
      } catch {
        // keep ours
      }
      const rec = r!; // set only before the call
      return r
        ? res.then(
            (resp) => {
              try {
                headers(rec, resp.status);
                if (nativeBody.call(resp)) {
                  timeBody(resp, rec, nativeBody);
                  // An event stream or NDJSON by its content type: an LLM candidate.
                  const f = framing(resp.headers.get("content-type"));
                  if (f) llm(rec, f);
                } else end(rec);
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

  const X = w.XMLHttpRequest as typeof XMLHttpRequest | undefined;
  if (X) {
    const P = X.prototype;
    const { open, send, setRequestHeader: set } = P;
    const get = (x: XMLHttpRequest) => st.get(x) as XhrState | undefined;
    P.open = function (this: XMLHttpRequest, m: string, u: string | URL) {
      let s = get(this);
      if (!s) {
        st.set(this, (s = {} as XhrState));
        // Listeners once per object, pointing at the current send. An event seen while the
        // object is open again (the app's own handler for it ran first and called open())
        // is the previous request's: open() has ended that one.
        const on = (ev: Event): void => {
          try {
            const r = s!.r;
            const ty = ev.type;
            if (!r || this.readyState < 2) return;
            if (ty == "progress") chunk(r); // throttled by the browser (~50 ms)
            else if (ty[0] == "r") this.readyState == 2 && headers(r, this.status);
            else if (ty[0] != "l") r.e.error = ty == "error" ? "network" : ty;
            else {
              r.e.status = this.status;
              end(r, r.e.error);
            }
          } catch {
            // never into the page
          }
        };
        for (const ty of ["readystatechange", "progress", "error", "abort", "timeout", "loadend"])
          this.addEventListener(ty, on);
      }
      // Opened again: the previous request has ended (its loadend not seen yet; its status
      // came with its headers) or is aborted by this open(). (Nothing here can throw.)
      if (s.r) end(s.r, this.readyState == 4 ? s.r.e.error : "abort");
      s.m = String(m);
      s.u = String(u);
      s.tp = s.r = undefined; // a new request: no header set yet, no record
      // eslint-disable-next-line prefer-rest-params
      return open.apply(this, arguments as unknown as Parameters<typeof open>);
    } as typeof open;
    P.setRequestHeader = function (this: XMLHttpRequest, k: string, v: string) {
      const s = get(this);
      if (s && String(k).toLowerCase() == TP) s.tp = v;
      return set.call(this, k, v);
    };
    P.send = function (this: XMLHttpRequest, body?: Document | XMLHttpRequestBodyInit | null) {
      try {
        const s = get(this);
        if (s && this.readyState == 1) {
          const url = new URL(s.u, base());
          // An app's own unparseable traceparent cannot be replaced (XHR headers append: the
          // server would get "theirs, ours", invalid too): leave that request alone.
          const t = trace(url, s.tp, s.tp !== undefined);
          if (t) {
            if (!t[2]) set.call(this, TP, formatTraceparent(t[0]));
            if (t[1]) {
              const r = (s.r = begin("xhr", url, t[0], s.m));
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

  const finish = (s: StreamState): void => {
    if (s.cur) end(s.cur, "", s.cur.l || now());
    s.cur = undefined;
  };

  /** EventSource and WebSocket cannot send headers: the trace context rides in the query.
   *  Each constructor becomes a Proxy (statics, prototype and instanceof unchanged), and the
   *  instance's `url` reads back what the app passed. */
  const ctor = (C: new (...a: never[]) => EventTarget, name: string, kind: Kind): void => {
    const ws = kind == "websocket";
    w[name] = new Proxy(C, {
      construct(target, a: unknown[], nt) {
        let t: [TraceContext, boolean, boolean] | undefined;
        let u: URL | undefined;
        let orig: string | undefined;
        try {
          u = new URL(String(a[0]), base());
          orig = u.href;
          const q = u.searchParams.get(TP);
          t = trace(u, q);
          if (t) {
            if (!t[2]) u.searchParams.set(TP, formatTraceparent(t[0]));
            a[0] = u.href;
          }
        } catch {
          // untraced (nothing after trace() can throw)
        }
        const o = Reflect.construct(target, a, nt) as EventTarget;
        try {
          if (t) {
            Object.defineProperty(o, "url", { configurable: true, value: orig });
            if (t[1]) {
              const r = begin(kind, u!, t[0], "GET");
              const s: StreamState = { r, tc: t[0], n: 0 };
              st.set(o, s);
              if (ws) r.e.seq = 0; // the handshake
              else llm(r, 0);
              o.addEventListener("open", () => {
                headers(r, ws ? 101 : 200);
                if (ws) end(r); // the handshake's entry; exchanges follow
              });
              o.addEventListener("message", (ev) => {
                // A WebSocket message belongs to the current exchange: none before the page's
                // first send. An exchange ends with its last message (Rec.l), not at the next send.
                const c = ws ? s.cur : r;
                if (c) {
                  headers(c);
                  chunk(c);
                }
                if (!ws) feed(r, r.l!, (ev as MessageEvent).data); // an EventSource's message
              });
              // After an EventSource's last event the server closes and the browser would
              // reconnect: that 'error' is the stream's end. Before 'open' (no headers seen):
              // a failure.
              o.addEventListener(ws ? "close" : "error", () => {
                end(r, r.h ? "" : "network");
                finish(s);
              });
            }
          }
        } catch {
          // untraced
        }
        return o;
      },
    });
  };

  const ES = w.EventSource as typeof EventSource | undefined;
  if (ES) {
    const close = ES.prototype.close;
    ES.prototype.close = function (this: EventSource) {
      const s = st.get(this) as StreamState | undefined;
      if (s) {
        s.r.c ||= !s.r.x; // the page closed it before the server did
        end(s.r);
      }
      return close.call(this);
    };
    ctor(ES, "EventSource", "eventsource");
  }

  const WS = w.WebSocket as typeof WebSocket | undefined;
  if (WS) {
    const send = WS.prototype.send;
    WS.prototype.send = function (this: WebSocket, data: string | ArrayBufferLike | Blob | ArrayBufferView) {
      try {
        const s = st.get(this) as StreamState | undefined;
        if (s && this.readyState == 1) {
          // Each message the page sends starts exchange n (1, 2, 3, … as the agent numbers
          // them); the server's messages until the next send belong to it.
          finish(s);
          s.cur = begin("websocket", new URL(s.r.e.url!), s.tc);
          s.cur.e.seq = ++s.n;
        }
      } catch {
        // untraced
      }
      return send.call(this, data);
    };
    ctor(WS, "WebSocket", "websocket");
  }
}

/** Time each chunk as the app reads `response.body`, through a pass-through stream over the
 *  original body. No tee and no read-ahead (highWaterMark 0): an endless stream costs
 *  nothing. The native body is locked only when the app first reads the wrapper, so code that
 *  merely looks at `res.body` and then calls json(), text() or clone() works as without the
 *  probe. (After a clone() the native getter returns a tee branch.) */
function timeBody(resp: Response, r: Rec, nativeBody: (this: Response) => ReadableStream | null): void {
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
            feed(r, r.l!, v.value as Uint8Array); // (throws nothing: the reader catches its own)
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
  Object.defineProperty(resp, "body", { configurable: true, get: body });
}
