// The Node.js twin of demo/llm_app.py: same routes, pacing, timing log and flags, on
// Node's own http module and no dependencies, so scenarios can swap the app's runtime.
// Unlike uvicorn, Node sends the response headers together with the first body write
// (as DESIGN.md notes for Node, Go and nginx): server TTFB and TTFT coincide here.
//
//   node demo/llm_app.mjs --port 0 --timing-log /tmp/t.jsonl --first-token-ms 300
import { createServer } from "node:http";
import { createHash, randomBytes } from "node:crypto";
import { appendFileSync, readFileSync, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const STATIC = join(here, "static", "chat.html");
const PROBE_JS = join(here, "..", "js_probe", "dist", "parallax.min.js");
const WORDS = ("Latency is what the user waits for, not what the server logs. Each token crosses the " +
  "kernel, the network, a proxy or two, and the browser's event loop before it is painted.").split(" ");
const token = (i) => WORDS[i % WORDS.length] + " ";
const now = () => process.hrtime.bigint().toString(); // CLOCK_MONOTONIC on Linux (uv_hrtime)

function args(argv) {
  const o = { host: "127.0.0.1", port: 8000, firstTokenMs: 300, tokenGapMs: 40, tokens: 24, timingLog: null };
  for (let i = 0; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (k === "--host") o.host = v;
    else if (k === "--port") o.port = Number(v);
    else if (k === "--first-token-ms") o.firstTokenMs = Number(v);
    else if (k === "--token-gap-ms") o.tokenGapMs = Number(v);
    else if (k === "--tokens") o.tokens = Number(v);
    else if (k === "--timing-log") o.timingLog = v;
    else { console.error(`llm_app.mjs: unknown option ${k}`); process.exit(2); }
  }
  return o;
}

const opts = args(process.argv.slice(2));
const log = (rec) => {
  if (opts.timingLog) appendFileSync(opts.timingLog, JSON.stringify(rec) + "\n");
};

function pacing(query) {
  const num = (k, d) => (query.has(k) && !Number.isNaN(Number(query.get(k))) ? Math.max(0, Number(query.get(k))) : d);
  return { first: num("first_token_ms", opts.firstTokenMs), gap: num("token_gap_ms", opts.tokenGapMs),
           tokens: Math.min(10000, Math.floor(num("tokens", opts.tokens))) };
}

const sleepUntil = (t) => new Promise((r) => setTimeout(r, Math.max(0, t - performance.now())));

function baseHeaders(req, ctype) {
  const h = { "content-type": ctype, "cache-control": "no-store", "timing-allow-origin": "*" };
  if (req.headers.origin) { h["access-control-allow-origin"] = req.headers.origin; h.vary = "origin"; }
  return h;
}

async function stream(req, res, rec, p, sse) {
  res.writeHead(200, baseHeaders(req, sse ? "text/event-stream" : "text/plain; charset=utf-8"));
  let due = performance.now() + p.first;
  for (let i = 0; i < p.tokens; i++) {
    await sleepUntil(due);
    if (res.destroyed) return;
    rec.t_writes_ns.push(Number(now()));
    res.write(sse ? `data: ${token(i)}\n\n` : token(i));
    due += p.gap;
  }
  if (sse) { rec.t_writes_ns.push(Number(now())); res.write("event: done\ndata: [DONE]\n\n"); }
  res.end();
}

const server = createServer((req, res) => {
  const rec = { kind: "http", method: req.method, t_start_ns: Number(now()), t_writes_ns: [] };
  const url = new URL(req.url, "http://x");
  rec.path = url.pathname;
  rec.traceparent = req.headers.traceparent || url.searchParams.get("traceparent") || null;
  const p = pacing(url.searchParams);
  req.resume();
  req.on("end", async () => {
    res.on("close", () => {
      rec.status = res.statusCode;
      if (!res.writableFinished) rec.client_gone = true; // the client went away mid-stream
      log(rec);
    });
    if (req.method === "OPTIONS") {
      res.writeHead(204, { ...baseHeaders(req, "text/plain"), "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": "traceparent, content-type", "access-control-max-age": "86400" });
      res.end();
    } else if (rec.path === "/v1/chat" && req.method === "POST") await stream(req, res, rec, p, false);
    else if (rec.path === "/v1/stream" && req.method === "GET") await stream(req, res, rec, p, true);
    else if (rec.path === "/v1/complete" && req.method === "GET") {
      await sleepUntil(performance.now() + p.first + p.gap * p.tokens);
      const body = JSON.stringify({ text: Array.from({ length: p.tokens }, (_, i) => token(i)).join("") });
      rec.t_writes_ns.push(Number(now()));
      res.writeHead(200, baseHeaders(req, "application/json")).end(body);
    } else if (rec.path === "/" || rec.path === "/index.html") {
      // the page load's trace, named as an instrumented app does (the probe reads it)
      const hex = (n) => randomBytes(n).toString("hex");
      const pageTrace = `00-${hex(16)}-${hex(8)}-01`;
      res.writeHead(200, { ...baseHeaders(req, "text/html; charset=utf-8"),
        "server-timing": `traceparent;desc="${pageTrace}"` }).end(readFileSync(STATIC));
    } else if (rec.path === "/parallax.min.js" && existsSync(PROBE_JS)) {
      res.writeHead(200, baseHeaders(req, "text/javascript")).end(readFileSync(PROBE_JS));
    } else if (rec.path === "/favicon.ico") res.writeHead(204).end();
    else res.writeHead(404, baseHeaders(req, "text/plain")).end("not found\n");
  });
});

// WebSocket (RFC 6455), just what the chat needs: text frames, client frames masked.
server.on("upgrade", (req, socket) => {
  const url = new URL(req.url, "http://x");
  const key = req.headers["sec-websocket-key"];
  if (url.pathname !== "/v1/ws" || !key) { socket.destroy(); return; }
  const accept = createHash("sha1").update(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
  socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
    `Sec-WebSocket-Accept: ${accept}\r\n\r\n`);
  const traceparent = url.searchParams.get("traceparent");
  const p = pacing(url.searchParams);
  let buf = Buffer.alloc(0), seq = 0, busy = Promise.resolve();
  const frame = (op, payload) => {
    const n = payload.length;
    const head = n < 126 ? Buffer.from([0x80 | op, n])
      : Buffer.from([0x80 | op, 126, n >> 8, n & 255]);
    socket.write(Buffer.concat([head, payload]));
  };
  const answer = async () => {
    seq += 1; // exchange numbering shared with the agent and the probe: 1, 2, 3, ...
    const rec = { kind: "websocket", path: url.pathname, traceparent, ws_seq: seq, t_start_ns: Number(now()), t_writes_ns: [] };
    let due = performance.now() + p.first;
    for (let i = 0; i < p.tokens; i++) {
      await sleepUntil(due);
      if (socket.destroyed) return;
      rec.t_writes_ns.push(Number(now()));
      frame(1, Buffer.from(token(i)));
      due += p.gap;
    }
    rec.t_writes_ns.push(Number(now()));
    frame(1, Buffer.from("[DONE]"));
    log(rec);
  };
  socket.on("data", (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 2) {
      const op = buf[0] & 15; let len = buf[1] & 127, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10; }
      if (buf.length < off + 4 + len) return;
      buf = buf.subarray(off + 4 + len);
      if (op === 8) { frame(8, Buffer.alloc(0)); socket.end(); return; }
      if (op === 1 || op === 2) busy = busy.then(answer);
    }
  });
  socket.on("error", () => socket.destroy());
});

server.listen(opts.port, opts.host, () => {
  const a = server.address();
  console.log(`llm_app: listening on http://${a.address}:${a.port}`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => { server.close(); process.exit(0); });
