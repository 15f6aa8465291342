// Parallax agent: kernel side (bcc C; tracepoints and a libc uretprobe, no kprobes; no
// header-derived kernel struct: the socket and task fields read directly have their offsets
// from the running kernel's BTF, PX_OFF_*).
//
// The loader defines, with -D:
//   PX_HEAD_WINDOW   request bytes captured per read (power of two, 256..16384)
//   PX_RESP_WINDOW   bytes captured from a write that starts a response ("HTTP/")
//   PX_MAX_CONNS     size of the connection LRU maps
//   PX_HAVE_<TP>     one per optional tracepoint the running kernel has (fields checked)
//   PX_SOCK_HOOKS    the default on x86-64 from Linux 6.3: no syscall tracepoint at all
//   PX_RAW_SYSCALLS  else: raw_syscalls:sys_enter/exit (x86-64), else per-syscall ones
//   PX_OFF_TCP_SRTT, PX_OFF_SKC_NUM  tcp_sock.srtt_us, sock_common.skc_num (from BTF)
//   PX_OFF_TASK_TGID, PX_OFF_TASK_PID  task_struct.tgid, .pid (from BTF; direct loads)
//   PX_SDR_BTF       compile px_sdr_btf, sk_data_ready as a BTF tracepoint (agent/tpbtf.py)
//   C_<COUNTER>      the px_counters indices (agent/loader.py COUNTERS)
//
// Flow with PX_SOCK_HOOKS (see docs/agent.md):
//   sock_recv_length / sock_send_length (inside the read or write, traced tgid only): the
//     socket, the length, and the syscall's own arguments from the task's user pt_regs
//     (fd, buffer) -> READ event with the request head; a write starting "HTTP/" -> RESP
//     event; other writes are aggregated per connection in px_aggs (first 256 timestamps,
//     then counts and sums) and flushed as one WAGG event at the next boundary (a read
//     with data, the next response, close, the chunked terminator, the stream limit).
//   tcp_sendmsg_locked: the time a write starts (before the copy).
//   libc accept()/accept4() return (uretprobe): the new fd and t_acc.
//   Syscall tracepoints are never attached: once one is, every syscall of every task on
//   the node takes the kernel's slow path (a 1-byte dd measured 1.3-1.6x slower).
// Without it, a syscall's entry records {fd, buf, kind} in px_active[thread], the
// sock_*_length tracepoints link the socket, and its exit does the above.
//   softirq tracepoints (handshake, data arrival, srtt, retransmits) are keyed by the socket
//   address, never by pid: they run with whatever task is on the CPU.

#define PX_CHUNKS 256
// Bytes read at once from the start of every body write (see px_on_write_conn).
#define PX_PEEK (PX_RESP_WINDOW < 256 ? PX_RESP_WINDOW : 256)
#define PX_AF_INET 2
#define PX_IPPROTO_TCP 6
#define EV_READ 1
#define EV_RESP 2
#define EV_WAGG 3
#define EV_CLOSE 4
#define EV_PEER_FIN 5
#define EV_SOCK_CLOSE 6  // the socket closed without a close() we saw (process killed, exit)

#define KIND_READ 1
#define KIND_WRITE 2
#define KIND_SENDFILE 3
#define KIND_ACCEPT 4  // raw path only: accept()/accept4() in flight (buf: the peer sockaddr)
#define KIND_SENDFILE_CONT 5  // a later piece of the same sendfile(): bytes, not a new chunk

#define IOV_NONE 0
#define IOV_VEC 1
#define IOV_MSG 2

#define WAGG_END 1      // chunked terminator seen: the response is complete
#define WAGG_PARTIAL 2  // stream-length limit reached: more follows
#define WAGG_CLOSE 4    // flushed because the connection closed

// counters (px_counters index): C_LOST, C_CONNS, C_CONNS_DEL (px_conns entries deleted:
// fill = C_CONNS - C_CONNS_DEL), C_AGGS, C_AGGS_DEL (px_aggs entries created, deleted),
// C_SOCK_CLOSE (connections ended by the socket's own state change, no close()),
// C_LISTEN_CHG (listening sockets opened or closed: user space rescans /proc then),
// C_SHED_READS (reads with data by traced processes while paused, over the CPU budget),
// C_BLOCKING (followed connections whose socket blocks on writes: no O_NONBLOCK) and
// C_NCOUNTERS are defined by the loader from its one list (agent/loader.py COUNTERS).

// Chunk offsets are u32 microseconds (~71 min): an aggregate spanning more is flushed
// (without a flag: user space merges it into the same response) before it could wrap.
#ifndef PX_OFFS_SPAN_NS
#define PX_OFFS_SPAN_NS 3600000000000ULL
#endif

// All-zero (as between attach and user space's first write) means "trace nothing": bcc
// attaches the programs before the agent can fill its maps, and a filter that defaulted to
// off would follow every process on the node for those milliseconds.
#define PX_CFG_PORTS 8
struct px_cfg {
    u32 all_pids;   // 1: every process (no --pid/--port given)
    u32 all_ports;  // 1: every local port (no --port given)
    u64 stream_limit_ns;
    u32 paused;  // trace nothing until the agent clears it: 1 set by the agent, 2 by a full ring
    // Incremented by the agent at each resume. State written before it (a connection's
    // framing, its pending arrival, a thread's write start) is stale after a pause: the
    // paused path does no work at all, so staleness is found by the epoch instead.
    u32 epoch;
    // 1 once px_send_start is attached. Only a blocking write needs its start stamped, and
    // event-loop servers never make one: with the socket's file flags readable (BTF) the
    // agent attaches that hook only after a followed connection turns out to block.
    u32 send_start;
    // The traced local ports when there are at most PX_CFG_PORTS of them (else 0: see
    // px_ports): sk_data_ready compares a socket's port with them on this line, which
    // every program reads anyway, instead of looking the socket up.
    u32 nports;
    u16 ports[PX_CFG_PORTS];
};

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
};

struct px_agg {
    u64 t_first;
    u64 t_last;
    u64 bytes;
    u64 gap_max_ns;
    u32 n;
    u32 flags;
    u32 offs_us[PX_CHUNKS];
};

struct px_hdr {
    u32 type;
    u32 tgid;
    u32 pid;
    u32 fd;
    u64 sk;
    u64 ident;
    u64 t;
    u32 srtt_us;
    u32 retrans;
    u32 lost;  // events of this connection were lost before this one: user space resyncs
    u32 pad;
};

struct px_ev_read {
    struct px_hdr h;
    u64 t_est;
    u64 t_acc;
    u64 t_arr;
    u32 n;
    u32 caplen;
    u16 lport;
    u16 rport;
    u16 family;
    u16 pad;
    u8 laddr[16];
    u8 raddr[16];
    u8 data[PX_HEAD_WINDOW];
};

struct px_ev_resp {
    struct px_hdr h;
    u32 n;
    u32 caplen;
    u8 data[PX_RESP_WINDOW];
};

