// What is kept per thread (the syscall in flight) and per connection (fd link, framing
// state, body-write aggregate), and how a read or write finds its connection.

struct px_active {
    u64 busy;  // task storage is reused: 0 = no traced syscall in flight
    u64 buf;
    u64 sk;
    u32 fd;
    u8 kind;
    u8 iov;
    u16 vlen;  // iovec count for readv/writev (sendmsg: read from the msghdr)
};

struct px_fd {
    u64 sk;      // 0 until the first read/write links it
    u64 t_acc;   // accept() return, 0 when unknown
    u16 lport;   // seeded from /proc for connections older than the agent (with the
    u16 rport;   // addresses: /proc/net/tcp{,6} knows them, the conn would not)
    u16 family;
    u8 seeded;
    u8 pad;
    u8 laddr[16];
    u8 raddr[16];
};

struct px_conn {
    u64 agg_pending;  // body writes sit in px_aggs: reads need not look there otherwise
    u64 fdkey;       // (tgid << 32 | fd) last linked to this socket: skips the fd table
    u64 t_est;       // handshake complete (0: before the agent started)
    u64 ident;       // t_est, or the time the agent first saw the socket (socket reuse)
    u64 t_acc;
    u64 t_arr;       // first data arrival not yet consumed by a read
    u32 tgid;
    u32 srtt_us;
    u32 retrans;
    u16 lport;
    u16 rport;
    u16 family;
    u16 ws;          // 1 after a "101 Switching Protocols" response: WebSocket frames follow
    u8 laddr[16];
    u8 raddr[16];
    u32 lost;        // an event of this connection was lost (ring full): told with the next
    u32 peer_rst;    // tcp_receive_reset: the reset that closes it is the peer's
    u32 epoch;       // px_cfg.epoch of its last event: another one means a pause in between
    u32 arr_epoch;   // px_cfg.epoch when t_arr was stamped
    // PX_SOCK_HOOKS write state, on the connection rather than the thread (one lookup
    // fewer per write: the connection is looked up anyway). A socket's writes are
    // serialised by its lock, so one in progress at a time.
    u64 t_send;      // start of the blocking write in progress (tcp_sendmsg_locked)
    u64 sf_left;     // bytes the sendfile() in progress still has to send
    u32 send_epoch;  // px_cfg.epoch when t_send was stamped
    u32 mode_seen;   // its socket's blocking mode was checked (see px_cfg.send_start)
    // Sampling (sample.h): the request being read — 0 (the next read with data starts one
    // and decides), PX_KEEP or PX_DROP — and the decisions of requests not yet answered,
    // oldest in bit 0 (1 = dropped), which each final response head takes in order.
    u64 t_req;       // first read of the oldest request not yet answered (its TTFB)
    u32 sample_th;   // the threshold that decided the request being read
    u16 skipped;     // requests dropped since the last READ event (user space counts them)
    u8 sample;
    u8 resp_drop;    // the response being written answers a dropped request
    u8 dq;           // pending decisions (bit i: the i-th oldest was dropped)
    u8 dn;           // how many (at most 8; pipelining deeper shares the last decision)
    u8 dlast;        // the last decision taken from dq
    u8 tls;          // PX_TLS_SEEN, PX_TLS_ON (tls.h): the socket carries TLS records
    u8 h2;           // PX_H2_SEEN, PX_H2_ON (proto/http2.h): the connection speaks HTTP/2
    u8 stream;       // PX_STREAM_* (proto/stream.h): the response being written is an
                     // event stream (or the connection a WebSocket): its writes go up
    // TLS (tls.h): the SSL object the connection's plaintext last came through, and the
    // arrival of the ciphertext its last socket read took (the decrypting read's t_arr)
    u64 tls_ssl;
    u64 tls_arr;
    // HTTP/2 (proto/http2.h): per direction (0 read, 1 write), the bytes of the current frame
    // still to come at the next event (PX_H2_LOST: the kernel's walk gave up)
    u32 h2_left[2];
    // Retransmits (tcp.h; `retrans` above counts the segments): the summed wait of those
    // that could be timed (µs; mod 2^32, user space takes differences), how many were, the
    // last one's time (µs, mod 2^32; 0: none yet), and the sequence ranges of the last
    // PX_MARKS writes with their start times (µs, mod 2^32): what a retransmitted byte's
    // first send cannot precede.
    u32 rtx_wait_us;
    u32 rtx_timed;
    u32 rtx_last_us;
    u32 mk_i;
    u32 mk_start[PX_MARKS];
    u32 mk_end[PX_MARKS];
    u32 mk_us[PX_MARKS];
};

