// Write-to-wire holdback: how long a body write's last byte waits in the socket before the
// segment carrying it is handed to the device, and why (docs/agent.md, "Write-to-wire
// holdback"). At a body write's return (PX_SOCK_HOOKS: after tcp_sendmsg and the backlog
// its release_sock ran), tcp_sock.write_seq ahead of snd_nxt means bytes are held: the
// write is queued in px_holds with the reason read from the socket; the departure of the
// segment that carries its last byte (net:net_dev_queue, a raw tracepoint: skb -> sk, the
// TCP header's seq + payload) times it. Per response the times are aggregated in its
// px_agg (max, sum, count, bytes): no ring event per write. Offsets come from BTF (PX_OFF_*).

#ifdef PX_HOLDS
#define PX_WHY_NAGLE 1   // a small segment held while data is in flight, TCP_NODELAY off
#define PX_WHY_CORK 2    // TCP_CORK
#define PX_WHY_CWND 3    // packets in flight >= congestion window
#define PX_WHY_RWND 4    // the peer's receive window is full
#define PX_WHY_SNDBUF 5  // the write waited for send-buffer space (blocked, or EAGAIN)
#define PX_WHY_STACK 6   // none of those: autocork, TSQ, pacing, MSG_MORE
// A blocking write that lasted this long in the kernel waited for buffer space: copying
// for 1 ms is megabytes, more than a send buffer holds.
#define PX_HOLD_BLOCK_NS 1000000ULL

static __always_inline u32 px_ld32(u64 p) {
    u32 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (void *)p);
    return v;
}

static __always_inline void px_hold_add(struct px_agg *g, u64 d_ns, u8 why) {
    u32 us = d_ns / 1000;
    if (g->hold_n == 0 || us > g->hold_max_us) {
        g->hold_max_us = us;
        g->hold_why = why;
    }
    g->hold_sum_us += us;
    g->hold_n += 1;
    g->hold_mask |= 1 << why;
}

// Why bytes are held at a write's return, in the order tcp_write_xmit tests them.
static __always_inline u8 px_hold_why(u64 sk, u32 nxt, u32 held) {
    u8 nb = 0;
    bpf_probe_read_kernel(&nb, 1, (void *)(sk + PX_OFF_TCP_NONAGLE));
    u32 na = (nb >> PX_SHIFT_TCP_NONAGLE) & 0xf;
    if (na & 2)  // TCP_NAGLE_CORK
        return PX_WHY_CORK;
    u32 pout = px_ld32(sk + PX_OFF_TCP_PACKETS_OUT);
    if (pout >= px_ld32(sk + PX_OFF_TCP_SND_CWND))
        return PX_WHY_CWND;
    u32 mss = px_ld32(sk + PX_OFF_TCP_MSS_CACHE);
    u32 seg = held < mss ? held : mss;
    u32 una = px_ld32(sk + PX_OFF_TCP_SND_UNA);
    if (nxt + seg - una > px_ld32(sk + PX_OFF_TCP_SND_WND))
        return PX_WHY_RWND;
    if (!(na & 1) && pout)  // TCP_NAGLE_OFF clear (no TCP_NODELAY), data in flight
        return PX_WHY_NAGLE;
    return PX_WHY_STACK;
}

// Sequence `end` has left: every queued write ending at or before it is timed.
static __always_inline void px_hold_release(u64 sk, struct px_hold *h, struct px_agg *g,
                                            u32 end, u64 now) {
    u32 had = h->n;
    for (int i = 0; i < PX_HOLD_Q; i++) {
        if (h->n == 0)
            break;
        u32 k = h->head & (PX_HOLD_Q - 1);
        if ((s32)(end - h->seq[k]) < 0)
            break;
        if (g) {
            px_hold_add(g, now > h->t[k] ? now - h->t[k] : 0, h->why[k]);
            if (g->hold_pend)
                g->hold_pend -= 1;
        }
        h->head += 1;
        h->n -= 1;
    }
    if (!had || h->n)
        return;
    px_hold_count_add(-1);
    // A response whose end waited for its held writes (px_hold_end): flushed now, with
    // their times in it.
    if (g && (g->flags & WAGG_END) && g->hold_pend == 0) {
        struct px_conn *c = px_conns.lookup(&sk);
        if (c)
            px_flush(((u64)c->tgid) << 32, (u32)c->fdkey, sk, c, now, 0);
    }
}