struct px_ev_wagg {
    struct px_hdr h;
    struct px_agg a;
};

BPF_ARRAY(px_config, struct px_cfg, 1);
// Traced tgids as a flat array indexed by tgid: the verifier inlines array lookups, so an
// untraced process pays a load and a compare per hook, not a hash helper call.
BPF_ARRAY(px_pids, u8, PX_PID_MAX);
BPF_ARRAY(px_ports, u8, 65536);  // traced local ports: an inlined lookup, like px_pids
// Listening sockets per local port (kept by inet_sock_set_state, seeded from /proc): only
// server-side connections are followed, never a traced process's outbound ones.
BPF_ARRAY(px_listen, u32, 65536);
#ifdef PX_TASK_STORAGE
// The syscall in flight, per thread: task-local storage (a pointer in the task, no hash)
BPF_TASK_STORAGE(px_active, struct px_active);
#else
BPF_HASH(px_active, u64, struct px_active, 16384);
#endif
BPF_TABLE("lru_hash", u64, struct px_fd, px_fds, PX_MAX_CONNS);
BPF_TABLE("lru_hash", u64, struct px_conn, px_conns, PX_MAX_CONNS);
BPF_TABLE("lru_hash", u64, struct px_agg, px_aggs, PX_MAX_CONNS);
BPF_PERCPU_ARRAY(px_counters, u64, C_NCOUNTERS);
BPF_PERCPU_ARRAY(px_scratch_read, struct px_ev_read, 1);
BPF_PERCPU_ARRAY(px_scratch_resp, struct px_ev_resp, 1);
BPF_PERCPU_ARRAY(px_agg_zero, struct px_agg, 1);  // never written: the zero value for inits
BPF_HASH(px_synack, u16, u64, 256);

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
#endif  // SYN-ACK retransmits per listening port
BPF_RINGBUF_OUTPUT(px_events, PX_RINGBUF_PAGES);

struct px_iovec {
    u64 base;
    u64 len;
};

struct px_msghdr {
    u64 name;
    u32 namelen;
    u32 pad;
    u64 iov;
    u64 iovlen;
};

static __always_inline void px_count(u32 idx) {
    u64 *v = px_counters.lookup(&idx);
    if (v)
        *v += 1;
}

static __always_inline struct px_cfg *px_cfg_get(void) {
    u32 zero = 0;
    return px_config.lookup(&zero);
}

static __always_inline u32 px_epoch(void) {
    struct px_cfg *cfg = px_cfg_get();
    return cfg ? cfg->epoch : 0;
}

static __always_inline int px_pid_on(struct px_cfg *cfg, u32 tgid) {
    if (cfg->all_pids)
        return 1;
    u8 *v = px_pids.lookup(&tgid);
    return v && *v;
}

// The earliest exit: two inlined array lookups for an untraced process.
static __always_inline int px_traced(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;
    return px_pid_on(cfg, tgid);
}

// A process we trace while tracing is paused (the agent shedding load).
static __always_inline int px_shed(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || !cfg->paused)
        return 0;
    return px_pid_on(cfg, tgid);
}

// A process we trace, paused or not (process exit must be seen either way).
static __always_inline int px_followed(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    return cfg && px_pid_on(cfg, tgid);
}

static __always_inline int px_port_ok(u16 lport) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg)
        return 0;
    if (cfg->all_ports)
        return 1;
    u32 k = lport;
    u8 *v = px_ports.lookup(&k);
    return v && *v;
}

// The caller has checked px_traced(id >> 32).
static __always_inline void px_enter_id(u64 id, u32 fd, u64 buf, u8 kind, u8 iov, u64 vlen) {
    u64 sk = 0;
#ifdef PX_LINK_BY_TUPLE
    if (kind != KIND_ACCEPT) {
        u64 key = (id & 0xffffffff00000000ULL) | fd;
        struct px_fd *f = px_fds.lookup(&key);
        if (!f || !f->sk)
            return;
        sk = f->sk;
    }
#endif
#ifdef PX_TASK_STORAGE
    struct px_active *ap = px_active.task_storage_get(
        (struct task_struct *)bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!ap)
        return;
#else
    struct px_active a = {};
    struct px_active *ap = &a;
#endif
    ap->busy = 1;
    ap->sk = sk;
    ap->fd = fd;
    ap->buf = buf;
    ap->kind = kind;
    ap->iov = iov;
    ap->vlen = vlen > 0xffff ? 0xffff : vlen;
#ifndef PX_TASK_STORAGE
    px_active.update(&id, &a);
#endif
}

static __always_inline void px_enter(u32 fd, u64 buf, u8 kind, u8 iov, u64 vlen) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    px_enter_id(id, fd, buf, kind, iov, vlen);
}

static __always_inline struct px_active *px_active_get(u64 id) {
#ifdef PX_TASK_STORAGE
    return px_active.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, 0);
#else
    return px_active.lookup(&id);
#endif
}

// A thread's write state from before a pause is stale (its write ended unseen).
// A socket read of a traced process while tracing is paused: with data, on a followed
// connection, a request not traced (counted). Nothing else is done while paused — what
// goes stale meanwhile is recognised by px_cfg.epoch afterwards.
static __always_inline void px_paused_read(u64 sk, long ret) {
    if (ret > 0 && px_conns.lookup(&sk))
        px_count(C_SHED_READS);
}

static __always_inline void px_link(void *sk, long ret, int is_read) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32)) {
        if (is_read && px_shed(id >> 32))
            px_paused_read((u64)sk, ret);
        return;
    }
    struct px_active *a = px_active_get(id);
    if (a && a->busy)
        a->sk = (u64)sk;
}

// min(n, seglen, cap) bounded where the verifier sees it: it loses a plain clamp (clang
// folds the two), so the value is pinned in a register and bounded again.
static __always_inline u64 px_clamp(u64 n, u64 seglen, u64 cap) {
    if (n > seglen)
        n = seglen;
    if (n > cap)
        n = cap;
    asm volatile("" : "+r"(n));
    if (n > cap)
        n = cap;
    return n;
}

// Resolve the user buffer of the syscall's first segment and its length.
static __always_inline u64 px_first_buf(struct px_active *a, u64 *seglen) {
    if (a->iov == IOV_NONE) {
        *seglen = (u64)-1;
        return a->buf;
    }
    u64 vec = a->buf;
    if (a->iov == IOV_MSG) {
        struct px_msghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf))
            return 0;
        vec = m.iov;
    }
    struct px_iovec v = {};
    if (bpf_probe_read_user(&v, sizeof(v), (void *)vec))
        return 0;
    *seglen = v.len;
    return v.base;
}

