// The HTTP cut in the kernel: a read with data -> READ event with the request head; a write
// starting "HTTP/" -> RESP event; other writes -> the connection's body-write aggregate
// (chunked terminator, WebSocket frames, stream limit), flushed as WAGG at a boundary.

static __always_inline void px_srtt(struct px_conn *c, u64 sk) {
#ifdef PX_OFF_TCP_SRTT
    // tcp_sock.srtt_us (microseconds << 3) at its offset in the running kernel's BTF: one
    // read per request instead of tcp_probe on every segment of every socket on the node
    u32 srtt8 = 0;
    if (bpf_probe_read_kernel(&srtt8, sizeof(srtt8), (void *)(sk + PX_OFF_TCP_SRTT)) == 0)
        c->srtt_us = srtt8 >> 3;
#endif
}

// A read with data of request bytes: from the socket, or (tls) SSL_read's plaintext.
static __always_inline void px_on_read_conn(struct px_active *a, struct px_conn *c, u64 id,
                                            long ret, u64 t, int tls) {
    if (px_h2_read(a, c, id, ret, t, tls))
        return;  // HTTP/2 (http2.h)
    u64 sk = a->sk;
    px_flush(id, a->fd, sk, c, t, 0);
    u32 zero = 0;
    struct px_ev_read *e = px_scratch_read.lookup(&zero);
    if (!e)
        return;
    u64 seglen = 0;
    u64 buf = px_first_buf(a, &seglen);
    u64 len = px_clamp(ret, seglen, PX_HEAD_WINDOW);
    u64 have = 0;  // bytes of the head already in e->data
    if (c->sample == 0) {  // a request starts: keep it or not (sample.h)
        struct px_cfg *cfg = px_cfg_get();
        if (cfg && cfg->sample_th && buf) {  // its first bytes, for a traceparent
            have = px_clamp(len, len, PX_TP_SCAN + PX_TP_NEED);
            if (have == 0 || bpf_probe_read_user(e->data, have, (void *)buf))
                have = 0;
        }
        if (!px_sample_decide(c, e->data, have, t)) {
            c->t_arr = 0;  // consumed by the dropped request
            c->tls_arr = 0;
            return;
        }
    } else if (c->sample == PX_DROP) {  // more of a dropped request
        c->t_arr = 0;
        c->tls_arr = 0;
        return;
    }
    px_hdr_fill(&e->h, EV_READ, id, a->fd, sk, c, t);
    e->t_est = c->t_est;
    e->t_acc = c->t_acc;
    if (tls) {
        e->t_arr = c->tls_arr;  // its ciphertext's arrival (px_tls_sock_read)
        c->tls_arr = 0;
    } else {
        e->t_arr = c->arr_epoch == c->epoch ? c->t_arr : 0;  // not stamped before a pause
        c->t_arr = 0;
    }
    e->n = ret;
    e->lport = c->lport;
    e->rport = c->rport;
    e->family = c->family;
    __builtin_memcpy(e->laddr, c->laddr, 16);
    __builtin_memcpy(e->raddr, c->raddr, 16);
    e->skipped = c->skipped;
    c->skipped = 0;
    e->caplen = 0;
    if (have && have == len)
        e->caplen = have;  // the decision read it whole
    else if (buf && len > 0 && bpf_probe_read_user(e->data, len, (void *)buf) == 0)
        e->caplen = len;
    u64 size = sizeof(struct px_ev_read) - PX_HEAD_WINDOW + e->caplen;
    px_output(e, size, sizeof(*e), c);
}

// A socket read (the socket hooks or a read syscall's exit).
static __always_inline void px_on_read(struct px_active *a, u64 id, long ret, u64 t) {
    u64 sk = a->sk;
    struct px_conn *c = px_conn_for(id, a->fd, sk);
    if (!c) {
        if (ret > 0)
            px_unfollowed_read(sk);
        return;
    }
    if (ret <= 0) {
        if (ret == 0)
            c->t_arr = 0;  // the FIN's sk_data_ready: no request arrived
        return;
    }
    px_srtt(c, sk);
    if (!(c->tls & PX_TLS_SEEN))
        px_tls_detect(a, id, sk, c, ret);
    if (c->tls & PX_TLS_ON) {
        px_tls_sock_read(c);  // ciphertext: the plaintext comes from SSL_read (tls_uprobes.h)
        return;
    }
    px_on_read_conn(a, c, id, ret, t, 0);
}

// t: when the write began (a chunk's time); t_done: when it returned (the end of a
// response is its last write's return: a blocking write can last seconds).
static __always_inline void px_on_write_conn(struct px_active *a, struct px_conn *c, u64 id,
                                             long ret, u64 t, u64 t_done) {
    if (ret <= 0)
        return;
    if (c->h2 & PX_H2_ON) {
        px_h2_event(a, c, id, ret, t, 1, 0);  // HTTP/2 (http2.h)
        return;
    }
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
        px_sample_head(c, head, t);
        if (c->resp_drop)
            return;  // the response to a request not sampled
        px_hdr_fill(&e->h, EV_RESP, id, a->fd, sk, c, t);
        e->n = ret;
        u64 len = px_clamp(ret, seglen, PX_RESP_WINDOW);
        e->caplen = peek;
        if (len > peek) {  // a head longer than the peek: read it whole
            if (bpf_probe_read_user(e->data, len, (void *)buf) == 0)
                e->caplen = len;
        }
        // an event stream's writes go up with their bytes (proto/stream.h): decided at the
        // response's first body write
        c->stream = c->ws ? PX_STREAM_WS : PX_STREAM_UNSEEN;
        u64 size = sizeof(struct px_ev_resp) - PX_RESP_WINDOW + e->caplen;
        px_output(e, size, sizeof(*e), c);
        return;
    }
    if (c->resp_drop)
        return;  // a body write of a response not sampled
    // WebSocket control frames (close, ping, pong: opcodes 8-10) carry no tokens; counted,
    // a keepalive ping would stretch whichever exchange it follows to the idle time.
    if (c->ws && peek >= 2 && (head[0] & 0x0f) >= 8)
        return;
    if (c->stream == PX_STREAM_UNSEEN)
        c->stream = px_stream_first(head, peek);
    if (c->stream)
        px_body_event(a, c, id, ret, t);  // an LLM stream's write, with its bytes
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
#ifdef PX_HOLDS
    if (!(c->tls & PX_TLS_ON))  // (TLS: SSL_write's plaintext, not the socket's bytes)
        px_hold_write(sk, g, t, t_done);
#endif
    struct px_cfg *cfg = px_cfg_get();
    if (!flags && cfg && cfg->stream_limit_ns && t - g->t_first >= cfg->stream_limit_ns)
        flags = WAGG_PARTIAL;
#ifdef PX_HOLDS
    if (flags == WAGG_END && px_hold_end(g))
        return;  // flushed when its held writes leave (hold.h)
#endif
    if (flags)
        px_flush(id, a->fd, sk, c, t, flags);
}

static __always_inline void px_on_write(struct px_active *a, u64 id, long ret, u64 t,
                                        u64 t_done) {
    if (ret <= 0)
        return;
    struct px_conn *c = px_conn_for(id, a->fd, a->sk);
    if (!c)
        return;
    px_rtx_mark(c, a->sk, (u32)ret, 0, t);  // (tcp.h: a retransmission's wait)
    if (!(c->tls & PX_TLS_ON))  // (TLS: ciphertext; SSL_write gives the plaintext)
        px_on_write_conn(a, c, id, ret, t, t_done);
}
