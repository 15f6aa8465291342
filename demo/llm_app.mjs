// The Node.js twin of demo/llm_app.py: same routes, pacing, dialects, timing log and flags,
// on Node's own http module and no dependencies, so scenarios can swap the app's runtime.
// Its dialect streams are byte for byte the Python app's (demo/sse_events.py's shapes;
// tests/test_llm_app.py compares them). Unlike uvicorn, Node sends the response headers
// together with the first body write (as DESIGN.md notes for Node, Go and nginx): server
// TTFB and TTFT coincide here for bare words; a dialect's lead events ride with the head.
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
// the probe's token reader, which it imports from next to itself on the first LLM stream
const STATIC_JS = { "/parallax.min.js": PROBE_JS, "/parallax-llm.min.js": join(here, "..", "js_probe", "dist", "parallax-llm.min.js") };
const WORDS = ("Latency is what the user waits for, not what the server logs. Each token crosses the " +
  "kernel, the network, a proxy or two, and the browser's event loop before it is painted.").split(" ");
const token = (i) => WORDS[i % WORDS.length] + " ";
const now = () => process.hrtime.bigint().toString(); // CLOCK_MONOTONIC on Linux (uv_hrtime)
const MODEL = "parallax-demo";
const HTTP_DIALECTS = ["none", "openai", "anthropic"];
const WS_DIALECTS = ["none", "frames"];
const VENDOR_PATHS = { "/v1/chat/completions": "openai", "/v1/messages": "anthropic" };
const ENGINE_PATH = "/v1/engine/chat/completions";
const MAX_BODY = 1 << 20;

class Refused extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// The dialects' events as demo/sse_events.py builds them (same keys, same order: the JSON
// texts are equal byte for byte; JSON.stringify is compact as Python's separators are).
const sse = (obj, event) => (event ? `event: ${event}\n` : "") + "data: " +
  (typeof obj === "string" ? obj : JSON.stringify(obj)) + "\n\n";
const chatChunk = (delta, finish = null) => ({ id: "chatcmpl-1", object: "chat.completion.chunk",
  created: 1733331234, model: MODEL, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] });

function plan(dialect, isSse, n, usage, promptTokens) {
  const tokens = Array.from({ length: n }, (_, i) => i);
  if (dialect === "openai") {
    const chunks = [chatChunk({ role: "assistant", content: "" }), ...tokens.map((i) => chatChunk({ content: token(i) })),
      chatChunk({}, "stop")];
    if (usage) { // stream_options.include_usage: "usage": null on every chunk, then the counts
      for (const c of chunks) c.usage = null;
      chunks.push({ ...chatChunk({}), choices: [],
        usage: { prompt_tokens: promptTokens, completion_tokens: n, total_tokens: promptTokens + n } });
    }
    const ev = [...chunks.map((c) => sse(c)), sse("[DONE]")];
    // the role-only delta comes with the model's first output (as llama.cpp sends it)
    return { ctype: "text/event-stream; charset=utf-8", lead: [], first: ev.slice(0, 1), tokens: ev.slice(1, 1 + n),
      tail: ev.slice(1 + n) };
  }
  if (dialect === "anthropic") {
    const message = { id: "msg_1", type: "message", role: "assistant", model: MODEL, content: [], stop_reason: null,
      stop_sequence: null, usage: { input_tokens: promptTokens, output_tokens: 1 } };
    const ev = [sse({ type: "message_start", message }, "message_start"), sse({ type: "ping" }, "ping"),
      sse({ type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }, "content_block_start"),
      ...tokens.map((i) => sse({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text: token(i) } },
        "content_block_delta")),
      sse({ type: "content_block_stop", index: 0 }, "content_block_stop"),
      sse({ type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: n } },
        "message_delta"),
      sse({ type: "message_stop" }, "message_stop")];
    // message_start and a ping as the request is accepted, the text block's start with the first token
    return { ctype: "text/event-stream; charset=utf-8", lead: ev.slice(0, 2), first: ev.slice(2, 3), tokens: ev.slice(3, 3 + n),
      tail: ev.slice(3 + n) };
  }
  if (isSse) return { ctype: "text/event-stream", lead: [], first: [], tokens: tokens.map((i) => `data: ${token(i)}\n\n`),
    tail: ["event: done\ndata: [DONE]\n\n"] };
  return { ctype: "text/plain; charset=utf-8", lead: [], first: [], tokens: tokens.map(token), tail: [] };
}