// The last segment of a write (its end is where a chunked terminator would be).
static __always_inline u64 px_last_buf(struct px_active *a, long ret, u64 *seglen) {
    if (a->iov == IOV_NONE) {
        *seglen = ret;
        return a->buf;
    }
    u64 vec = a->buf;
    u64 n = a->vlen;
    if (a->iov == IOV_MSG) {
        struct px_msghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf))
            return 0;
        vec = m.iov;
        n = m.iovlen;
    }
    if (n == 0 || n > 1024)
        return 0;
    struct px_iovec v = {};
    if (bpf_probe_read_user(&v, sizeof(v), (void *)(vec + (n - 1) * sizeof(struct px_iovec))))
        return 0;
    *seglen = v.len;
    return v.base;
}

static __always_inline void px_hdr_fill(struct px_hdr *h, u32 type, u64 id, u32 fd, u64 sk,
                                         struct px_conn *c, u64 t) {
    h->type = type;
    h->tgid = id >> 32;
    h->pid = (u32)id;
    h->fd = fd;
    h->sk = sk;
    h->ident = c ? c->ident : 0;
    h->t = t;
    h->srtt_us = c ? c->srtt_us : 0;
    h->retrans = c ? c->retrans : 0;
    h->lost = 0;
    if (c) {
        h->lost = c->lost;
        c->lost = 0;  // set again by px_lost if this event fails too
    }
}

// A ring-buffer failure: counted, and remembered on the connection so that its next event
// tells user space its framing can no longer be trusted.
static __always_inline void px_lost(struct px_conn *c) {
    px_count(C_LOST);
    if (c)
        c->lost = 1;
    // The ring is full: whatever the programs build from now on is thrown away too. Pause
    // at once (2: paused by the kernel) rather than when the agent next gets the CPU; the
    // agent holds the pause, drains, and clears it.
    struct px_cfg *cfg = px_cfg_get();
    if (cfg && !cfg->paused)
        cfg->paused = 2;
}