// A body write of a followed connection returned (t: its start, t_done: its return).
static __always_inline void px_hold_write(u64 sk, struct px_agg *g, u64 t, u64 t_done) {
    g->hold_on = 1;
    u32 wseq = px_ld32(sk + PX_OFF_TCP_WRITE_SEQ);
    u32 nxt = px_ld32(sk + PX_OFF_TCP_SND_NXT);
    s32 held = wseq - nxt;
    u64 t0 = t;
    int blocked = 0;
    if (g->hold_block_t) {  // an earlier try failed with EAGAIN: the wait began there
        if (g->hold_block_t < t0)
            t0 = g->hold_block_t;
        g->hold_block_t = 0;
        blocked = 1;
    } else if (t_done - t >= PX_HOLD_BLOCK_NS) {
        blocked = 1;
    }
    if (held <= 0) {
        // Everything left by the return: a write that waited for buffer space is timed
        // to its return (its last byte left before it), others were not held.
        if (blocked)
            px_hold_add(g, t_done - t0, PX_WHY_SNDBUF);
        return;
    }
    u8 why = blocked ? PX_WHY_SNDBUF : px_hold_why(sk, nxt, held);
    if ((u32)held > g->hold_bytes)
        g->hold_bytes = held;
    struct px_hold *h = px_holds.lookup(&sk);
    if (!h) {
        struct px_hold z = {};
        px_holds.update(&sk, &z);
        h = px_holds.lookup(&sk);
        if (!h) {
            g->hold_untimed += 1;
            return;
        }
    }
    if (h->n >= PX_HOLD_Q) {  // more writes held at once than the queue keeps
        g->hold_untimed += 1;
        return;
    }
    u32 k = (h->head + h->n) & (PX_HOLD_Q - 1);
    h->t[k] = t0;
    h->seq[k] = wseq;
    h->why[k] = why;
    if (h->n == 0)
        px_hold_count_add(1);
    h->n += 1;
    g->hold_pend += 1;
    // The departure may have run on another CPU between the read above and the queueing
    // (this hook runs after the socket lock is released): look again.
    u32 nxt2 = px_ld32(sk + PX_OFF_TCP_SND_NXT);
    if ((s32)(nxt2 - wseq) >= 0)
        px_hold_release(sk, h, g, nxt2, bpf_ktime_get_ns());
}

// The response ended (chunked terminator) while some of its writes are still held: its
// flush waits for their departure (px_hold_release), or for the next boundary.
static __always_inline int px_hold_end(struct px_agg *g) {
    if (!g->hold_pend)
        return 0;
    g->flags |= WAGG_END;
    return 1;
}

// A write failed with EAGAIN: the socket's send buffer is full. The response's next write
// that succeeds is timed from here.
static __always_inline void px_hold_blocked(u64 sk, u64 t) {
    struct px_agg *g = px_aggs.lookup(&sk);
    if (g && !g->hold_block_t)
        g->hold_block_t = t;
}

// A segment of socket `sk` left (skb fields: head, data, len, transport_header): its end —
// the TCP header's seq plus its payload (GSO: all of it) — releases the writes held to it.
static __always_inline void px_hold_departed(u64 sk, struct px_hold *h, u64 head, u64 data,
                                             u32 len, u16 th) {
    u8 tcph[13] = {};
    if (bpf_probe_read_kernel(tcph, sizeof(tcph), (void *)(head + th)))
        return;
    u32 seq = ((u32)tcph[4] << 24) | ((u32)tcph[5] << 16) | ((u32)tcph[6] << 8) | tcph[7];
    u32 hl = (u32)(head + th - data) + (u32)(tcph[12] >> 4) * 4;
    if (len <= hl)
        return;  // no payload: an ACK, a lone FIN
    struct px_agg *g = px_aggs.lookup(&sk);
    px_hold_release(sk, h, g, seq + (len - hl), bpf_ktime_get_ns());
}

// Whether any followed socket holds a write: while none does, every departure hook stops
// at this one array load.
static __always_inline int px_hold_any(void) {
    u32 zero = 0;
    s64 *cnt = px_hold_count.lookup(&zero);
    return cnt && *cnt > 0;
}

// net:net_dev_queue (raw): a packet handed to the device layer. Every packet on the node
// comes here. Replaced by px_hold_xmit_btf where the kernel loads that.
int px_hold_xmit(struct bpf_raw_tracepoint_args *ctx) {
    if (!px_hold_any())
        return 0;
    u64 skb = ctx->args[0];
    u64 sk = 0;
    if (bpf_probe_read_kernel(&sk, sizeof(sk), (void *)(skb + PX_OFF_SKB_SK)) || !sk)
        return 0;
    struct px_hold *h = px_holds.lookup(&sk);
    if (!h || !h->n)
        return 0;
    u64 head = 0, data = 0;
    u32 len = 0;
    u16 th = 0;
    if (bpf_probe_read_kernel(&head, sizeof(head), (void *)(skb + PX_OFF_SKB_HEAD)) ||
        bpf_probe_read_kernel(&data, sizeof(data), (void *)(skb + PX_OFF_SKB_DATA)) ||
        bpf_probe_read_kernel(&len, sizeof(len), (void *)(skb + PX_OFF_SKB_LEN)) ||
        bpf_probe_read_kernel(&th, sizeof(th), (void *)(skb + PX_OFF_SKB_TH)))
        return 0;
    px_hold_departed(sk, h, head, data, len, th);
    return 0;
}

#ifdef PX_HOLD_BTF
// The same hook as a BTF tracepoint (tp_btf, loaded by agent/kernel/tpbtf.py): the skb is a
// typed pointer, so its five fields are direct loads the verifier checks against the
// kernel's BTF instead of five helper calls (the TCP header, in the packet's data, is
// still read by the helper).
int px_hold_xmit_btf(u64 *ctx) {
    if (!px_hold_any())
        return 0;
    u64 skb = ctx[0];
    u64 sk = *(u64 *)(skb + PX_OFF_SKB_SK);
    if (!sk)
        return 0;
    struct px_hold *h = px_holds.lookup(&sk);
    if (!h || !h->n)
        return 0;
    px_hold_departed(sk, h, *(u64 *)(skb + PX_OFF_SKB_HEAD), *(u64 *)(skb + PX_OFF_SKB_DATA),
                     *(u32 *)(skb + PX_OFF_SKB_LEN), *(u16 *)(skb + PX_OFF_SKB_TH));
    return 0;
}
#endif
#endif