struct px_agg {
    u64 t_first;
    u64 t_last;
    u64 bytes;
    u64 gap_max_ns;
    u32 n;
    u32 flags;
    u64 hold_block_t;  // a write failed with EAGAIN (send buffer full): when (hold.h)
    // Write-to-wire holdback of these writes (hold.h): how long a write's last byte waited
    // in the socket before the segment carrying it was handed to the device.
    u32 hold_max_us;   // the longest such wait
    u32 hold_sum_us;
    u16 hold_n;        // writes whose bytes were held, timed
    u16 hold_untimed;  // held writes whose departure was not seen (see hold.h)
    u8 hold_why;       // the reason of the longest (PX_WHY_*)
    u8 hold_mask;      // every reason seen (1 << PX_WHY_*)
    u8 hold_pend;      // held writes still waiting to leave
    u8 hold_on;        // 1: the writes were checked (0: not measured, e.g. TLS)
    u32 hold_bytes;    // the most bytes left unsent at a write's return
    u32 offs_us[PX_CHUNKS];
};

#ifdef PX_TASK_STORAGE
// The syscall in flight, per thread: task-local storage (a pointer in the task, no hash)
BPF_TASK_STORAGE(px_active, struct px_active);
#else
BPF_HASH(px_active, u64, struct px_active, 16384);
#endif
BPF_TABLE("lru_hash", u64, struct px_fd, px_fds, PX_MAX_CONNS);
BPF_TABLE("lru_hash", u64, struct px_conn, px_conns, PX_MAX_CONNS);
// A connection its app has closed whose socket can still retransmit (FIN_WAIT1, LAST_ACK,
// CLOSING): its retransmits go on being counted here until the socket's end (tcp.h
// px_tail_end: EV_TAIL).
BPF_TABLE("lru_hash", u64, struct px_conn, px_tails, PX_TAILS);
BPF_TABLE("lru_hash", u64, struct px_agg, px_aggs, PX_MAX_CONNS);
BPF_PERCPU_ARRAY(px_agg_zero, struct px_agg, 1);  // never written: the zero value for inits

#ifdef PX_HOLDS
// Write-to-wire holdback (hold.h): per socket, the writes whose last byte had not left
// when the write returned, oldest first, until the segment carrying it is transmitted.
#define PX_HOLD_Q 8
struct px_hold {
    u64 t[PX_HOLD_Q];    // the write's start
    u32 seq[PX_HOLD_Q];  // tcp_sock.write_seq at its return: the sequence after its last byte
    u8 why[PX_HOLD_Q];   // PX_WHY_*
    u32 head;
    u32 n;
};
// An entry lives as long as its connection (deleted with it): none is freed under a
// departure on another CPU.
BPF_HASH(px_holds, u64, struct px_hold, PX_MAX_CONNS);
// Sockets with held writes, node-wide: the per-packet departure hook returns at once at 0.
BPF_ARRAY(px_hold_count, s64, 1);

static __always_inline void px_hold_count_add(s64 d) {
    u32 zero = 0;
    s64 *v = px_hold_count.lookup(&zero);
    if (v)
        __sync_fetch_and_add(v, d);
}

static __always_inline void px_hold_forget(u64 sk) {
    struct px_hold *h = px_holds.lookup(&sk);
    if (!h)
        return;
    if (h->n)
        px_hold_count_add(-1);
    px_holds.delete(&sk);
}
#endif

#if !defined(PX_HAVE_SOCK_RECV_LENGTH) || !defined(PX_HAVE_SOCK_SEND_LENGTH)
// Before Linux 6.3 (no sock_*_length): link fd and socket by the peer address that accept()
// writes to user memory and the 4-tuple inet_sock_set_state saw at the handshake. Servers
// that pass no address buffer to accept() (libuv, Go) are not followed on these kernels.
#define PX_LINK_BY_TUPLE 1
struct px_tuple {
    u8 raddr[16];
    u16 rport;
    u16 pad[3];
};
BPF_TABLE("lru_hash", struct px_tuple, u64, px_tuples, PX_MAX_CONNS);
BPF_HASH(px_accept_args, u64, u64, 16384);
#endif

// Tracing was paused since the connection's last event: user space resynchronises.
static __always_inline void px_conn_epoch(struct px_conn *c) {
    u32 ep = px_epoch();
    if (c->epoch != ep) {
        c->epoch = ep;
        c->lost = 1;
        c->sf_left = 0;
        // HTTP/2 cannot be framed again mid-stream (HPACK state): user space gives the
        // connection up after a pause, so nothing more is copied for it (proto/http2.h)
        if (c->h2 & PX_H2_ON)
            c->h2 |= PX_H2_DEAD;
    }
}