static __always_inline void px_flush(u64 id, u32 fd, u64 sk, struct px_conn *c, u64 t,
                                      u32 extra_flags) {
    if (!c || !c->agg_pending)
        return;
    c->agg_pending = 0;
    struct px_agg *a = px_aggs.lookup(&sk);
    if (!a || a->t_last == 0)
        return;
    struct px_ev_wagg *e = px_events.ringbuf_reserve(sizeof(struct px_ev_wagg));
    if (!e) {
        px_lost(c);
    } else {
        px_hdr_fill(&e->h, EV_WAGG, id, fd, sk, c, t);
        bpf_probe_read_kernel(&e->a, sizeof(struct px_agg), a);  // too big for an inline memcpy
        e->a.flags |= extra_flags;
        px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    a->n = 0;
    a->bytes = 0;
    a->flags = 0;
    a->gap_max_ns = 0;
    a->t_first = 0;
    a->t_last = 0;
}

static __always_inline struct px_conn *px_conn_for(u64 id, u32 fd, u64 sk) {
    struct px_conn *c = px_conns.lookup(&sk);
    u64 key = (id & 0xffffffff00000000ULL) | fd;
    if (c && c->fdkey == key) {  // the common case: one hash lookup per event
        u32 ep = px_epoch();
        if (c->epoch != ep) {
            c->epoch = ep;
            c->lost = 1;
            c->sf_left = 0;
        }
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
        nc.ident = bpf_ktime_get_ns();
        nc.epoch = px_epoch();
        nc.arr_epoch = nc.epoch;
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
    u32 ep = px_epoch();
    if (c->epoch != ep) {
        c->epoch = ep;
        c->lost = 1;  // tracing was paused since its last event: user space resynchronises
        c->sf_left = 0;
    }
    return c;
}

// The end of a connection: flush the aggregate, emit CLOSE, free its map entries.
static __always_inline void px_conn_end(u64 id, u32 fd, u64 sk, struct px_conn *c, u64 t) {
    px_flush(id, fd, sk, c, t, WAGG_CLOSE);
    struct px_hdr *e = px_events.ringbuf_reserve(sizeof(struct px_hdr));
    if (!e) {
        px_lost(c);
    } else {
        px_hdr_fill(e, EV_CLOSE, id, fd, sk, c, t);
        px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    if (px_conns.delete(&sk) == 0)
        px_count(C_CONNS_DEL);
    if (px_aggs.delete(&sk) == 0)
        px_count(C_AGGS_DEL);
}

static __always_inline void px_on_read(struct px_active *a, u64 id, long ret, u64 t) {
    u64 sk = a->sk;
    struct px_conn *c = px_conn_for(id, a->fd, sk);
    if (!c)
        return;
#ifdef PX_OFF_TCP_SRTT
    // tcp_sock.srtt_us (microseconds << 3) at its offset in the running kernel's BTF: one
    // read per request instead of tcp_probe on every segment of every socket on the node
    u32 srtt8 = 0;
    if (ret > 0 && bpf_probe_read_kernel(&srtt8, sizeof(srtt8), (void *)(sk + PX_OFF_TCP_SRTT)) == 0)
        c->srtt_us = srtt8 >> 3;
#endif
    if (ret <= 0) {
        if (ret == 0)
            c->t_arr = 0;  // the FIN's sk_data_ready: no request arrived
        return;
    }
    px_flush(id, a->fd, sk, c, t, 0);
    u32 zero = 0;
    struct px_ev_read *e = px_scratch_read.lookup(&zero);
    if (!e)
        return;
    px_hdr_fill(&e->h, EV_READ, id, a->fd, sk, c, t);
    e->t_est = c->t_est;
    e->t_acc = c->t_acc;
    e->t_arr = c->arr_epoch == c->epoch ? c->t_arr : 0;  // not stamped before a pause
    c->t_arr = 0;
    e->n = ret;
    e->lport = c->lport;
    e->rport = c->rport;
    e->family = c->family;
    __builtin_memcpy(e->laddr, c->laddr, 16);
    __builtin_memcpy(e->raddr, c->raddr, 16);
    u64 seglen = 0;
    u64 buf = px_first_buf(a, &seglen);
    u64 len = px_clamp(ret, seglen, PX_HEAD_WINDOW);
    e->caplen = 0;
    if (buf && len > 0 && bpf_probe_read_user(e->data, len, (void *)buf) == 0)
        e->caplen = len;
    u64 size = sizeof(struct px_ev_read) - PX_HEAD_WINDOW + e->caplen;
    asm volatile("" : "+r"(size));
    if (size > sizeof(struct px_ev_read))
        size = sizeof(struct px_ev_read);
    if (px_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP))
        px_lost(c);
}

// t: when the write began (a chunk's time); t_done: when it returned (the end of a
// response is its last write's return: a blocking write can last seconds).
static __always_inline void px_on_write_conn(struct px_active *a, struct px_conn *c, u64 id,
                                             long ret, u64 t, u64 t_done) {
    if (ret <= 0)
        return;
    u64 sk = a->sk;
    u32 zero = 0;
    struct px_ev_resp *e = px_scratch_resp.lookup(&zero);
    if (!e)
        return;
    // One read of the write's first bytes serves every check below — the response-head
    // test, the WebSocket opcode, and for a short single-buffer write (a streamed token)
    // its chunked terminator — and is the captured head when that fits: a helper call
    // and the kernel's usercopy checks fewer per write.
    u64 seglen = 0;
    u64 buf = 0;
    u64 peek = 0;
    if (a->kind != KIND_SENDFILE && a->kind != KIND_SENDFILE_CONT) {
        buf = px_first_buf(a, &seglen);
        peek = px_clamp(ret, seglen, PX_PEEK);
        if (!buf || peek == 0 || bpf_probe_read_user(e->data, peek, (void *)buf))
            peek = 0;
    }
    u8 *head = e->data;
    if (peek >= 12 && head[0] == 'H' && head[1] == 'T' && head[2] == 'T' && head[3] == 'P' &&
        head[4] == '/') {
        // "HTTP/1.x 101": from now on the server writes WebSocket frames
        c->ws = head[9] == '1' && head[10] == '0' && head[11] == '1';
        px_flush(id, a->fd, sk, c, t, 0);
        px_hdr_fill(&e->h, EV_RESP, id, a->fd, sk, c, t);
        e->n = ret;
        u64 len = px_clamp(ret, seglen, PX_RESP_WINDOW);
        e->caplen = peek;
        if (len > peek) {  // a head longer than the peek: read it whole
            if (bpf_probe_read_user(e->data, len, (void *)buf) == 0)
                e->caplen = len;
        }
        u64 size = sizeof(struct px_ev_resp) - PX_RESP_WINDOW + e->caplen;
        asm volatile("" : "+r"(size));
        if (size > sizeof(struct px_ev_resp))
            size = sizeof(struct px_ev_resp);
        if (px_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP))
            px_lost(c);
        return;
    }
    // WebSocket control frames (close, ping, pong: opcodes 8-10) carry no tokens; counted,
    // a keepalive ping would stretch whichever exchange it follows to the idle time.
    if (c->ws && peek >= 2 && (head[0] & 0x0f) >= 8)
        return;
    struct px_agg *g = px_aggs.lookup(&sk);
    if (!g) {
        u32 zero = 0;
        struct px_agg *z = px_agg_zero.lookup(&zero);
        if (!z)
            return;
        px_aggs.update(&sk, z);
        g = px_aggs.lookup(&sk);
        if (!g)
            return;
        px_count(C_AGGS);
    }
    if (a->kind == KIND_SENDFILE_CONT && g->n > 0) {
        g->bytes += ret;
        g->t_last = t_done;
        c->agg_pending = 1;
        return;
    }
    // u32 µs offsets would wrap past ~71 min of one aggregate: flush what it holds first
    // (no flag: the same response continues) so offsets restart from this write.
    if (g->t_first && t - g->t_first >= PX_OFFS_SPAN_NS) {
        px_flush(id, a->fd, sk, c, t, 0);
    }
    // Chunked terminator at the end of this write: the response is complete now. A write
    // that is only the terminator ends the response but carries no body (not a chunk).
    u32 flags = 0;
    u64 lastlen = 0;
    u64 last = 0;
    if (a->iov == IOV_NONE && peek == (u64)ret && peek >= 5) {
        // the whole write was peeked: its last five bytes are in hand
        u64 off = peek - 5;
        asm volatile("" : "+r"(off));
        if (off <= PX_PEEK - 5 && head[off] == '0' && head[off + 1] == '\r' &&
            head[off + 2] == '\n' && head[off + 3] == '\r' && head[off + 4] == '\n')
            flags = WAGG_END;
    } else if (a->kind < KIND_SENDFILE) {
        last = px_last_buf(a, ret, &lastlen);
    }
    if (last && lastlen >= 5) {
        char tail[5] = {};
        u64 off = lastlen - 5;
        asm volatile("" : "+r"(off));
        if (bpf_probe_read_user(tail, 5, (void *)(last + off)) == 0 && tail[0] == '0' &&
            tail[1] == '\r' && tail[2] == '\n' && tail[3] == '\r' && tail[4] == '\n')
            flags = WAGG_END;
    }
    int pure_end = flags == WAGG_END && ret == 5;
    if (g->t_first == 0)
        g->t_first = t;
    if (!pure_end) {
        if (g->n > 0 && t - g->t_last > g->gap_max_ns)
            g->gap_max_ns = t - g->t_last;
        u32 i = g->n;
        if (i < PX_CHUNKS)
            g->offs_us[i & (PX_CHUNKS - 1)] = (t - g->t_first) / 1000;
        g->n = i + 1;
    }
    g->bytes += ret;
    g->t_last = t_done;
    c->agg_pending = 1;
    struct px_cfg *cfg = px_cfg_get();
    if (!flags && cfg && cfg->stream_limit_ns && t - g->t_first >= cfg->stream_limit_ns)
        flags = WAGG_PARTIAL;
    if (flags)
        px_flush(id, a->fd, sk, c, t, flags);
}

static __always_inline void px_on_write(struct px_active *a, u64 id, long ret, u64 t,
                                        u64 t_done) {
    if (ret <= 0)
        return;
    struct px_conn *c = px_conn_for(id, a->fd, a->sk);
    if (c)
        px_on_write_conn(a, c, id, ret, t, t_done);
}

// The exit of a read/write syscall whose entry recorded *ap (busy).
static __always_inline void px_exit_active(struct px_active *ap, u64 id, long ret) {
    struct px_active a = *ap;
#ifdef PX_TASK_STORAGE
    ap->busy = 0;
#else
    px_active.delete(&id);
#endif
    if (!a.sk)
        return;  // not a socket (or the link tracepoints are missing)
    if (ret < 0)
        return;  // EAGAIN (a server's read after each request) and errors: no lookup
    u64 t = bpf_ktime_get_ns();
    if (a.kind == KIND_READ)
        px_on_read(&a, id, ret, t);
    else
        px_on_write(&a, id, ret, t, t);
}

static __always_inline void px_exit(long ret) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;  // before the hash lookup: untraced processes stop here
    struct px_active *ap = px_active_get(id);
    if (!ap || !ap->busy)
        return;
    px_exit_active(ap, id, ret);
}

// x86-64 syscall numbers, and the user pt_regs layout, fixed by the syscall entry code and
// the ptrace ABI (not a header-derived kernel struct): r10 at 56, ax 80, dx, si, di at
// 96..119, orig_ax 120. Used by the raw syscall path and by PX_SOCK_HOOKS (the loader
// enables both on x86-64 only). A 32-bit (compat) task's syscall numbers differ: such
// processes are not followed correctly on these paths.
#define PX_NR_READ 0
#define PX_NR_WRITE 1
#define PX_NR_CLOSE 3
#define PX_NR_READV 19
#define PX_NR_WRITEV 20
#define PX_NR_SENDFILE 40
#define PX_NR_ACCEPT 43
#define PX_NR_SENDTO 44
#define PX_NR_RECVFROM 45
#define PX_NR_SENDMSG 46
#define PX_NR_RECVMSG 47
#define PX_NR_ACCEPT4 288
#define PX_REGS_R10 56
#define PX_REGS_AX 80
#define PX_REGS_DX 96
#define PX_REGS_ORIG_AX 120

