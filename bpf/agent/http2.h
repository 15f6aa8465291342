// HTTP/2 cleartext (h2c with prior knowledge, what gRPC uses; also h2 over TLS, whose
// plaintext comes through the same functions from SSL_read / SSL_write). A connection whose
// first read with data starts with the client preface ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") is
// marked h2: from then on each of its reads and writes is one EV_H2 event carrying its time,
// byte count and the first PX_H2_WINDOW bytes, gathered across the iovecs of a readv/writev/
// sendmsg (gRPC's C core writes frame headers and payloads as separate iovecs). User space
// (agent/http2.py) frames the byte stream per direction and decodes HPACK; a frame header
// beyond the captured bytes desynchronises that connection there (counted, no records).
// No sampling in the kernel: a connection multiplexes streams, every stream is recorded.

#define PX_H2_WINDOW PX_HEAD_WINDOW  // bytes copied per read or write (power of two)
#define PX_H2_IOVS 16                // iovecs gathered per read or write

struct px_ev_h2 {
    struct px_hdr h;
    u64 t_est;
    u64 t_acc;
    u64 t_arr;  // reads: the arrival of the bytes (as px_ev_read's)
    u32 n;
    u32 caplen;
    u16 lport;
    u16 rport;
    u16 family;
    u16 dir;  // 0: a read (client to server), 1: a write
    u8 laddr[16];
    u8 raddr[16];
    // twice the window: a copy starts below PX_H2_WINDOW and is at most PX_H2_WINDOW long,
    // bounds the verifier can see without tracking the sum
    u8 data[2 * PX_H2_WINDOW];
};

BPF_PERCPU_ARRAY(px_scratch_h2, struct px_ev_h2, 1);

// The connection's first read with data: is it the client preface? (16 bytes tell.)
static __always_inline int px_h2_preface(struct px_active *a, long ret) {
    u64 seglen = 0;
    u64 buf = px_first_buf(a, &seglen);
    u64 p[2] = {};
    if (!buf || ret < 24 || seglen < 16 || bpf_probe_read_user(p, 16, (void *)buf))
        return 0;
    // "PRI * HTTP/2.0\r\n" as two little-endian u64s
    return p[0] == 0x5448202a20495250ULL && p[1] == 0x0a0d302e322f5054ULL;
}

// Copy the first bytes of the read or write (ret bytes in all) into dst; returns how many.
static __always_inline u32 px_h2_copy(struct px_active *a, long ret, u8 *dst) {
    if (a->kind == KIND_SENDFILE || a->kind == KIND_SENDFILE_CONT || !a->buf)
        return 0;
    if (a->iov == IOV_NONE) {
        u64 len = px_clamp(ret, ret, PX_H2_WINDOW);
        if (len == 0 || bpf_probe_read_user(dst, len, (void *)a->buf))
            return 0;
        return len;
    }
    u64 vec = a->buf;
    u64 nv = a->vlen;
    if (a->iov == IOV_MSG) {
        struct px_msghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf))
            return 0;
        vec = m.iov;
        nv = m.iovlen;
    }
    u64 off = 0;
    u64 left = ret;
#pragma unroll
    for (int i = 0; i < PX_H2_IOVS; i++) {
        if (i >= nv || left == 0 || off >= PX_H2_WINDOW)
            break;
        struct px_iovec v = {};
        if (bpf_probe_read_user(&v, sizeof(v), (void *)(vec + i * sizeof(struct px_iovec))))
            break;
        u64 len = px_clamp(left, v.len, PX_H2_WINDOW);
        if (len > PX_H2_WINDOW - off)
            len = PX_H2_WINDOW - off;  // (the window is full after this one)
        u64 at = off & (PX_H2_WINDOW - 1);
        asm volatile("" : "+r"(len));
        if (len > PX_H2_WINDOW)
            len = PX_H2_WINDOW;
        if (len && bpf_probe_read_user(dst + at, len, (void *)v.base))
            break;
        off += len;
        left -= len;
    }
    return off;
}

// One read (dir 0) or write (dir 1) of an h2 connection: one event. t: the read's return,
// or the write's start.
static __always_inline void px_h2_event(struct px_active *a, struct px_conn *c, u64 id,
                                        long ret, u64 t, u16 dir, int tls) {
    u32 zero = 0;
    struct px_ev_h2 *e = px_scratch_h2.lookup(&zero);
    if (!e)
        return;
    px_hdr_fill(&e->h, EV_H2, id, a->fd, a->sk, c, t);
    e->t_est = c->t_est;
    e->t_acc = c->t_acc;
    e->t_arr = 0;
    if (dir == 0) {
        if (tls) {
            e->t_arr = c->tls_arr;
            c->tls_arr = 0;
        } else {
            e->t_arr = c->arr_epoch == c->epoch ? c->t_arr : 0;
            c->t_arr = 0;
        }
    }
    e->n = ret;
    e->lport = c->lport;
    e->rport = c->rport;
    e->family = c->family;
    e->dir = dir;
    __builtin_memcpy(e->laddr, c->laddr, 16);
    __builtin_memcpy(e->raddr, c->raddr, 16);
    u64 cap = px_h2_copy(a, ret, e->data);
    e->caplen = cap;
    u64 size = sizeof(struct px_ev_h2) - 2 * PX_H2_WINDOW + cap;
    asm volatile("" : "+r"(size));
    if (size > sizeof(struct px_ev_h2))
        size = sizeof(struct px_ev_h2);
    if (px_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP))
        px_lost(c);
}

// Called for every read with data of a followed connection (before the HTTP/1 path):
// 1 when the read was an h2 connection's (handled here), 0 for the HTTP/1 path.
static __always_inline int px_h2_read(struct px_active *a, struct px_conn *c, u64 id, long ret,
                                      u64 t, int tls) {
    if (!(c->h2 & PX_H2_SEEN)) {
        c->h2 |= PX_H2_SEEN;
        if (px_h2_preface(a, ret)) {
            c->h2 |= PX_H2_ON;
            c->sample_th = 0;  // every stream is kept (see above)
        }
    }
    if (!(c->h2 & PX_H2_ON))
        return 0;
    px_h2_event(a, c, id, ret, t, 0, tls);
    return 1;
}
