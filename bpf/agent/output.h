// The ring buffer and the records it carries to user space (READ, RESP, WAGG, CLOSE: their
// layouts are mirrored in agent/events.py), lost-event handling, and the flush of a
// connection's body-write aggregate.

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
    u32 sample_th;  // READ: the sampling threshold its request was kept under (0: all)
    u32 rtx_wait_us;  // the connection's timed retransmits: their summed wait (tcp.h)
    u32 rtx_timed;    // ... and how many there were
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
    u16 skipped;  // requests of this connection dropped by sampling since the last READ
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

BPF_RINGBUF_OUTPUT(px_events, PX_RINGBUF_PAGES);
BPF_PERCPU_ARRAY(px_scratch_read, struct px_ev_read, 1);
BPF_PERCPU_ARRAY(px_scratch_resp, struct px_ev_resp, 1);
BPF_PERCPU_ARRAY(px_scratch_wagg, struct px_ev_wagg, 1);

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
    h->sample_th = c ? c->sample_th : 0;
    h->rtx_wait_us = c ? c->rtx_wait_us : 0;
    h->rtx_timed = c ? c->rtx_timed : 0;
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

// Send the first size bytes of a variable-length event (at most max: its struct's size) to
// user space. The size is pinned in a register and bounded again where the verifier sees
// it; a full ring is a lost event of the connection.
static __always_inline void px_output(void *e, u64 size, u64 max, struct px_conn *c) {
    asm volatile("" : "+r"(size));
    if (size > max)
        size = max;
    if (px_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP))
        px_lost(c);
}

static __always_inline void px_flush(u64 id, u32 fd, u64 sk, struct px_conn *c, u64 t,
                                      u32 extra_flags) {
    if (!c || !c->agg_pending)
        return;
    c->agg_pending = 0;
    struct px_agg *a = px_aggs.lookup(&sk);
    if (!a || a->t_last == 0)
        return;
#ifdef PX_HOLDS
    // Held writes still waiting to leave at the response's end (a boundary, not the
    // stream limit's partial flush, whose response goes on): untimed, and forgotten.
    if (a->hold_pend && !(extra_flags & WAGG_PARTIAL)) {
        a->hold_untimed += a->hold_pend;
        a->hold_pend = 0;
        px_hold_forget(sk);
    }
#endif
    // Built aside and sent with only the offsets it fills: a one-write response's record
    // is ~130 bytes instead of the ~1.1 KB of the whole array (the ring holds more of them).
    u32 zero = 0;
    struct px_ev_wagg *e = px_scratch_wagg.lookup(&zero);
    if (e) {
        px_hdr_fill(&e->h, EV_WAGG, id, fd, sk, c, t);
        bpf_probe_read_kernel(&e->a, sizeof(struct px_agg), a);  // too big for an inline memcpy
        e->a.flags |= extra_flags;
        u64 k = a->n < PX_CHUNKS ? a->n : PX_CHUNKS;
        u64 size = sizeof(struct px_ev_wagg) - 4 * (PX_CHUNKS - k);
        px_output(e, size, sizeof(*e), c);
    }
#ifdef PX_HOLDS
    a->hold_max_us = 0;
    a->hold_sum_us = 0;
    a->hold_n = 0;
    a->hold_untimed = 0;
    a->hold_why = 0;
    a->hold_mask = 0;
    a->hold_on = 0;
    a->hold_bytes = 0;
#endif
    a->n = 0;
    a->bytes = 0;
    a->flags = 0;
    a->gap_max_ns = 0;
    a->t_first = 0;
    a->t_last = 0;
}

// An event that is its header alone (CLOSE, SOCK_CLOSE, PEER_FIN).
static __always_inline void px_hdr_event(u32 type, u64 id, u32 fd, u64 sk, struct px_conn *c,
                                         u64 t) {
    struct px_hdr *e = px_events.ringbuf_reserve(sizeof(struct px_hdr));
    if (!e) {
        px_lost(c);
    } else {
        px_hdr_fill(e, type, id, fd, sk, c, t);
        px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
}

// A connection's entries in the socket-keyed maps, freed (its end is emitted).
static __always_inline void px_conn_forget(u64 sk) {
    if (px_conns.delete(&sk) == 0)
        px_count(C_CONNS_DEL);
    if (px_aggs.delete(&sk) == 0)
        px_count(C_AGGS_DEL);
#ifdef PX_HOLDS
    px_hold_forget(sk);
#endif
}

// The end of a connection: flush the aggregate, emit CLOSE, free its map entries.
static __always_inline void px_conn_end(u64 id, u32 fd, u64 sk, struct px_conn *c, u64 t) {
    px_flush(id, fd, sk, c, t, WAGG_CLOSE);
    px_hdr_event(EV_CLOSE, id, fd, sk, c, t);
    px_tail_keep(sk, c, t);  // (close(): the socket sends its FIN after this)
    px_conn_forget(sk);
}
