// TLS, the library side: uprobes on OpenSSL's SSL_read / SSL_read_ex / SSL_write /
// SSL_write_ex, attached by user space (agent/tls.py) per traced process to the libssl it
// maps, or to its executable where that carries the symbols (Node links OpenSSL
// statically and exports them). Each program is loaded and verified on its own.
//
// Entry: the call, its plaintext buffer and the _ex byte-count pointer, per thread. Return:
// the bytes done; the connection is found (px_tls_conn) and the plaintext goes the way a
// socket's bytes go — SSL_read's as a read at its return (after decryption), SSL_write's as
// a write timed at its entry (before encryption).

// x86-64 user pt_regs (the uprobe's context): arguments in di, si, dx, cx; return in ax
#define PX_REGS_CX 88
#define PX_REGS_SI 104
#define PX_REGS_DI 112

static __always_inline void px_tls_enter(void *ctx, u32 write, int ex) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_followed(id >> 32))  // (paused too: a read then is counted as shed)
        return;
    u64 *r = (u64 *)ctx;
    struct px_tls_thr *th = px_tls_thr.lookup(&id);
    if (!th) {
        struct px_tls_thr z = {};
        px_tls_thr.update(&id, &z);
        th = px_tls_thr.lookup(&id);
        if (!th)
            return;
    }
    th->ssl = r[PX_REGS_DI / 8];
    th->buf = r[PX_REGS_SI / 8];
    th->outp = ex ? r[PX_REGS_CX / 8] : 0;
    th->t = bpf_ktime_get_ns();
    th->sk_in = 0;
    th->write = write;
}

int px_ssl_read_enter(void *ctx) {
    px_tls_enter(ctx, 0, 0);
    return 0;
}

int px_ssl_read_ex_enter(void *ctx) {
    px_tls_enter(ctx, 0, 1);
    return 0;
}

int px_ssl_write_enter(void *ctx) {
    px_tls_enter(ctx, 1, 0);
    return 0;
}

int px_ssl_write_ex_enter(void *ctx) {
    px_tls_enter(ctx, 1, 1);
    return 0;
}

// The plaintext bytes the call returned or took (0: none — WANT_READ, an error, a close).
// SSL_read/SSL_write return an int count; the _ex forms 1 and the count in *outp.
static __always_inline u64 px_tls_count(void *ctx, u64 outp) {
    int rc = (int)((u64 *)ctx)[PX_REGS_AX / 8];
    if (!outp)
        return rc > 0 ? rc : 0;
    u64 n = 0;
    if (rc != 1 || bpf_probe_read_user(&n, sizeof(n), (void *)outp))
        return 0;
    return n;
}

// The followed connection an SSL call worked for, and its socket (*skp); 0 when the call
// is not for one (the process's own outbound TLS, a connection not followed).
//   1. The call read or wrote a socket itself (a socket BIO): that socket.
//   2. Else the socket this SSL object was linked to, still the connection's.
//   3. Else, for a read (a memory BIO: asyncio, Node), the thread's last socket read: the
//      event loop decrypts what it has just read. Not when the plaintext is a response
//      ("HTTP/"): an outbound connection's, read on a server's thread.
static __always_inline struct px_conn *px_tls_conn(u64 id, u64 ssl, u64 sk_in, u64 last_rd,
                                                   u64 buf, u32 write, u64 *skp) {
    u32 tgid = id >> 32;
    struct px_tls_key k = {};
    k.ssl = ssl;
    k.tgid = tgid;
    struct px_conn *c = 0;
    u64 sk = sk_in;
    if (sk) {
        c = px_conns.lookup(&sk);
        if (!c)
            return 0;
        if (!(c->tls & PX_TLS_ON))
            px_tls_mark(id, sk, c);  // (its first bytes were not seen: older than the agent)
        if (c->tls_ssl != ssl) {
            c->tls_ssl = ssl;
            px_tls_links.update(&k, &sk);
        }
        *skp = sk;
        return c;
    }
    u64 *lk = px_tls_links.lookup(&k);
    if (lk) {
        sk = *lk;
        c = px_conns.lookup(&sk);
        // (an SSL object freed and its address reused by another connection: relinked)
        if (c && c->tls_ssl == ssl && c->tgid == tgid && (c->tls & PX_TLS_ON)) {
            *skp = sk;
            return c;
        }
    }
    if (write || !last_rd)
        return 0;
    sk = last_rd;
    c = px_conns.lookup(&sk);
    if (!c || !(c->tls & PX_TLS_ON) || c->tgid != tgid)
        return 0;
    char h[5] = {};
    if (bpf_probe_read_user(h, sizeof(h), (void *)buf) == 0 && h[0] == 'H' && h[1] == 'T' &&
        h[2] == 'T' && h[3] == 'P' && h[4] == '/')
        return 0;
    c->tls_ssl = ssl;
    px_tls_links.update(&k, &sk);
    *skp = sk;
    return c;
}

