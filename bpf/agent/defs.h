// Constants shared by every part of the agent program: sizes, event and write kinds,
// aggregate flags (the layouts user space mirrors in agent/events.py).

#define PX_CHUNKS 256
// Bytes read at once from the start of every body write (see px_on_write_conn).
#define PX_PEEK (PX_RESP_WINDOW < 256 ? PX_RESP_WINDOW : 256)
#define PX_AF_INET 2
#define PX_IPPROTO_TCP 6
// TCP states (the kernel's include/net/tcp_states.h): tcp.h's state changes, state.h's
// unfollowed-connection check
#define TCP_ESTABLISHED 1
#define TCP_SYN_RECV 3
#define TCP_FIN_WAIT1 4
#define TCP_FIN_WAIT2 5
#define TCP_CLOSE 7
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9
#define TCP_LISTEN 10
#define EV_READ 1
#define EV_RESP 2
#define EV_WAGG 3
#define EV_CLOSE 4
#define EV_PEER_FIN 5
#define EV_SOCK_CLOSE 6  // the socket closed without a close() we saw (process killed, exit)
#define EV_TLS 7  // the connection carries TLS records (tls.h): its bytes come from uprobes
#define EV_H2 8   // a read or write of an HTTP/2 connection (proto/http2.h)
#define EV_BODY 9  // a body write of an LLM token stream, with its bytes (proto/stream.h)
#define EV_TAIL 10  // a closed connection's socket reached its end: its last TCP counts (tcp.h)

#define KIND_READ 1
#define KIND_WRITE 2
#define KIND_SENDFILE 3
#define KIND_ACCEPT 4  // raw path only: accept()/accept4() in flight (buf: the peer sockaddr)
#define KIND_SENDFILE_CONT 5  // a later piece of the same sendfile(): bytes, not a new chunk

#define IOV_NONE 0
#define IOV_VEC 1
#define IOV_MSG 2

#define PX_TLS_SEEN 1  // px_conn.tls: its first read with data was looked at
#define PX_TLS_ON 2    // ... and began with a TLS record: the socket carries ciphertext
#define PX_H2_SEEN 1  // px_conn.h2: its first read with data was looked at for the preface
#define PX_H2_ON 2    // ... and was HTTP/2's client preface: reads and writes take proto/http2.h
#define PX_H2_DEAD 4  // ... and tracing paused since: user space gave it up, nothing is sent
#define PX_MARKS 8  // writes whose sequence ranges a connection keeps (tcp.h, retransmit waits)
#define PX_TAILS 4096  // closed connections whose sockets may still retransmit (px_tails)
#define PX_PID_TRACED 1  // px_pids bit: the process is traced (agent/kernel/loader.py set_pids)
#define PX_PID_TLS 2     // px_pids bit: the process carries the TLS probes (agent/kernel/tls_probes.py)

#define WAGG_END 1      // chunked terminator seen: the response is complete
#define WAGG_PARTIAL 2  // stream-length limit reached: more follows
#define WAGG_CLOSE 4    // flushed because the connection closed

// counters (px_counters index): C_LOST, C_CONNS, C_CONNS_DEL (px_conns entries deleted:
// fill = C_CONNS - C_CONNS_DEL), C_AGGS, C_AGGS_DEL (px_aggs entries created, deleted),
// C_SOCK_CLOSE (connections ended by the socket's own state change, no close()),
// C_LISTEN_CHG (listening sockets opened or closed: user space rescans /proc then),
// C_SHED_READS (reads with data by traced processes while paused, over the CPU budget),
// C_BLOCKING (followed connections whose socket blocks on writes: no O_NONBLOCK),
// C_UNFOLLOWED (reads with data, by traced processes, on connections to a traced listener
// the agent does not follow: state.h px_unfollowed_read) and C_NCOUNTERS are defined by the
// loader from its one list (agent/kernel/build.py COUNTERS).

// Chunk offsets are u32 microseconds (~71 min): an aggregate spanning more is flushed
// (without a flag: user space merges it into the same response) before it could wrap.
#ifndef PX_OFFS_SPAN_NS
#define PX_OFFS_SPAN_NS 3600000000000ULL
#endif
