// Test server on Node's cluster module in round-robin mode (as PM2's cluster mode runs
// apps): the primary accepts every connection and hands it to one of two workers over IPC,
// so the workers, which serve the requests, hold no listening socket.
// Usage: node node_cluster.mjs   (prints the port once both workers listen)
import cluster from 'node:cluster';
import http from 'node:http';

cluster.schedulingPolicy = cluster.SCHED_RR;
if (cluster.isPrimary) {
  let listening = 0;
  cluster.on('listening', (_worker, address) => {
    listening += 1;
    if (listening === 2) console.log(address.port);
  });
  for (let i = 0; i < 2; i++) cluster.fork();
  process.on('SIGTERM', () => {
    for (const w of Object.values(cluster.workers)) w.kill();
    process.exit(0);
  });
} else {
  http
    .createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'x-worker': String(process.pid) });
      res.end('ok\n');
    })
    .listen(0, '127.0.0.1'); // in a cluster, every worker gets the same port
}