// The user registers of the syscall in progress, dx (offset 96) to orig_ax (120): its third,
// second and first arguments, and its number.
struct px_uregs {
    u64 dx, si, di, orig_ax;
};

// How a followed read or write syscall passes its buffer: IOV_NONE, IOV_VEC, IOV_MSG; -1 for
// any other syscall (one mapping for the raw syscall path and the socket hooks).
static __always_inline int px_iov_of(u64 nr) {
    if (nr == PX_NR_READ || nr == PX_NR_RECVFROM || nr == PX_NR_WRITE || nr == PX_NR_SENDTO)
        return IOV_NONE;
    if (nr == PX_NR_READV || nr == PX_NR_WRITEV)
        return IOV_VEC;
    if (nr == PX_NR_RECVMSG || nr == PX_NR_SENDMSG)
        return IOV_MSG;
    return -1;
}

static __always_inline int px_nr_reads(u64 nr) {
    return nr == PX_NR_READ || nr == PX_NR_RECVFROM || nr == PX_NR_READV ||
           nr == PX_NR_RECVMSG;
}

// ---- syscalls ---------------------------------------------------------------------

static __always_inline void px_accept_exit(long ret) {
    if (ret < 0)
        return;
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    u64 key = (id & 0xffffffff00000000ULL) | (u32)ret;
    struct px_fd f = {};
    f.t_acc = bpf_ktime_get_ns();
#ifdef PX_LINK_BY_TUPLE
    u64 *up = px_accept_args.lookup(&id);
    if (up) {
        u64 uaddr = *up;
        px_accept_args.delete(&id);
        u8 sa[24] = {};
        if (uaddr && bpf_probe_read_user(sa, sizeof(sa), (void *)uaddr) == 0) {
            struct px_tuple tk = {};
            u16 fam = sa[0] | (sa[1] << 8);
            tk.rport = (sa[2] << 8) | sa[3];  // network order in the sockaddr
            if (fam == PX_AF_INET)
                __builtin_memcpy(tk.raddr, &sa[4], 4);
            else
                __builtin_memcpy(tk.raddr, &sa[8], 16);
            u64 *skp = px_tuples.lookup(&tk);
            if (skp) {
                f.sk = *skp;
                px_tuples.delete(&tk);
                struct px_conn *c = px_conns.lookup(skp);
                if (c && !c->t_acc)
                    c->t_acc = f.t_acc;
            }
        }
    }
#endif
    px_fds.update(&key, &f);
}

#ifdef PX_LINK_BY_TUPLE
static __always_inline void px_accept_enter(u64 uaddr) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    px_accept_args.update(&id, &uaddr);
}
#endif

#ifndef PX_SOCK_HOOKS
#ifndef PX_RAW_SYSCALLS
#ifdef PX_LINK_BY_TUPLE
#ifdef PX_HAVE_SYS_ENTER_ACCEPT4
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) {
    px_accept_enter((u64)args->upeer_sockaddr);
    return 0;
}
#endif
#ifdef PX_HAVE_SYS_ENTER_ACCEPT
TRACEPOINT_PROBE(syscalls, sys_enter_accept) {
    px_accept_enter((u64)args->upeer_sockaddr);
    return 0;
}
#endif
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { px_accept_exit(args->ret); return 0; }
#ifdef PX_HAVE_SYS_EXIT_ACCEPT
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { px_accept_exit(args->ret); return 0; }
#endif

