// TLS, the socket side. A connection whose first bytes are a TLS record carries ciphertext:
// its socket reads and writes keep the socket facts (srtt, the arrival of the bytes a read
// took, the close) but copy nothing and feed no cutter. Its plaintext comes from the library
// uprobes (tls_uprobes.h: SSL_read's buffer at its return, SSL_write's at its entry) and
// takes the same READ / RESP / body-aggregate path as a plaintext socket's bytes.
//
// Tying an SSL object to its socket (docs/agent.md, "TLS"): a socket BIO (nginx, blocking
// Python servers) reads and writes the socket inside the SSL call, so the call sees it
// (px_tls_thr.sk_in); a memory BIO (asyncio, hence uvicorn; Node) decrypts bytes the event
// loop read from the socket just before, on the same thread (px_tls_thr.last_rd). The link
// found at a read is kept per SSL object (px_tls_links) for the writes.

// Per thread of a TLS-probed process: the SSL call in flight and the sockets it touched.
struct px_tls_thr {
    u64 ssl;      // the SSL object of the call in flight (0: none)
    u64 buf;      // its plaintext buffer
    u64 outp;     // SSL_read_ex / SSL_write_ex: where the call writes its byte count
    u64 t;        // the call's entry
    u64 sk_in;    // a socket read or written inside the call (a socket BIO)
    u64 last_rd;  // the thread's last socket read, whatever the socket (a memory BIO's source)
    u32 write;    // the call in flight is SSL_write / SSL_write_ex
    u32 pad;
};

struct px_tls_key {
    u64 ssl;  // an SSL object's address: per process (forked workers share addresses)
    u32 tgid;
    u32 pad;
};

BPF_TABLE("lru_hash", u64, struct px_tls_thr, px_tls_thr, 16384);
BPF_TABLE("lru_hash", struct px_tls_key, u64, px_tls_links, PX_MAX_CONNS);

static __always_inline int px_tls_pid(u32 tgid) {
    u8 *v = px_pids.lookup(&tgid);
    return v && (*v & PX_PID_TLS);
}

// Every socket read or write of a process with the TLS probes, followed connection or not
// (its own outbound TLS must be told apart): noted on the thread.
static __always_inline void px_tls_note(u64 id, u64 sk, int is_read) {
    if (!px_tls_pid(id >> 32))
        return;
    struct px_tls_thr *th = px_tls_thr.lookup(&id);
    if (!th) {
        if (!is_read)
            return;
        struct px_tls_thr z = {};
        z.last_rd = sk;
        px_tls_thr.update(&id, &z);
        return;
    }
    if (th->ssl)
        th->sk_in = sk;
    if (is_read)
        th->last_rd = sk;
}

struct px_ev_tls {
    struct px_hdr h;
    u32 lport;  // (the connection's first READ, which carries it, may never come)
    u32 pad;
};

// The connection carries TLS: from now on its socket bytes are not copied. User space is
// told once (EV_TLS: the record's `tls` field; the process gets the TLS probes then, and
// its PX_PID_TLS bit with them; a process where none can go is counted).
static __always_inline void px_tls_mark(u64 id, u64 sk, struct px_conn *c) {
    c->tls |= PX_TLS_SEEN | PX_TLS_ON;
    struct px_ev_tls *e = px_events.ringbuf_reserve(sizeof(struct px_ev_tls));
    if (!e) {
        px_lost(c);
        return;
    }
    px_hdr_fill(&e->h, EV_TLS, id, (u32)c->fdkey, sk, c, bpf_ktime_get_ns());
    e->lport = c->lport;
    e->pad = 0;
    px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

// A connection's first read with data: two bytes tell a TLS record (content type 20-23,
// major version 3) from an HTTP method. Once per connection. Returns 1 for TLS.
static __always_inline int px_tls_detect(struct px_active *a, u64 id, u64 sk,
                                         struct px_conn *c, long ret) {
    c->tls |= PX_TLS_SEEN;
    u64 seglen = 0;
    u64 buf = px_first_buf(a, &seglen);
    u8 r[2] = {};
    if (!buf || ret < 2 || seglen < 2 || bpf_probe_read_user(r, 2, (void *)buf))
        return 0;
    if (r[0] < 20 || r[0] > 23 || r[1] != 3)
        return 0;
    px_tls_mark(id, sk, c);
    return 1;
}

// A socket read with data on a TLS connection: only the arrival time is kept, for the
// read that decrypts it (the latest stamped one: a record read in pieces keeps its
// first piece's arrival, a handshake's arrivals are overwritten by the request's).
static __always_inline void px_tls_sock_read(struct px_conn *c) {
    if (c->t_arr && c->arr_epoch == c->epoch)
        c->tls_arr = c->t_arr;
    c->t_arr = 0;
}