function wsMessages(dialect, n) {
  const tokens = Array.from({ length: n }, (_, i) => token(i));
  if (dialect === "frames") return { tokens: tokens.map((t) => JSON.stringify({ token: t })), end: JSON.stringify({ type: "done" }) };
  return { tokens, end: "[DONE]" };
}

function chooseDialect(query, allowed, path) {
  const d = VENDOR_PATHS[path] || query.get("dialect") || "none";
  if (!allowed.includes(d)) throw new Refused(400, `unknown dialect '${d}' here (one of: ${allowed.join(", ")})`);
  return d;
}

// (the usage chunk asked for, the prompt's tokens counted as words): llm_app.py's request_fields
function requestFields(body, query) {
  let usage = ["1", "true"].includes(query.get("include_usage") || "0");
  let prompt = query.get("prompt") || "";
  if (body.length) {
    let doc;
    try { doc = JSON.parse(body.toString("utf8")); } catch { throw new Refused(400, "the request body is not JSON"); }
    if (doc && typeof doc === "object" && !Array.isArray(doc)) {
      const opts = doc.stream_options;
      usage = usage || (opts && typeof opts === "object" && opts.include_usage === true);
      const parts = Array.isArray(doc.messages) ? doc.messages.filter((m) => m && typeof m === "object").map((m) => m.content) : [];
      prompt = [doc.prompt, ...parts].filter((p) => typeof p === "string").join(" ");
    }
  }
  return { usage: Boolean(usage), promptTokens: prompt.split(/\s+/).filter(Boolean).length };
}