TRACEPOINT_PROBE(syscalls, sys_enter_read) {
    px_enter(args->fd, (u64)args->buf, KIND_READ, IOV_NONE, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_read) { px_exit(args->ret); return 0; }
#ifdef PX_HAVE_SYS_ENTER_READV
TRACEPOINT_PROBE(syscalls, sys_enter_readv) {
    px_enter(args->fd, (u64)args->vec, KIND_READ, IOV_VEC, args->vlen);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { px_exit(args->ret); return 0; }
#endif
#ifdef PX_HAVE_SYS_ENTER_RECVFROM
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) {
    px_enter(args->fd, (u64)args->ubuf, KIND_READ, IOV_NONE, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { px_exit(args->ret); return 0; }
#endif
#ifdef PX_HAVE_SYS_ENTER_RECVMSG
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) {
    px_enter(args->fd, (u64)args->msg, KIND_READ, IOV_MSG, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { px_exit(args->ret); return 0; }
#endif
TRACEPOINT_PROBE(syscalls, sys_enter_write) {
    px_enter(args->fd, (u64)args->buf, KIND_WRITE, IOV_NONE, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_write) { px_exit(args->ret); return 0; }
#ifdef PX_HAVE_SYS_ENTER_WRITEV
TRACEPOINT_PROBE(syscalls, sys_enter_writev) {
    px_enter(args->fd, (u64)args->vec, KIND_WRITE, IOV_VEC, args->vlen);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { px_exit(args->ret); return 0; }
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDTO
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) {
    px_enter(args->fd, (u64)args->buff, KIND_WRITE, IOV_NONE, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { px_exit(args->ret); return 0; }
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDMSG
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) {
    px_enter(args->fd, (u64)args->msg, KIND_WRITE, IOV_MSG, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { px_exit(args->ret); return 0; }
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDFILE64
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) {
    px_enter(args->out_fd, 0, KIND_SENDFILE, IOV_NONE, 0);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { px_exit(args->ret); return 0; }
#endif
#endif  // !PX_RAW_SYSCALLS

static __always_inline void px_close(u32 fd) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    u64 key = (id & 0xffffffff00000000ULL) | fd;
    struct px_fd *f = px_fds.lookup(&key);
    if (!f)
        return;
    u64 sk = f->sk;
    px_fds.delete(&key);
    if (!sk)
        return;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c)
        return;
    px_conn_end(id, fd, sk, c, bpf_ktime_get_ns());
}

#ifdef PX_RAW_SYSCALLS
// raw_syscalls:sys_enter/sys_exit, one program each, switching on the syscall number: the
// kernel builds no per-syscall trace record (that record building is most of what syscall
// tracepoints cost every process on the node). x86-64 only (the loader checks).
RAW_TRACEPOINT_PROBE(sys_enter) {
    // The syscall number first (in the context, no helper call): every other syscall of
    // every task stops at this switch.
    long nr = ctx->args[1];
    switch (nr) {
    case PX_NR_READ: case PX_NR_WRITE: case PX_NR_CLOSE: case PX_NR_READV: case PX_NR_WRITEV:
    case PX_NR_SENDFILE: case PX_NR_SENDTO: case PX_NR_RECVFROM: case PX_NR_SENDMSG:
    case PX_NR_RECVMSG: case PX_NR_ACCEPT: case PX_NR_ACCEPT4:
        break;
    default:
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;
    struct px_uregs r = {};
    if (bpf_probe_read_kernel(&r, sizeof(r), (void *)(ctx->args[0] + PX_REGS_DX)))
        return 0;
    u32 fd = r.di;
    int iov = px_iov_of(nr);
    if (iov >= 0) {  // vlen (dx) is read only for IOV_VEC
        px_enter_id(id, fd, r.si, px_nr_reads(nr) ? KIND_READ : KIND_WRITE, iov, r.dx);
        return 0;
    }
    switch (nr) {
    case PX_NR_SENDFILE:
        px_enter_id(id, fd, 0, KIND_SENDFILE, IOV_NONE, 0);
        break;
    case PX_NR_CLOSE:
        px_close(fd);
        break;
    case PX_NR_ACCEPT: case PX_NR_ACCEPT4:
        // marked in flight like a read/write: the exit then needs no syscall number
#ifdef PX_LINK_BY_TUPLE
        px_accept_enter(r.si);
#endif
        px_enter_id(id, fd, r.si, KIND_ACCEPT, IOV_NONE, 0);
        break;
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;  // untraced tasks: the program call and two inlined array lookups
    // A traced thread: one task-storage lookup; without a syscall of ours in flight (its
    // epoll_wait, its file I/O) that is all — the syscall number is never read here.
    struct px_active *ap = px_active_get(id);
    if (!ap || !ap->busy) {
#ifdef PX_LINK_BY_TUPLE
        // Before Linux 6.3 an accept() that entered before the programs attached must still
        // record its fd (the only fd->socket link there): read the number in that case.
        u64 nr = 0;
        if (bpf_probe_read_kernel(&nr, sizeof(nr), (void *)(ctx->args[0] + PX_REGS_ORIG_AX)))
            return 0;
        if (nr == PX_NR_ACCEPT || nr == PX_NR_ACCEPT4)
            px_accept_exit(ctx->args[1]);
#endif
        return 0;
    }
    if (ap->kind == KIND_ACCEPT) {
        ap->busy = 0;
#ifndef PX_TASK_STORAGE
        px_active.delete(&id);
#endif
        px_accept_exit(ctx->args[1]);
        return 0;
    }
    px_exit_active(ap, id, ctx->args[1]);
    return 0;
}
#else  // per-syscall tracepoints (other architectures, kernels without raw tracepoints)

TRACEPOINT_PROBE(syscalls, sys_enter_close) {
    px_close(args->fd);
    return 0;
}
#endif

// ---- fd <-> socket link (inside the syscall, Linux >= 6.3) ----------------------------

// Measured side by side as raw tracepoints too (no trace record): no better here — their
// classic records are a few fields — so the classic ones stay (docs/agent.md).
#ifdef PX_HAVE_SOCK_RECV_LENGTH
TRACEPOINT_PROBE(sock, sock_recv_length) { px_link(args->sk, args->ret, 1); return 0; }
#endif
#ifdef PX_HAVE_SOCK_SEND_LENGTH
TRACEPOINT_PROBE(sock, sock_send_length) { px_link(args->sk, args->ret, 0); return 0; }
#endif
#else  // PX_SOCK_HOOKS

// ---- PX_SOCK_HOOKS: no syscall tracepoint ----------------------------------------------

#ifdef PX_LAZY_SEND_START
// The socket's file lacks O_NONBLOCK: its writes can wait for buffer space (sk->sk_socket
// ->file->f_flags, offsets from BTF). Read once per connection, at its first write.
static __always_inline int px_blocking(u64 sk) {
    u64 sock = 0, file = 0;
    u32 fl = 0;
    if (bpf_probe_read_kernel(&sock, sizeof(sock), (void *)(sk + PX_OFF_SK_SOCKET)) || !sock)
        return 0;
    if (bpf_probe_read_kernel(&file, sizeof(file), (void *)(sock + PX_OFF_SOCKET_FILE)) ||
        !file)
        return 0;
    if (bpf_probe_read_kernel(&fl, sizeof(fl), (void *)(file + PX_OFF_FILE_FLAGS)))
        return 0;
    return !(fl & 04000);  // O_NONBLOCK
}
#endif

// A write that ended without sending (error, or a path not followed): a start stamped for
// it by tcp_sendmsg_locked must not be taken by the socket's next write. No lookup while
// that hook is not attached (nothing can have been stamped): an event-loop server's
// EAGAIN on a full send buffer is common.
static __always_inline void px_send_abandon(u64 sk) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || !cfg->send_start)
        return;
    struct px_conn *c = px_conns.lookup(&sk);
    if (c)
        c->t_send = 0;
}

// A socket read or write of a traced task, from inside the syscall (process context, so
// the pid is the caller's): the syscall's number and arguments come from its user pt_regs.
static __always_inline void px_sock_io(u64 sk, long ret, int is_read) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
#if defined(PX_OFF_TASK_TGID) && defined(PX_OFF_TASK_PID)
    // task->tgid, task->pid by direct loads (BTF offsets, checked by the verifier): the
    // task pointer serves the pt_regs below too, one helper call fewer per traced event
    u64 id = ((u64)*(u32 *)((u64)task + PX_OFF_TASK_TGID) << 32) |
             *(u32 *)((u64)task + PX_OFF_TASK_PID);
#else
    u64 id = bpf_get_current_pid_tgid();
#endif
    if (!px_traced(id >> 32)) {
        if (is_read && px_shed(id >> 32))
            px_paused_read(sk, ret);
        return;
    }
    if (ret < 0) {
        // EAGAIN (a server's read after each request) and errors. A failed blocking
        // write's start must not become the next write's.
        if (!is_read)
            px_send_abandon(sk);
        return;
    }
    u64 t = bpf_ktime_get_ns();
    u64 regs = (u64)bpf_task_pt_regs(task);
    // A direct load: the verifier knows the pointer (BTF-typed, struct pt_regs) and
    // checks the offsets against the running kernel's BTF; no helper call.
    struct px_uregs r = *(struct px_uregs *)(regs + PX_REGS_DX);
    struct px_active a = {};
    a.sk = sk;
    a.fd = r.di;
    a.buf = r.si;
    a.kind = is_read ? KIND_READ : KIND_WRITE;
    u64 nr = r.orig_ax;
    int iov = px_iov_of(nr);
    if (iov >= 0) {
        a.iov = iov;
        a.vlen = r.dx > 0xffff ? 0xffff : r.dx;  // read only for IOV_VEC
    } else if (nr == PX_NR_SENDFILE && !is_read) {
        a.buf = 0;
        a.kind = KIND_SENDFILE;
    } else {
        if (!is_read)
            px_send_abandon(sk);
        return;  // io_uring, recvmmsg, splice(): not followed (di is no fd there)
    }
    if (is_read) {
        px_on_read(&a, id, ret, t);
        return;
    }
    struct px_conn *c = px_conn_for(id, a.fd, sk);
    if (!c)
        return;
#ifdef PX_LAZY_SEND_START
    if (!c->mode_seen) {
        c->mode_seen = 1;
        struct px_cfg *cfg = px_cfg_get();
        if (cfg && !cfg->send_start && px_blocking(sk))
            px_count(C_BLOCKING);
    }
#endif
    u64 t_done = t;
    if (c->t_send && c->send_epoch == px_epoch())
        t = c->t_send;  // when the write started (tcp_sendmsg_locked), not ended
    c->t_send = 0;
    if (a.kind == KIND_SENDFILE) {
        // One sendfile() reaches the socket in pipe-sized pieces: one chunk, not one each.
        u64 left = 0;
        if (c->sf_left > 0) {
            a.kind = KIND_SENDFILE_CONT;
            left = c->sf_left;
        } else if (bpf_probe_read_kernel(&left, sizeof(left), (void *)(regs + PX_REGS_R10))) {
            left = 0;  // the count argument (r10): unknown, each piece its own chunk
        }
        c->sf_left = left > (u64)ret ? left - ret : 0;
    } else {
        c->sf_left = 0;  // a new write ends any unfinished sendfile()
    }
    px_on_write_conn(&a, c, id, ret, t, t_done);
}

TRACEPOINT_PROBE(sock, sock_recv_length) {
    if (args->flags & 2)
        return 0;  // MSG_PEEK: the bytes stay queued for the real read
    px_sock_io((u64)args->sk, args->ret, 1);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_send_length) {
    px_sock_io((u64)args->sk, args->ret, 0);
    return 0;
}

#ifdef PX_HAVE_TCP_SENDMSG_LOCKED
// The start of a TCP write, before the copy (sock_send_length fires after it, which for a
// write blocked on a full send buffer is much later). It fires again per segment of a long
// write: the first one is kept until sock_send_length takes it. A raw tracepoint (the
// classic record has no socket address) attached by user space, at once or once a
// followed connection blocks (PX_LAZY_SEND_START): every TCP write on the node runs it.
int px_send_start(struct bpf_raw_tracepoint_args *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;
    u64 sk = ctx->args[0];
#ifdef PX_OFF_MSG_FLAGS
    // A non-blocking write (every event-loop server) never waits for buffer space: its end
    // at sock_send_length is its start within microseconds. Only a blocking one is stamped.
    u32 mflags = 0;
    if (bpf_probe_read_kernel(&mflags, sizeof(mflags), (void *)(ctx->args[1] + PX_OFF_MSG_FLAGS)) == 0 &&
        (mflags & 0x40))  // MSG_DONTWAIT
        return 0;
#endif
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c)
        return 0;
    u32 ep = px_epoch();
    if (!c->t_send || c->send_epoch != ep) {
        c->t_send = bpf_ktime_get_ns();
        c->send_epoch = ep;
    }
    return 0;
}
#endif

// libc's accept()/accept4() returning (a uretprobe, attached by user space to each libc file
// the traced processes map): the new fd and t_acc. Servers that do not call accept through
// libc (Go) are still followed; only their accept-queue wait is unknown.
int px_uret_accept(void *ctx) {
    px_accept_exit((long)((u64 *)ctx)[PX_REGS_AX / 8]);
    return 0;
}
#endif  // PX_SOCK_HOOKS

// ---- softirq side: keyed by socket address ----------------------------------------

#define TCP_ESTABLISHED 1
#define TCP_SYN_RECV 3
#define TCP_FIN_WAIT1 4
#define TCP_CLOSE 7
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9
#define TCP_LISTEN 10

// Threads of traced processes that are exiting (sched_process_exit runs before the exit
// closes the files): a reset sent from such a thread is the server's, not the peer's.
BPF_TABLE("lru_hash", u64, u8, px_exiting, 1024);

#ifdef PX_HAVE_SCHED_PROCESS_EXIT
TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_followed(id >> 32))
        return 0;
    u8 one = 1;
    px_exiting.update(&id, &one);
#ifdef PX_HAVE_EXIT_GROUP_DEAD
    if (args->group_dead) {
        // The whole process is gone: stop tracing its tgid now, not at the next /proc
        // rescan (a reused pid must not be traced because a previous owner was).
        u32 tgid = id >> 32;
        u8 zero = 0;
        px_pids.update(&tgid, &zero);
    }
#endif
    return 0;
}
#endif

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != PX_IPPROTO_TCP)
        return 0;
    u64 sk = (u64)args->skaddr;
    int ns = args->newstate;
    int os = args->oldstate;
    if (os == TCP_SYN_RECV && ns == TCP_ESTABLISHED) {
        if (!px_port_ok(args->sport))
            return 0;
        struct px_conn c = {};
        c.t_est = bpf_ktime_get_ns();
        c.epoch = px_epoch();
        c.arr_epoch = c.epoch;
        c.ident = c.t_est;
        c.lport = args->sport;
        c.rport = args->dport;
        c.family = args->family;
        if (args->family == PX_AF_INET) {
            __builtin_memcpy(c.laddr, args->saddr, 4);
            __builtin_memcpy(c.raddr, args->daddr, 4);
        } else {
            __builtin_memcpy(c.laddr, args->saddr_v6, 16);
            __builtin_memcpy(c.raddr, args->daddr_v6, 16);
        }
        px_conns.update(&sk, &c);
        px_count(C_CONNS);
#ifdef PX_LINK_BY_TUPLE
        struct px_tuple tk = {};
        __builtin_memcpy(tk.raddr, c.raddr, 16);
        tk.rport = args->dport;
        px_tuples.update(&tk, &sk);
#endif
        return 0;
    }
    if (ns == TCP_LISTEN || os == TCP_LISTEN) {
        // listening sockets per port: only connections accepted on one are followed
        px_count(C_LISTEN_CHG);
        u32 k = args->sport;
        u32 *n = px_listen.lookup(&k);
        if (n) {
            if (ns == TCP_LISTEN)
                __sync_fetch_and_add(n, 1);
            else if (*n > 0)
                __sync_fetch_and_add(n, -1);
        }
        return 0;
    }
    int peer_fin = ns == TCP_CLOSE_WAIT;
    // Our side's own close transitions: a close() we saw has already ended the connection
    // (sys_enter_close runs first); one still here was closed without it — a process killed
    // or exiting mid-request, or a close by a path we do not trace.
    int closing = (os == TCP_ESTABLISHED && ns == TCP_FIN_WAIT1) ||
                  (os == TCP_CLOSE_WAIT && ns == TCP_LAST_ACK) || ns == TCP_CLOSE;
    if (!peer_fin && !closing)
        return 0;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c)
        return 0;
    u64 t = bpf_ktime_get_ns();
    u64 owner = ((u64)c->tgid) << 32;
    if (ns == TCP_CLOSE && os == TCP_ESTABLISHED) {
        // A reset while established: the peer's (a client that closes with unread data
        // resets instead of sending a FIN) unless an exiting thread of ours sent it.
        u64 id = bpf_get_current_pid_tgid();
        peer_fin = px_exiting.lookup(&id) == 0;
#if defined(PX_SOCK_HOOKS) && defined(PX_HAVE_TCP_RECEIVE_RESET)
        // No close() is seen on this path: a server's abortive close (unread data,
        // SO_LINGER 0) makes this transition too. Only a received reset is the peer's.
        peer_fin = c->peer_rst;
#endif
    }
    if (peer_fin) {
        // The peer is gone: its FIN (CLOSE_WAIT) or its RST.
        struct px_hdr *e = px_events.ringbuf_reserve(sizeof(struct px_hdr));
        if (!e) {
            px_lost(c);
        } else {
            px_hdr_fill(e, EV_PEER_FIN, owner, 0, sk, c, t);
            px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
        }
    }
    if (!closing)
        return 0;
    u32 type = EV_SOCK_CLOSE;