// The plaintext of an SSL call as the syscall paths see a read or write: one plain buffer on
// the connection's socket and fd.
static __always_inline void px_tls_active(struct px_active *a, struct px_conn *c, u64 sk, u64 buf,
                                          u8 kind) {
    a->sk = sk;
    a->buf = buf;
    a->fd = (u32)c->fdkey;
    a->kind = kind;
    a->iov = IOV_NONE;
}

// SSL_read / SSL_read_ex returned: its plaintext is the request bytes, read now.
int px_ssl_read_ret(void *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct px_tls_thr *th = px_tls_thr.lookup(&id);
    if (!th || !th->ssl || th->write)
        return 0;
    u64 ssl = th->ssl, buf = th->buf, sk_in = th->sk_in, last_rd = th->last_rd;
    u64 n = px_tls_count(ctx, th->outp);
    th->ssl = 0;
    if (n == 0)
        return 0;
    if (!px_traced(id >> 32)) {
        if (px_shed(id >> 32)) {  // paused: a request not traced, on a linked connection
            struct px_tls_key k = {};
            k.ssl = ssl;
            k.tgid = id >> 32;
            u64 *lk = px_tls_links.lookup(&k);
            struct px_conn *pc = lk ? px_conns.lookup(lk) : 0;
            if (pc && pc->tls_ssl == ssl)
                px_count(C_SHED_READS);
        }
        return 0;
    }
    u64 sk = 0;
    struct px_conn *c = px_tls_conn(id, ssl, sk_in, last_rd, buf, 0, &sk);
    if (!c)
        return 0;
    px_conn_epoch(c);
    px_srtt(c, sk);
    struct px_active a = {};
    px_tls_active(&a, c, sk, buf, KIND_READ);
    px_on_read_conn(&a, c, id, n, bpf_ktime_get_ns(), 1);
    return 0;
}

// SSL_write / SSL_write_ex returned: its plaintext is response bytes, written when the
// call began (encryption and the socket write follow within it, or just after it).
int px_ssl_write_ret(void *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct px_tls_thr *th = px_tls_thr.lookup(&id);
    if (!th || !th->ssl || !th->write)
        return 0;
    u64 ssl = th->ssl, buf = th->buf, sk_in = th->sk_in, t = th->t;
    u64 n = px_tls_count(ctx, th->outp);
    th->ssl = 0;
    if (n == 0 || !px_traced(id >> 32))
        return 0;
    u64 sk = 0;
    struct px_conn *c = px_tls_conn(id, ssl, sk_in, 0, buf, 1, &sk);
    if (!c)
        return 0;
    px_conn_epoch(c);
    struct px_active a = {};
    px_tls_active(&a, c, sk, buf, KIND_WRITE);
    px_on_write_conn(&a, c, id, n, t, bpf_ktime_get_ns());
    return 0;
}