function args(argv) {
  const o = { host: "127.0.0.1", port: 8000, firstTokenMs: 300, tokenGapMs: 40, tokens: 24, timingLog: null, engine: null };
  for (let i = 0; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (k === "--host") o.host = v;
    else if (k === "--port") o.port = Number(v);
    else if (k === "--first-token-ms") o.firstTokenMs = Number(v);
    else if (k === "--token-gap-ms") o.tokenGapMs = Number(v);
    else if (k === "--tokens") o.tokens = Number(v);
    else if (k === "--timing-log") o.timingLog = v;
    else if (k === "--engine") o.engine = v.replace(/\/$/, "");
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

// One body write, its time logged just before it (t_tokens_ns too for a token).
function write(res, rec, data, isToken = false) {
  const t = Number(now());
  rec.t_writes_ns.push(t);
  if (isToken) rec.t_tokens_ns.push(t);
  res.write(data);
}

async function stream(req, res, rec, p, answer) {
  rec.t_tokens_ns = [];
  res.writeHead(200, baseHeaders(req, answer.ctype));
  for (const e of answer.lead) write(res, rec, e);
  let due = performance.now() + p.first;
  // a dialect's empty answer still starts (its first events); bare words' has nothing
  const steps = answer.tokens.length ? answer.tokens : answer.first.length ? [""] : [];
  for (const [i, piece] of steps.entries()) {
    await sleepUntil(due);
    if (res.destroyed) return;
    if (i === 0) for (const e of answer.first) write(res, rec, e);
    if (piece) write(res, rec, piece, true);
    due += p.gap;
  }
  for (const e of answer.tail) write(res, rec, e);
  res.end();
}

// The thin gateway: the request to the engine as it came (body, traceparent), its answer
// back one write per upstream read.
async function proxy(req, res, rec, body) {
  if (!opts.engine) throw new Refused(503, "no engine behind this app (start it with --engine URL)");
  rec.upstream = opts.engine;
  const headers = { "content-type": "application/json" };
  if (rec.traceparent) headers.traceparent = rec.traceparent; // forwarded unchanged, as nginx does
  const ac = new AbortController();
  res.on("close", () => ac.abort()); // leaving closes the engine's connection
  let up;
  try {
    up = await fetch(`${opts.engine}/v1/chat/completions`, { method: "POST", body, headers, signal: ac.signal });
  } catch (e) {
    if (res.destroyed) return;
    throw new Refused(502, `the engine at ${opts.engine} failed: ${e.cause?.message || e.message}`);
  }
  res.writeHead(up.status, baseHeaders(req, up.headers.get("content-type") || "application/octet-stream"));
  try {
    for await (const data of up.body) write(res, rec, data);
  } catch (e) {
    if (!res.destroyed) rec.upstream_error = e.cause?.message || e.message;
  }
  res.end();
}

const server = createServer((req, res) => {
  const rec = { kind: "http", method: req.method, t_start_ns: Number(now()), t_writes_ns: [] };
  const url = new URL(req.url, "http://x");
  rec.path = url.pathname;
  rec.traceparent = req.headers.traceparent || url.searchParams.get("traceparent") || null;
  const p = pacing(url.searchParams);
  const parts = [];
  let size = 0;
  req.on("data", (d) => { size += d.length; if (size <= MAX_BODY) parts.push(d); });
  req.on("end", async () => {
    res.on("close", () => {
      rec.status = res.statusCode;
      if (!res.writableFinished) rec.client_gone = true; // the client went away mid-stream
      log(rec);
    });
    try {
      if (size > MAX_BODY) throw new Refused(413, `the request body is over ${MAX_BODY} bytes`);
      await route(req, res, rec, url, p, Buffer.concat(parts));
    } catch (e) {
      if (!(e instanceof Refused)) throw e;
      res.writeHead(e.status, baseHeaders(req, "text/plain")).end(`${e.message}\n`);
    }
  });
});

const STREAMS = { "/v1/chat": "POST", "/v1/stream": "GET", "/v1/chat/completions": "POST", "/v1/messages": "POST" };

async function route(req, res, rec, url, p, body) {
  if (req.method === "OPTIONS") {
    res.writeHead(204, { ...baseHeaders(req, "text/plain"), "access-control-allow-methods": "GET, POST, OPTIONS",
      "access-control-allow-headers": "traceparent, content-type", "access-control-max-age": "86400" });
    res.end();
  } else if (STREAMS[rec.path] === req.method) {
    const dialect = rec.dialect = chooseDialect(url.searchParams, HTTP_DIALECTS, rec.path);
    // bare words read nothing from the body: any client's bytes will do there
    const f = dialect === "none" ? { usage: false, promptTokens: 0 } : requestFields(body, url.searchParams);
    await stream(req, res, rec, p, plan(dialect, req.method === "GET", p.tokens, f.usage, f.promptTokens));
  } else if (rec.path === ENGINE_PATH && req.method === "POST") await proxy(req, res, rec, body);
  else if (rec.path === "/v1/complete" && req.method === "GET") {
    await sleepUntil(performance.now() + p.first + p.gap * p.tokens);
    const out = JSON.stringify({ text: Array.from({ length: p.tokens }, (_, i) => token(i)).join("") });
    rec.t_writes_ns.push(Number(now()));
    res.writeHead(200, baseHeaders(req, "application/json")).end(out);
  } else if (rec.path === "/" || rec.path === "/index.html") {
    // the page load's trace, named as an instrumented app does (the probe reads it)
    const hex = (n) => randomBytes(n).toString("hex");
    const pageTrace = `00-${hex(16)}-${hex(8)}-01`;
    res.writeHead(200, { ...baseHeaders(req, "text/html; charset=utf-8"),
      "server-timing": `traceparent;desc="${pageTrace}"` }).end(readFileSync(STATIC));
  } else if (Object.hasOwn(STATIC_JS, rec.path) && existsSync(STATIC_JS[rec.path])) {
    res.writeHead(200, baseHeaders(req, "text/javascript")).end(readFileSync(STATIC_JS[rec.path]));
  } else if (rec.path === "/favicon.ico") res.writeHead(204).end();
  else res.writeHead(404, baseHeaders(req, "text/plain")).end("not found\n");
}

// WebSocket (RFC 6455), just what the chat needs: text frames, client frames masked.
server.on("upgrade", (req, socket) => {
  const url = new URL(req.url, "http://x");
  const key = req.headers["sec-websocket-key"];
  let dialect;
  try { dialect = chooseDialect(url.searchParams, WS_DIALECTS, url.pathname); } catch (e) {
    console.error(`llm_app: ${e.message}`);
    socket.end("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
    return;
  }
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
    const rec = { kind: "websocket", path: url.pathname, traceparent, dialect, ws_seq: seq, t_start_ns: Number(now()),
      t_writes_ns: [], t_tokens_ns: [] };
    const m = wsMessages(dialect, p.tokens);
    let due = performance.now() + p.first;
    for (const text of m.tokens) {
      await sleepUntil(due);
      if (socket.destroyed) return;
      const t = Number(now());
      rec.t_writes_ns.push(t);
      rec.t_tokens_ns.push(t);
      frame(1, Buffer.from(text));
      due += p.gap;
    }
    rec.t_writes_ns.push(Number(now()));
    frame(1, Buffer.from(m.end));
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