#ifdef PX_SOCK_HOOKS
    // No close() is seen on this path: the app's own close is this transition, unless an
    // exiting thread of the process makes it (a server killed or exiting mid-request).
    u64 cur = bpf_get_current_pid_tgid();
    if (px_exiting.lookup(&cur) == 0)
        type = EV_CLOSE;
#endif
    if (type == EV_SOCK_CLOSE)
        px_count(C_SOCK_CLOSE);
    u64 fdkey = c->fdkey;
    px_flush(owner, (u32)fdkey, sk, c, t, WAGG_CLOSE);
    struct px_hdr *e = px_events.ringbuf_reserve(sizeof(struct px_hdr));
    if (!e) {
        px_lost(c);
    } else {
        px_hdr_fill(e, type, owner, (u32)fdkey, sk, c, t);
        px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
    struct px_fd *f = px_fds.lookup(&fdkey);
    if (f && f->sk == sk)
        px_fds.delete(&fdkey);
    if (px_conns.delete(&sk) == 0)
        px_count(C_CONNS_DEL);
    if (px_aggs.delete(&sk) == 0)
        px_count(C_AGGS_DEL);
    return 0;
}

#ifdef PX_HAVE_SK_DATA_READY
static __always_inline void px_data_ready(u64 sk, struct px_cfg *cfg) {
    struct px_conn *c = px_conns.lookup(&sk);
    if (c && (c->t_arr == 0 || c->arr_epoch != cfg->epoch)) {
        c->t_arr = bpf_ktime_get_ns();
        c->arr_epoch = cfg->epoch;
    }
}

