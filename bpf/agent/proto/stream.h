// LLM token streams (agent/protocols/streams): the body writes of an event stream — SSE or
// NDJSON — and every server frame of a WebSocket go to user space (EV_BODY), each with its
// first PX_BODY_WINDOW bytes, gathered across its iovecs, and past those its last
// PX_BODY_TAIL bytes: user space frames the events and reads their dialect there. The
// body-write aggregate (WAGG) still times the same writes.
//
// Which responses: decided at a response's first body write, from its first bytes — an SSE
// event starts "data:", "event:", "id:" or ":" (a comment), an NDJSON line "{" — after the
// chunk-size line where the body is chunked. A constant-time look at bytes the write path
// has read anyway: no scan of every response's head (a 2 KB scan for the content type cost
// every response ~0.5 us). User space reads a body only where the head's Content-Type also
// says so (agent/protocols/streams/body.py framing_of); a chunked JSON document that starts
// "{" sends its writes up for nothing, once per write.

#define PX_BODY_WINDOW 1024  // bytes copied from a body write's start (power of two)
#define PX_BODY_TAIL 256     // and from its end, when it is longer
#define PX_BODY_IOVS 4       // iovecs gathered (chunk-size line, data, CRLF: three)
#define PX_STREAM_NO 0       // c->stream: not a stream
#define PX_STREAM_ON 1       // an event stream's writes go up
#define PX_STREAM_WS 3       // a WebSocket's server frames go up
#define PX_STREAM_UNSEEN 0xff  // a response head was written, its first body write not yet

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

// The write's first bytes into e->data (uio.h).
PX_GATHER(px_body_copy, px_ev_body, PX_BODY_WINDOW, PX_BODY_IOVS)

// A response's first body write (peek bytes of it at head): does it start an event stream?
static __always_inline u8 px_stream_first(u8 *head, u64 peek) {
    u32 i = 0;
    // a chunk-size line first: hex digits (at most 8 here) and CRLF
#pragma unroll
    for (u32 k = 1; k < 10; k++) {
        if (k + 1 < peek && head[k] == '\r' && head[k + 1] == '\n') {
            i = k + 2;
            break;
        }
    }
    if (i + 5 > peek || i > 11)
        return PX_STREAM_NO;
    u8 c0 = head[i & 15];
    if (c0 == ':' || c0 == '{')
        return PX_STREAM_ON;
    u8 c1 = head[(i + 1) & 15], c2 = head[(i + 2) & 15], c3 = head[(i + 3) & 15];
    u8 c4 = head[(i + 4) & 15];
    if ((c0 == 'd' && c1 == 'a' && c2 == 't' && c3 == 'a' && c4 == ':') ||
        (c0 == 'e' && c1 == 'v' && c2 == 'e' && c3 == 'n' && c4 == 't') ||
        (c0 == 'i' && c1 == 'd' && c2 == ':'))
        return PX_STREAM_ON;
    return PX_STREAM_NO;
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
    px_output(e, size, sizeof(*e), c);
}
