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
#define PX_H2_WALK 32                // frames walked per read or write
#define PX_H2_HDRS 8                 // frame headers past the window carried per event
#define PX_H2_LOST 0xffffffffU       // px_conn.h2_left: the walk is not in step
#define PX_H2_TAIL 256               // a long plain buffer's last bytes copied too (trailers)

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
    // The kernel's frame walk (px_h2_walk): the frame headers that lie past the copied
    // bytes (a plain buffer's only), at their offsets in the read or write. walk = 1: the
    // walk was in step, so every frame header of the event is in data or here.
    u32 walk;
    u32 nhdr;
    u32 tail;  // bytes after the copy in data: the event's last ones (plain buffers)
    u32 hoff[PX_H2_HDRS];
    u8 hdr[PX_H2_HDRS][12];  // 9 bytes each, padded
    // twice the window: a copy starts below PX_H2_WINDOW and is at most PX_H2_WINDOW long,
    // bounds the verifier can see without tracking the sum
    u8 data[2 * PX_H2_WINDOW];
};

BPF_PERCPU_ARRAY(px_scratch_h2, struct px_ev_h2, 1);

// The read or write's first bytes into e->data (uio.h).
PX_GATHER(px_h2_copy, px_ev_h2, PX_H2_WINDOW, PX_H2_IOVS)

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

// Walk the frame headers of a read or write (ret bytes, the first cap of them copied in
// e->data) from where the previous event's last frame ends: those in the copy are read
// there, those past it from the user buffer (9 bytes each, plain buffers only) into e->hdr.
// The kernel keeps only "bytes left in the current frame" per direction; a frame header
// split across two events, a gathered buffer past the copy, more than PX_H2_WALK frames or
// PX_H2_HDRS headers past the copy: the walk gives up for the direction (user space then
// frames what the copy holds, and desynchronises where it must).
static __always_inline void px_h2_walk(struct px_ev_h2 *e, struct px_conn *c,
                                       struct px_active *a, u64 ret, u16 dir) {
    e->walk = 0;
    e->nhdr = 0;
    u32 d = dir & 1;
    u32 left = c->h2_left[d];
    if (left == PX_H2_LOST)
        return;
    // the copy's length read back from the event: one verifier state here, whichever way
    // the gather loop ended (else each of its exits would be walked apart)
    u64 cap = e->caplen;
    if (cap > PX_H2_WINDOW)
        cap = PX_H2_WINDOW;
    u64 pos = left;
    // the frame headers in the copy
    for (int i = 0; i < PX_H2_WALK; i++) {
        if (pos >= ret || pos + 9 > cap)
            break;
        u64 p = pos & (PX_H2_WINDOW - 1);
        u32 len = ((u32)e->data[p] << 16) | ((u32)e->data[p + 1] << 8) | e->data[p + 2];
        pos += 9 + (u64)len;
    }
    // past it (or past PX_H2_WALK frames): from the user buffer, a plain one only
    u32 nh = 0;
    for (int j = 0; j < PX_H2_HDRS; j++) {
        if (pos >= ret)
            break;
        if (pos + 9 > ret || a->iov != IOV_NONE || !a->buf)
            goto lost;
        if (bpf_probe_read_user(e->hdr[j], 9, (void *)(a->buf + pos)))
            goto lost;
        e->hoff[j] = pos;
        u32 len = ((u32)e->hdr[j][0] << 16) | ((u32)e->hdr[j][1] << 8) | e->hdr[j][2];
        pos += 9 + (u64)len;
        nh = j + 1;
    }
    if (pos < ret)
        goto lost;
    c->h2_left[d] = pos - ret;
    e->walk = 1;
    e->nhdr = nh;
    return;
lost:
    c->h2_left[d] = PX_H2_LOST;
    e->nhdr = 0;
}

// One read (dir 0) or write (dir 1) of an h2 connection: one event. t: the read's return,
// or the write's start.
static __always_inline void px_h2_event(struct px_active *a, struct px_conn *c, u64 id,
                                        long ret, u64 t, u16 dir, int tls) {
    if (c->h2 & PX_H2_DEAD)
        return;
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
    px_h2_copy(e, a, ret);
    px_h2_walk(e, c, a, ret, dir);
    // A plain buffer longer than the copy: its last bytes too, after the copy — where a
    // response's trailers are when the server writes a large message and them at once
    // (the walk finds their frame header; the header block is here).
    e->tail = 0;
    u64 cap = e->caplen;
    if (cap > PX_H2_WINDOW)
        cap = PX_H2_WINDOW;
    if (a->iov == IOV_NONE && a->buf && (u64)ret > cap) {
        u64 tl = px_clamp((u64)ret - cap, (u64)ret - cap, PX_H2_TAIL);
        if (tl && bpf_probe_read_user(e->data + cap, tl, (void *)(a->buf + ret - tl)) == 0)
            e->tail = tl;
    }
    u64 size = sizeof(struct px_ev_h2) - 2 * PX_H2_WINDOW + e->caplen + e->tail;
    px_output(e, size, sizeof(*e), c);
}

// Called for every read with data of a followed connection (before the HTTP/1 path):
// 1 when the read was an h2 connection's (handled here), 0 for the HTTP/1 path.
static __always_inline int px_h2_read(struct px_active *a, struct px_conn *c, u64 id, long ret,
                                      u64 t, int tls) {
    if (!(c->h2 & PX_H2_SEEN)) {
        c->h2 |= PX_H2_SEEN;
        if (px_h2_preface(a, ret)) {
            c->h2 |= PX_H2_ON;
            c->h2_left[0] = 24;  // the preface, then frames
            c->h2_left[1] = 0;
            c->sample_th = 0;  // every stream is kept (see above)
        }
    }
    if (!(c->h2 & PX_H2_ON))
        return 0;
    px_h2_event(a, c, id, ret, t, 0, tls);
    return 1;
}