// Attached by bcc; replaced by px_sdr_btf where the kernel loads that (agent/tpbtf.py).
TRACEPOINT_PROBE(sock, sk_data_ready) {
    u64 sk = (u64)args->skaddr;
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;  // nothing while paused (a request read meanwhile is not timed)
    px_data_ready(sk, cfg);
    return 0;
}

#ifdef PX_SDR_BTF
// sk_data_ready as a BTF tracepoint (tp_btf), loaded by agent/tpbtf.py: its socket argument
// is a typed pointer, so the local port is a direct load from the socket's first cache
// line, which the network stack has just used. With at most PX_CFG_PORTS traced ports
// (px_cfg.nports), sockets on other ports — the node's clients, the servers' own outbound
// connections streaming from their backends — stop there, before any map lookup.
int px_sdr_btf(u64 *ctx) {
    u64 sk = ctx[0];
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;
    u32 n = cfg->nports;
    if (n) {
        u16 num = *(u16 *)(sk + PX_OFF_SKC_NUM);
        int hit = 0;
#pragma unroll
        for (int i = 0; i < PX_CFG_PORTS; i++)
            hit |= i < n && cfg->ports[i] == num;
        if (!hit)
            return 0;
    }
    px_data_ready(sk, cfg);
    return 0;
}
#endif
#endif

#if defined(PX_HAVE_TCP_PROBE) && !defined(PX_OFF_TCP_SRTT)
TRACEPOINT_PROBE(tcp, tcp_probe) {
    // the port first (an inlined array lookup): client-side segments stop here
    if (!px_port_ok(args->sport))
        return 0;
    u64 sk = (u64)args->skaddr;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c) {
        // A connection older than the agent, seen at its next segment with data. Only on a
        // listening port: a traced process's outbound connections (to its database, its
        // LLM backend) are not requests it serves.
        if (args->data_len == 0)
            return 0;
        u32 lk = args->sport;
        u32 *ln = px_listen.lookup(&lk);
        if (!ln || *ln == 0)
            return 0;
        struct px_conn nc = {};
        nc.ident = bpf_ktime_get_ns();
        nc.epoch = px_epoch();
        nc.arr_epoch = nc.epoch;
        nc.lport = args->sport;
        nc.rport = args->dport;
        nc.family = args->family;
        if (args->family == PX_AF_INET) {
            __builtin_memcpy(nc.laddr, (u8 *)args->saddr + 4, 4);
            __builtin_memcpy(nc.raddr, (u8 *)args->daddr + 4, 4);
        } else {
            __builtin_memcpy(nc.laddr, (u8 *)args->saddr + 8, 16);
            __builtin_memcpy(nc.raddr, (u8 *)args->daddr + 8, 16);
        }
        px_conns.update(&sk, &nc);
        c = px_conns.lookup(&sk);
        if (!c)
            return 0;
        px_count(C_CONNS);
    }
    c->srtt_us = args->srtt;  // already microseconds (tp->srtt_us >> 3)
#ifndef PX_HAVE_SK_DATA_READY
    if (args->data_len && (c->t_arr == 0 || c->arr_epoch != px_epoch())) {
        c->t_arr = bpf_ktime_get_ns();
        c->arr_epoch = px_epoch();
    }
#endif
    return 0;
}
#endif

#if defined(PX_SOCK_HOOKS) && defined(PX_HAVE_TCP_RECEIVE_RESET)
TRACEPOINT_PROBE(tcp, tcp_receive_reset) {
    u64 sk = (u64)args->skaddr;
    struct px_conn *c = px_conns.lookup(&sk);
    if (c)
        c->peer_rst = 1;
    return 0;
}
#endif

#ifdef PX_HAVE_TCP_RETRANSMIT_SKB
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    u64 sk = (u64)args->skaddr;
    struct px_conn *c = px_conns.lookup(&sk);
    if (c)
        c->retrans += 1;
    return 0;
}
#endif

#ifdef PX_HAVE_TCP_RETRANSMIT_SYNACK
TRACEPOINT_PROBE(tcp, tcp_retransmit_synack) {
    u16 port = args->sport;
    if (!px_port_ok(port))
        return 0;
    u64 one = 1;
    u64 *v = px_synack.lookup(&port);
    if (v)
        __sync_fetch_and_add(v, 1);
    else
        px_synack.update(&port, &one);
    return 0;
}
#endif
