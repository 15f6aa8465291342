// Test server on Node's http module, with its own clock (process.hrtime.bigint() is
// CLOCK_MONOTONIC on Linux, the clock bpf_ktime_get_ns reads).
// Timing log: one JSON line per request — t_read_ns when the request event fired (the read
// that completed the head just returned), t_writes_ns before each write.
// Routes: /plain?n=BYTES (Content-Length, one write), /stream?n=K&gap_ms=G (chunked).
// Usage: node node_server.mjs PORT TIMING_LOG [CERT KEY]   (prints the port; with a
// certificate and key: https, Node's own statically linked OpenSSL)
import http from 'node:http';
import https from 'node:https';
import fs from 'node:fs';

const [port, logPath, certPath, keyPath] = process.argv.slice(2);
const now = () => process.hrtime.bigint().toString();
const log = fs.openSync(logPath, 'a');

const handler = (req, res) => {
  const rec = { path: req.url.split('?')[0], traceparent: req.headers['traceparent'] ?? null,
                t_read_ns: Number(now()), t_writes_ns: [] };
  const u = new URL(req.url, 'http://x');
  const done = () => fs.writeSync(log, JSON.stringify(rec) + '\n');
  req.resume();
  req.on('end', () => {
    if (u.pathname === '/stream') {
      const n = Number(u.searchParams.get('n') ?? 5);
      const gap = Number(u.searchParams.get('gap_ms') ?? 20);
      res.writeHead(200, { 'content-type': 'text/plain' });
      let i = 0;
      const tick = () => {
        rec.t_writes_ns.push(Number(now()));
        res.write(`token-${i}\n`);
        i += 1;
        if (i < n) setTimeout(tick, gap);
        else { res.end(); done(); }
      };
      tick();
    } else {
      const body = 'x'.repeat(Number(u.searchParams.get('n') ?? 10));
      rec.t_writes_ns.push(Number(now()));
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': body.length });
      res.end(body);
      done();
    }
  });
};
const server = certPath
  ? https.createServer({ cert: fs.readFileSync(certPath), key: fs.readFileSync(keyPath) }, handler)
  : http.createServer(handler);
server.keepAliveTimeout = 30000;
server.listen(Number(port), '127.0.0.1', () => console.log(server.address().port));
