// LLM token streams (agent/protocols/streams): a response whose head announces an event
// stream — Content-Type text/event-stream (SSE) or NDJSON ("ndjson", "jsonl") — and every
// server frame of a WebSocket have each body write sent to user space (EV_BODY) with its
// first PX_BODY_WINDOW bytes, gathered across its iovecs, and past those its last
// PX_BODY_TAIL bytes: user space frames the events and reads their dialect. The body-write
// aggregate (WAGG) still times the same writes. User space applies the same content-type rule
// (agent/protocols/streams/body.py framing_of); this side scans the whole head for it.

#define PX_BODY_WINDOW 1024  // bytes copied from a body write's start (power of two)
#define PX_BODY_TAIL 256     // and from its end, when it is longer
#define PX_BODY_IOVS 4       // iovecs gathered (chunk-size line, data, CRLF: three)
// head bytes scanned for the content type: 2048 (gateways put many headers before it:
// LiteLLM's x-litellm-*), or half a smaller capture window (the 8-byte loads stay inside
// the window whatever the verifier assumes of the index)
#define PX_BODY_SCAN (PX_RESP_WINDOW >= 4096 ? 2048 : PX_RESP_WINDOW / 2)
#define PX_STREAM_SSE 1
#define PX_STREAM_NDJSON 2
#define PX_STREAM_WS 3

struct px_ev_body {
    struct px_hdr h;
    u32 n;       // bytes written
    u32 caplen;  // bytes of the write's start in data
    u32 tail;    // bytes of its end after them in data
    u32 pad;
    // twice the window: a copy starts below PX_BODY_WINDOW and is at most PX_BODY_WINDOW
    // long, bounds the verifier can see without tracking the sum
    u8 data[2 * PX_BODY_WINDOW];
};

BPF_PERCPU_ARRAY(px_scratch_body, struct px_ev_body, 1);

// What a response head (len bytes at head, in a map value) announces: "event-st"(ream),
// "ndjson" or "jsonl" at some position. A bounded loop (bcc cannot hand bpf_loop a
// callback): the verifier walks each turn, a few instructions each.
static __always_inline u8 px_stream_kind(u8 *head, u64 len) {
    if (len > PX_BODY_SCAN)
        len = PX_BODY_SCAN;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i + 8 <= PX_BODY_SCAN; i++) {
        if (i + 8 > len)
            break;
        u64 v = 0;
        __builtin_memcpy(&v, head + (i & (PX_BODY_SCAN - 1)), 8);
        if (v == 0x74732d746e657665ULL)  // "event-st"
            return PX_STREAM_SSE;
        if ((v & 0xffffffffffffULL) == 0x6e6f736a646eULL ||  // "ndjson"
            (v & 0xffffffffffULL) == 0x6c6e6f736aULL)        // "jsonl"
            return PX_STREAM_NDJSON;
    }
    return 0;
}

// Gather the write's first bytes into e->data (the running offset kept in e->caplen: one
// verifier state whatever path led there, as px_h2_copy does).
static __always_inline void px_body_copy(struct px_ev_body *e, struct px_active *a, long ret) {
    e->caplen = 0;
    if (a->kind == KIND_SENDFILE || a->kind == KIND_SENDFILE_CONT || !a->buf)
        return;
    if (a->iov == IOV_NONE) {
        u64 len = px_clamp(ret, ret, PX_BODY_WINDOW);
        if (len && bpf_probe_read_user(e->data, len, (void *)a->buf) == 0)
            e->caplen = len;
        return;
    }
    u64 vec = a->buf;
    u64 nv = a->vlen;
    if (a->iov == IOV_MSG) {
        struct px_msghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf))
            return;
        vec = m.iov;
        nv = m.iovlen;
    }
    for (int i = 0; i < PX_BODY_IOVS; i++) {
        u64 off = e->caplen;
        if (i >= nv || off >= PX_BODY_WINDOW || off >= (u64)ret)
            break;
        struct px_iovec v = {};
        if (bpf_probe_read_user(&v, sizeof(v), (void *)(vec + i * sizeof(struct px_iovec))))
            break;
        u64 room = PX_BODY_WINDOW - off;
        u64 want = (u64)ret - off;
        u64 len = px_clamp(want < room ? want : room, v.len, PX_BODY_WINDOW);
        if (len == 0)
            continue;
        if (bpf_probe_read_user(e->data + (off & (PX_BODY_WINDOW - 1)), len, (void *)v.base))
            break;
        e->caplen = off + len;
    }
}

// A body write of a stream: EV_BODY with its first and last bytes.
static __always_inline void px_body_event(struct px_active *a, struct px_conn *c, u64 id,
                                          long ret, u64 t) {
    u32 zero = 0;
    struct px_ev_body *e = px_scratch_body.lookup(&zero);
    if (!e)
        return;
    px_hdr_fill(&e->h, EV_BODY, id, a->fd, a->sk, c, t);
    e->n = ret;
    px_body_copy(e, a, ret);
    e->tail = 0;
    u64 cap = e->caplen;
    if (cap > PX_BODY_WINDOW)
        cap = PX_BODY_WINDOW;
    if ((u64)ret > cap && a->kind < KIND_SENDFILE) {
        u64 lastlen = 0;
        u64 last = px_last_buf(a, ret, &lastlen);
        u64 want = (u64)ret - cap;
        u64 tl = px_clamp(want, lastlen, PX_BODY_TAIL);
        if (last && tl && bpf_probe_read_user(e->data + cap, tl, (void *)(last + lastlen - tl)) == 0)
            e->tail = tl;
    }
    u64 size = sizeof(struct px_ev_body) - 2 * PX_BODY_WINDOW + e->caplen + e->tail;
    asm volatile("" : "+r"(size));
    if (size > sizeof(struct px_ev_body))
        size = sizeof(struct px_ev_body);
    if (px_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP))
        px_lost(c);
}
