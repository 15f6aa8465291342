// The read or write syscall in flight, per thread (entry: fd, buffer, kind), its link to
// the socket, and the user buffers it reads from or writes to (plain, iovec, msghdr).

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

// A socket read of a traced process while tracing is paused: with data, on a followed
// connection, a request not traced (counted). Nothing else is done while paused — what
// goes stale meanwhile is recognised by px_cfg.epoch afterwards.
static __always_inline void px_paused_read(u64 sk, long ret) {
    if (ret <= 0)
        return;
    struct px_conn *c = px_conns.lookup(&sk);
    if (c && !(c->tls & PX_TLS_ON))  // (a TLS connection's: at SSL_read, tls_uprobes.h)
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

// PX_GATHER(name, ev, window, iovs) defines name(e, a, ret): copy the first bytes of a
// read or write (ret bytes in all) into e->data, at most window (a power of two) of them
// gathered across the first iovs iovecs; e->caplen says how many. The running offset lives
// in e->caplen, stored and loaded back each time: a value loaded from memory is one
// verifier state whatever path led there, where a register's would be many (each iovec's
// clamps and exits) — an unrolled loop on registers took the socket programs from ~40k to
// ~940k instructions verified (of the 1M limit). A macro, one function per event type
// (http2.h, stream.h), not one inline function with window and iovs as arguments: that
// one, inlined, took raw_tracepoint__sys_exit past the 512-byte stack (--head-window 256).
#define PX_GATHER(name, ev, window, iovs)                                                   \
    static __always_inline void name(struct ev *e, struct px_active *a, long ret) {         \
        e->caplen = 0;                                                                      \
        if (a->kind == KIND_SENDFILE || a->kind == KIND_SENDFILE_CONT || !a->buf)           \
            return;                                                                         \
        if (a->iov == IOV_NONE) {                                                           \
            u64 len = px_clamp(ret, ret, window);                                           \
            if (len && bpf_probe_read_user(e->data, len, (void *)a->buf) == 0)              \
                e->caplen = len;                                                            \
            return;                                                                         \
        }                                                                                   \
        u64 vec = a->buf;                                                                   \
        u64 nv = a->vlen;                                                                   \
        if (a->iov == IOV_MSG) {                                                            \
            struct px_msghdr m = {};                                                        \
            if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf))                         \
                return;                                                                     \
            vec = m.iov;                                                                    \
            nv = m.iovlen;                                                                  \
        }                                                                                   \
        for (int i = 0; i < iovs; i++) {                                                    \
            u64 off = e->caplen;                                                            \
            if (i >= nv || off >= window || off >= (u64)ret)                                \
                break;                                                                      \
            struct px_iovec v = {};                                                         \
            if (bpf_probe_read_user(&v, sizeof(v), (void *)(vec + i * sizeof(struct px_iovec)))) \
                break;                                                                      \
            u64 room = window - off; /* (the window is full after this one) */              \
            u64 want = (u64)ret - off;                                                      \
            u64 len = px_clamp(want < room ? want : room, v.len, window);                   \
            if (len == 0)                                                                   \
                continue;                                                                   \
            if (bpf_probe_read_user(e->data + (off & (window - 1)), len, (void *)v.base))   \
                break;                                                                      \
            e->caplen = off + len;                                                          \
        }                                                                                   \
    }