// A write of ``len`` bytes to a followed socket, started at ``t``: the sequence range it
// queued (tcp_sock.write_seq after it, less its length), kept among the connection's last
// PX_MARKS for the wait of a retransmission of those bytes (tcp.h px_rtx_wait). ``fin``:
// the close, whose FIN takes one sequence number at write_seq (marked before tcp_send_fin
// queues it).
static __always_inline void px_rtx_mark(struct px_conn *c, u64 sk, u32 len, u32 fin, u64 t) {
#ifdef PX_RTX_DATA_WAIT
    u32 end = 0;
    if (bpf_probe_read_kernel(&end, sizeof(end), (void *)(sk + PX_OFF_RTX_WRITE_SEQ)))
        return;
    u32 i = c->mk_i & (PX_MARKS - 1);
    c->mk_start[i] = end - len;
    c->mk_end[i] = end + fin;
    c->mk_us[i] = (u32)(t / 1000);
    c->mk_i = i + 1;
#endif
}

// The app closed a followed connection (its entry is about to be deleted): the socket may
// still retransmit its last bytes and its FIN, so the entry is kept in px_tails until the
// socket's end (tcp.h px_tail_end), where EV_TAIL gives user space the final counts.
static __always_inline void px_tail_keep(u64 sk, struct px_conn *c, u64 t) {
    px_rtx_mark(c, sk, 0, 1, t);
    px_tails.update(&sk, c);
}

// A new entry for a connection the agent did not see start (seeded from /proc, or seen at
// a segment with data): first seen now, in this epoch. (Its ports and family are set after
// this call: read before it, they would live across its helper calls.)
static __always_inline void px_conn_stamp(struct px_conn *nc) {
    nc->ident = bpf_ktime_get_ns();
    nc->epoch = px_epoch();
    nc->arr_epoch = nc->epoch;
}

// A read with data by a traced process on a socket with no entry: if it is a TCP connection
// still open both ways (ESTABLISHED, or CLOSE_WAIT: the peer's FIN after its data) on a port
// a listener holds (an accepted one), the agent missed its start or lost its entry —
// px_conns full (LRU: the least recently used goes), or a state change the kernel skipped —
// and its requests go unrecorded: counted (C_UNFOLLOWED), so that the loss is never silent.
// (After the server's own shutdown or close the entry is gone by design: nginx's lingering
// close reads and drops what the client still sends.) Only on this miss path (a traced
// process's other sockets: outbound, unix), three loads. Where the socket's offsets are not
// known (no BTF), not counted, and the metric not served.
static __always_inline void px_unfollowed_read(u64 sk) {
#ifdef PX_STATE_BTF
    u16 proto = 0, num = 0;
    u8 state = 0;
    if (bpf_probe_read_kernel(&proto, sizeof(proto), (void *)(sk + PX_OFF_SK_PROTOCOL)) ||
        proto != PX_IPPROTO_TCP)
        return;
    if (bpf_probe_read_kernel(&state, sizeof(state), (void *)(sk + PX_OFF_SKC_STATE)) ||
        (state != TCP_ESTABLISHED && state != TCP_CLOSE_WAIT))
        return;
    if (bpf_probe_read_kernel(&num, sizeof(num), (void *)(sk + PX_OFF_SKC_NUM)) ||
        !px_port_ok(num))
        return;
    u32 k = num;
    u32 *n = px_listen.lookup(&k);
    if (n && *n)
        px_count(C_UNFOLLOWED);
#endif
}

static __always_inline struct px_conn *px_conn_for(u64 id, u32 fd, u64 sk) {
    struct px_conn *c = px_conns.lookup(&sk);
    u64 key = (id & 0xffffffff00000000ULL) | fd;
    if (c && c->fdkey == key) {  // the common case: one hash lookup per event
        px_conn_epoch(c);
        return c;
    }
    struct px_fd *f = px_fds.lookup(&key);
    if (!c) {
        // A connection older than the agent: seeded from /proc by user space.
        if (!f || !f->seeded || !px_port_ok(f->lport))
            return 0;
#ifdef PX_OFF_SKC_NUM
        // Its close is not seen on the socket path: a seeded fd may since name another
        // socket (an outbound connection, a unix socket). The local port tells.
        u16 num = 0;
        if (bpf_probe_read_kernel(&num, sizeof(num), (void *)(sk + PX_OFF_SKC_NUM)) ||
            num != f->lport) {
            px_fds.delete(&key);
            return 0;
        }
#endif
        struct px_conn nc = {};
        px_conn_stamp(&nc);
        nc.lport = f->lport;
        nc.rport = f->rport;
        nc.family = f->family;
        __builtin_memcpy(nc.laddr, f->laddr, 16);
        __builtin_memcpy(nc.raddr, f->raddr, 16);
        nc.tgid = id >> 32;
        px_conns.update(&sk, &nc);
        c = px_conns.lookup(&sk);
        if (!c)
            return 0;
        px_count(C_CONNS);
    }
    if (!f) {
        struct px_fd nf = {};
        nf.sk = sk;
        px_fds.update(&key, &nf);
    } else if (f->sk != sk) {
        if (f->t_acc && !c->t_acc && f->sk == 0)
            c->t_acc = f->t_acc;
        f->sk = sk;
    }
    c->tgid = id >> 32;
    c->fdkey = key;
    px_conn_epoch(c);
    return c;
}
