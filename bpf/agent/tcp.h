// The softirq side, keyed by socket address (these run with whatever task is on the CPU):
// handshake and close (inet_sock_set_state), data arrival (sk_data_ready, also as a BTF
// tracepoint), srtt (tcp_probe where BTF gives no offset), resets, retransmits, SYN-ACK
// retransmits per listening port.

// SYN-ACK retransmits per listening port
BPF_HASH(px_synack, u16, u64, 256);

// SYN-ACK retransmits of a connection not yet established, by its peer and local port (the
// request sock that sends them is not the socket the connection gets): moved into the
// connection at its handshake's end, so that its first request carries them.
struct px_synkey {
    u8 raddr[16];
    u16 rport;
    u16 lport;
    u32 family;
};
struct px_synval {
    u32 n;        // SYN-ACKs sent again
    u32 wait_us;  // their summed wait (px_rtx_add)
    u32 timed;    // how many were timed
    u32 last_us;  // the last one's time (µs, mod 2^32)
};
BPF_TABLE("lru_hash", struct px_synkey, struct px_synval, px_synq, 4096);

static __always_inline void px_synkey_of(struct px_synkey *k, u16 family, const u8 *d4,
                                         const u8 *d6, u16 rport, u16 lport) {
    if (family != PX_AF_INET) {
        __builtin_memcpy(k->raddr, d6, 16);
        u64 hi = 0;
        u32 mid = 0;
        __builtin_memcpy(&hi, k->raddr, 8);
        __builtin_memcpy(&mid, k->raddr + 8, 4);
        if (hi == 0 && (mid == 0 || mid == 0xffff0000)) {
            // An IPv4 peer of a dual-stack listener (v4-mapped, or an IPv6 address left
            // unset): keyed by its IPv4 address, which both tracepoints give, whichever
            // form each has (checked: --dual-stack in tests/agent/netloss.py).
            __builtin_memset(k->raddr, 0, 16);
            family = PX_AF_INET;
        }
    }
    if (family == PX_AF_INET)
        __builtin_memcpy(k->raddr, d4, 4);
    k->rport = rport;
    k->lport = lport;
    k->family = family;
}

// One retransmission's wait: from ``t0_us`` (when the bytes were first sent, at the
// earliest) to now, or from the connection's previous retransmission if that came later —
// so that a segment sent again twice counts the time since its first send once, and
// segments resent together count it once: the wait is the time the connection spent with
// bytes waiting to be sent again.
static __always_inline void px_rtx_add(u32 *wait_us, u32 *timed, u32 last_us, u32 t0_us,
                                       u32 now_us) {
    if (last_us && (s32)(last_us - t0_us) > 0)
        t0_us = last_us;
    s32 d = (s32)(now_us - t0_us);
    *wait_us += d > 0 ? (u32)d : 0;
    *timed += 1;
}

// ---- softirq side: keyed by socket address ----------------------------------------

// Threads of traced processes that are exiting (sched_process_exit runs before the exit
// closes the files): a reset sent from such a thread is the server's, not the peer's.
BPF_TABLE("lru_hash", u64, u8, px_exiting, 1024);

#ifdef PX_HAVE_SCHED_PROCESS_EXIT
TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_followed(id >> 32))
        return 0;
    u8 one = 1;
    px_exiting.update(&id, &one);
#ifdef PX_HAVE_EXIT_GROUP_DEAD
    if (args->group_dead) {
        // The whole process is gone: stop tracing its tgid now, not at the next /proc
        // rescan (a reused pid must not be traced because a previous owner was).
        u32 tgid = id >> 32;
        u8 zero = 0;
        px_pids.update(&tgid, &zero);
    }
#endif
    return 0;
}
#endif

// A closed connection's socket reached a state where it sends nothing again (FIN_WAIT2:
// our FIN and everything before it acknowledged; CLOSE): its final counts to user space
// (EV_TAIL), which holds the connection's last records for them.
static __always_inline void px_tail_end(u64 sk, int ns, u16 lport) {
    if ((ns != TCP_FIN_WAIT2 && ns != TCP_CLOSE) || !px_port_ok(lport))
        return;
    struct px_conn *c = px_tails.lookup(&sk);
    if (!c)
        return;
    struct px_hdr *e = px_events.ringbuf_reserve(sizeof(struct px_hdr));
    if (e) {
        px_hdr_fill(e, EV_TAIL, ((u64)c->tgid) << 32, 0, sk, c, bpf_ktime_get_ns());
        px_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    } else {
        px_lost(0);  // (user space stops waiting for it after a while)
    }
    px_tails.delete(&sk);
}

// A process that opens a listener on a traced port (--port) is traced from then on, in the
// listen() call itself: user space finds it at its next rescan (~1 s; agent/identity/
// processes.py), and a server's requests before that were never seen (a pod restarted under
// a running agent lost its first second). The rescan still does the rest (probes, identity);
// process exit clears the mark (sched_process_exit). Workers it forks wait for the rescan.
static __always_inline void px_trace_listener(u16 lport) {
    struct px_cfg *cfg = px_cfg_get();
    // (only where ports are listed: with --pid alone every port is traced, and the pids
    // named are the ones to trace; without either, every process is)
    if (!cfg || cfg->all_pids || cfg->all_ports || !px_port_ok(lport))
        return;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid == cfg->self_tgid)
        return;
    u8 *v = px_pids.lookup(&tgid);
    if (v && !(*v & PX_PID_TRACED))
        *v |= PX_PID_TRACED;
}

// A TCP socket's state change, as the classic tracepoint gives it or as px_state_btf reads
// it from the socket.
struct px_state {
    u64 sk;
    int os, ns;
    u16 sport, dport, family;
    u8 saddr[4], daddr[4];     // IPv4
    u8 saddr6[16], daddr6[16];  // IPv6 (AF_INET6 only)
};

static __always_inline int px_state_change(struct px_state *st) {
    u64 sk = st->sk;
    int ns = st->ns;
    int os = st->os;
    if (os == TCP_SYN_RECV && ns == TCP_ESTABLISHED) {
        if (!px_port_ok(st->sport))
            return 0;
        struct px_conn c = {};
        c.t_est = bpf_ktime_get_ns();
        c.epoch = px_epoch();
        c.arr_epoch = c.epoch;
        c.ident = c.t_est;
        c.lport = st->sport;
        c.rport = st->dport;
        c.family = st->family;
        if (st->family == PX_AF_INET) {
            __builtin_memcpy(c.laddr, st->saddr, 4);
            __builtin_memcpy(c.raddr, st->daddr, 4);
        } else {
            __builtin_memcpy(c.laddr, st->saddr6, 16);
            __builtin_memcpy(c.raddr, st->daddr6, 16);
        }
#ifdef PX_HAVE_TCP_RETRANSMIT_SYNACK
        struct px_synkey sk_key = {};
        px_synkey_of(&sk_key, st->family, st->daddr, st->daddr6, st->dport, st->sport);
        struct px_synval *sv = px_synq.lookup(&sk_key);
        if (sv) {
            // its SYN-ACKs sent again: the connection's first retransmits (its first
            // request's, in user space)
            c.retrans = sv->n;
            c.rtx_wait_us = sv->wait_us;
            c.rtx_timed = sv->timed;
            c.rtx_last_us = sv->last_us;
            px_synq.delete(&sk_key);
        }
#endif
        px_conns.update(&sk, &c);
        px_count(C_CONNS);
#ifdef PX_LINK_BY_TUPLE
        struct px_tuple tk = {};
        __builtin_memcpy(tk.raddr, c.raddr, 16);
        tk.rport = st->dport;
        px_tuples.update(&tk, &sk);
#endif
        return 0;
    }
    if (ns == TCP_LISTEN || os == TCP_LISTEN) {
        // A child socket is cloned from its listener, LISTEN included, and set to SYN_RECV
        // (inet_csk_clone_lock): once per accepted connection, no listener's change.
        if (ns == TCP_SYN_RECV)
            return 0;
        // listening sockets per port: only connections accepted on one are followed
        px_count(C_LISTEN_CHG);
        if (ns == TCP_LISTEN)
            px_trace_listener(st->sport);
        u32 k = st->sport;
        u32 *n = px_listen.lookup(&k);
        if (n) {
            if (ns == TCP_LISTEN)
                __sync_fetch_and_add(n, 1);
            else if (*n > 0)
                __sync_fetch_and_add(n, -1);
        }
        return 0;
    }
    int peer_fin = ns == TCP_CLOSE_WAIT;
    // Our side's own close transitions: a close() we saw has already ended the connection
    // (sys_enter_close runs first); one still here was closed without it — a process killed
    // or exiting mid-request, or a close by a path we do not trace.
    int closing = (os == TCP_ESTABLISHED && ns == TCP_FIN_WAIT1) ||
                  (os == TCP_CLOSE_WAIT && ns == TCP_LAST_ACK) || ns == TCP_CLOSE;
    if (!peer_fin && !closing) {
        px_tail_end(sk, ns, st->sport);
        return 0;
    }
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c) {
        px_tail_end(sk, ns, st->sport);
        return 0;
    }
    u64 t = bpf_ktime_get_ns();
    u64 owner = ((u64)c->tgid) << 32;
    if (ns == TCP_CLOSE && os == TCP_ESTABLISHED) {
        // A reset while established: the peer's (a client that closes with unread data
        // resets instead of sending a FIN) unless an exiting thread of ours sent it.
        u64 id = bpf_get_current_pid_tgid();
        peer_fin = px_exiting.lookup(&id) == 0;
#if defined(PX_SOCK_HOOKS) && defined(PX_HAVE_TCP_RECEIVE_RESET)
        // No close() is seen on this path: a server's abortive close (unread data,
        // SO_LINGER 0) makes this transition too. Only a received reset is the peer's.
        peer_fin = c->peer_rst;
#endif
    }
    if (peer_fin) {
        // The peer is gone: its FIN (CLOSE_WAIT) or its RST.
        px_hdr_event(EV_PEER_FIN, owner, 0, sk, c, t);
    }
    if (!closing)
        return 0;
    u32 type = EV_SOCK_CLOSE;
#ifdef PX_SOCK_HOOKS
    // No close() is seen on this path: the app's own close is this transition, unless an
    // exiting thread of the process makes it (a server killed or exiting mid-request).
    u64 cur = bpf_get_current_pid_tgid();
    if (px_exiting.lookup(&cur) == 0)
        type = EV_CLOSE;
#endif
    if (type == EV_SOCK_CLOSE)
        px_count(C_SOCK_CLOSE);
    u64 fdkey = c->fdkey;
    px_flush(owner, (u32)fdkey, sk, c, t, WAGG_CLOSE);
    px_hdr_event(type, owner, (u32)fdkey, sk, c, t);
    struct px_fd *f = px_fds.lookup(&fdkey);
    if (f && f->sk == sk)
        px_fds.delete(&fdkey);
    px_tail_keep(sk, c, t);
    px_conn_forget(sk);
    px_tail_end(sk, ns, st->sport);  // (a reset: the socket ended with the close)
    return 0;
}

// Attached by bcc; replaced by px_state_btf where the kernel loads that (agent/kernel/tpbtf.py).
TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != PX_IPPROTO_TCP)
        return 0;
    struct px_state s = {};
    s.sk = (u64)args->skaddr;
    s.os = args->oldstate;
    s.ns = args->newstate;
    s.sport = args->sport;
    s.dport = args->dport;
    s.family = args->family;
    __builtin_memcpy(s.saddr, args->saddr, 4);
    __builtin_memcpy(s.daddr, args->daddr, 4);
    __builtin_memcpy(s.saddr6, args->saddr_v6, 16);
    __builtin_memcpy(s.daddr6, args->daddr_v6, 16);
    return px_state_change(&s);
}

#ifdef PX_STATE_BTF
// inet_sock_set_state as a BTF tracepoint (tp_btf), loaded by agent/kernel/tpbtf.py. Why:
// the kernel runs a classic tracepoint's program only if no other kprobe, tracepoint or
// perf program is running on that CPU (bpf_prog_active), and a softirq's state change often
// lands on top of one — the agent's own socket hooks run on every socket read and write of
// the node. The handshake's end skipped so, the connection was never followed: its requests
// went unrecorded, uncounted (tests/agent/test_netloss.py, beside another agent). A tp_btf
// program is skipped only when it interrupts itself. The socket's fields by direct loads
// (their offsets from the kernel's BTF); the IPv6 addresses copied, for an IPv6 socket.
// The local port as the classic records give it: inet_sock.inet_sport (past struct sock,
// so read with a helper), which outlives skc_num — released, 0, by the time a closed
// socket's last state changes come.
static __always_inline u16 px_sk_sport(u64 sk) {
    u16 be = 0;
    bpf_probe_read_kernel(&be, sizeof(be), (void *)(sk + PX_OFF_INET_SPORT));
    return __builtin_bswap16(be);  // (network order; x86)
}

int px_state_btf(u64 *ctx) {
    u64 sk = ctx[0];
    if (*(u16 *)(sk + PX_OFF_SK_PROTOCOL) != PX_IPPROTO_TCP)
        return 0;
    struct px_state s = {};
    s.sk = sk;
    s.os = (int)ctx[1];
    s.ns = (int)ctx[2];
    s.sport = px_sk_sport(sk);
    s.dport = __builtin_bswap16(*(u16 *)(sk + PX_OFF_SKC_DPORT));  // (network order; x86)
    s.family = *(u16 *)(sk + PX_OFF_SKC_FAMILY);
    u32 a = *(u32 *)(sk + PX_OFF_SKC_RCV_SADDR);
    __builtin_memcpy(s.saddr, &a, 4);
    a = *(u32 *)(sk + PX_OFF_SKC_DADDR);
    __builtin_memcpy(s.daddr, &a, 4);
    if (s.family != PX_AF_INET) {
        bpf_probe_read_kernel(s.saddr6, 16, (void *)(sk + PX_OFF_SKC_V6_RCV_SADDR));
        bpf_probe_read_kernel(s.daddr6, 16, (void *)(sk + PX_OFF_SKC_V6_DADDR));
    }
    return px_state_change(&s);
}
#endif

#ifdef PX_HAVE_SK_DATA_READY
static __always_inline void px_data_ready(u64 sk, struct px_cfg *cfg) {
    struct px_conn *c = px_conns.lookup(&sk);
    if (c && (c->t_arr == 0 || c->arr_epoch != cfg->epoch)) {
        c->t_arr = bpf_ktime_get_ns();
        c->arr_epoch = cfg->epoch;
    }
}

// Attached by bcc; replaced by px_sdr_btf where the kernel loads that (agent/tpbtf.py).
TRACEPOINT_PROBE(sock, sk_data_ready) {
    u64 sk = (u64)args->skaddr;
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;  // nothing while paused (a request read meanwhile is not timed)
    px_data_ready(sk, cfg);
    return 0;
}

#ifdef PX_SDR_BTF
// sk_data_ready as a BTF tracepoint (tp_btf), loaded by agent/tpbtf.py: its socket argument
// is a typed pointer, so the local port is a direct load from the socket's first cache
// line, which the network stack has just used. With at most PX_CFG_PORTS traced ports
// (px_cfg.nports), sockets on other ports — the node's clients, the servers' own outbound
// connections streaming from their backends — stop there, before any map lookup.
int px_sdr_btf(u64 *ctx) {
    u64 sk = ctx[0];
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;
    u32 n = cfg->nports;
    if (n) {
        u16 num = *(u16 *)(sk + PX_OFF_SKC_NUM);
        int hit = 0;
#pragma unroll
        for (int i = 0; i < PX_CFG_PORTS; i++)
            hit |= i < n && cfg->ports[i] == num;
        if (!hit)
            return 0;
    }
    px_data_ready(sk, cfg);
    return 0;
}
#endif
#endif

#if defined(PX_HAVE_TCP_PROBE) && !defined(PX_OFF_TCP_SRTT)
TRACEPOINT_PROBE(tcp, tcp_probe) {
    // the port first (an inlined array lookup): client-side segments stop here
    if (!px_port_ok(args->sport))
        return 0;
    u64 sk = (u64)args->skaddr;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c) {
        // A connection older than the agent, seen at its next segment with data. Only on a
        // listening port: a traced process's outbound connections (to its database, its
        // LLM backend) are not requests it serves.
        if (args->data_len == 0)
            return 0;
        u32 lk = args->sport;
        u32 *ln = px_listen.lookup(&lk);
        if (!ln || *ln == 0)
            return 0;
        struct px_conn nc = {};
        px_conn_stamp(&nc);
        nc.lport = args->sport;
        nc.rport = args->dport;
        nc.family = args->family;
        if (args->family == PX_AF_INET) {
            __builtin_memcpy(nc.laddr, (u8 *)args->saddr + 4, 4);
            __builtin_memcpy(nc.raddr, (u8 *)args->daddr + 4, 4);
        } else {
            __builtin_memcpy(nc.laddr, (u8 *)args->saddr + 8, 16);
            __builtin_memcpy(nc.raddr, (u8 *)args->daddr + 8, 16);
        }
        px_conns.update(&sk, &nc);
        c = px_conns.lookup(&sk);
        if (!c)
            return 0;
        px_count(C_CONNS);
    }
    c->srtt_us = args->srtt;  // already microseconds (tp->srtt_us >> 3)
#ifndef PX_HAVE_SK_DATA_READY
    if (args->data_len && (c->t_arr == 0 || c->arr_epoch != px_epoch())) {
        c->t_arr = bpf_ktime_get_ns();
        c->arr_epoch = px_epoch();
    }
#endif
    return 0;
}
#endif

#if defined(PX_SOCK_HOOKS) && defined(PX_HAVE_TCP_RECEIVE_RESET)
static __always_inline int px_reset_received(u64 sk) {
    struct px_conn *c = px_conns.lookup(&sk);
    if (c)
        c->peer_rst = 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_receive_reset) {
    return px_reset_received((u64)args->skaddr);
}

#ifdef PX_STATE_BTF
int px_reset_btf(u64 *ctx) {  // (tp_btf: see px_state_btf)
    return px_reset_received(ctx[0]);
}
#endif
#endif

#ifdef PX_HAVE_TCP_RETRANSMIT_SKB
// The segments a retransmitted skb carries, as the kernel's TcpRetransSegs counts them
// (tcp_skb_pcount: skb_shinfo(skb)->gso_segs, the shared info at skb->head + skb->end).
static __always_inline u32 px_rtx_segs(u64 skb) {
#ifdef PX_RTX_SEGS
    u64 head = 0;
    u32 end = 0;
    u16 segs = 0;
    if (bpf_probe_read_kernel(&head, sizeof(head), (void *)(skb + PX_OFF_RTX_SKB_HEAD)) ||
        !head ||
        bpf_probe_read_kernel(&end, sizeof(end), (void *)(skb + PX_OFF_RTX_SKB_END)) ||
        bpf_probe_read_kernel(&segs, sizeof(segs), (void *)(head + end + PX_OFF_RTX_GSO_SEGS)) ||
        !segs)
        return 1;
    return segs;
#else
    return 1;
#endif
}

// The retransmitted bytes' first send cannot precede the start of the write that queued
// them: the connection's marks (state.h px_rtx_mark) give it for its last writes and its
// FIN; bytes older than those are counted, not timed.
static __always_inline void px_rtx_wait(struct px_conn *c, u64 skb, u32 now_us) {
#ifdef PX_RTX_DATA_WAIT
    u32 seq = 0;  // TCP_SKB_CB(skb)->seq: the first member of the skb's control block
    if (bpf_probe_read_kernel(&seq, sizeof(seq), (void *)(skb + PX_OFF_RTX_SKB_CB)))
        return;
    u32 t0 = 0;
    int found = 0;
#pragma unroll
    for (int i = 0; i < PX_MARKS; i++) {
        u32 st = c->mk_start[i], en = c->mk_end[i];
        if (st != en && (s32)(seq - st) >= 0 && (s32)(en - seq) > 0) {
            t0 = c->mk_us[i];
            found = 1;
        }
    }
    // Bytes of a write still in progress (resent while the app's send call runs: the ACKs
    // it processes trigger a fast retransmit): that write's start, where it was stamped
    // (tcp_sendmsg_locked, a blocking socket: sock_hooks.h); else not timed (its wait is
    // within the send call's duration, which nothing here knows).
    u32 newest = c->mk_end[(c->mk_i - 1) & (PX_MARKS - 1)];
    if (!found && c->t_send && c->send_epoch == px_epoch() &&
        (c->mk_i == 0 || (s32)(seq - newest) >= 0)) {
        t0 = (u32)(c->t_send / 1000);
        found = 1;
    }
    if (found)
        px_rtx_add(&c->rtx_wait_us, &c->rtx_timed, c->rtx_last_us, t0, now_us);
#endif
}

static __always_inline int px_retransmit(u64 sk, u16 sport, u64 skb) {
    if (!px_port_ok(sport))
        return 0;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c) {
        c = px_tails.lookup(&sk);  // closed by the app, its last bytes or FIN resent
        if (!c)
            return 0;
    }
    u32 now_us = (u32)(bpf_ktime_get_ns() / 1000);
    c->retrans += px_rtx_segs(skb);
    px_rtx_wait(c, skb, now_us);
    c->rtx_last_us = now_us ? now_us : 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
#ifdef PX_HAVE_RETRANSMIT_ERR
    if (args->err)
        return 0;  // not sent (still in the host's queue, no memory, no route): no resend
#endif
    return px_retransmit((u64)args->skaddr, args->sport, (u64)args->skbaddr);
}

#ifdef PX_STATE_BTF
int px_rtx_btf(u64 *ctx) {  // (tp_btf: see px_state_btf)
#ifdef PX_HAVE_RETRANSMIT_ERR
    if ((int)ctx[2])
        return 0;
#endif
    u64 sk = ctx[0];
    return px_retransmit(sk, px_sk_sport(sk), ctx[1]);
}
#endif
#endif

#ifdef PX_HAVE_TCP_RETRANSMIT_SYNACK
// A SYN-ACK sent again: ``req`` the request sock; its ports and peer, the listener's family.
static __always_inline int px_synack_again(u64 req, u16 port, u16 dport, u16 family,
                                           const u8 *daddr, const u8 *daddr6) {
    if (!px_port_ok(port))
        return 0;
    u64 one = 1;
    u64 *v = px_synack.lookup(&port);
    if (v)
        __sync_fetch_and_add(v, 1);
    else
        px_synack.update(&port, &one);
    // ... and per connection to come (its first request carries them)
    struct px_synkey k = {};
    px_synkey_of(&k, family, daddr, daddr6, dport, port);
    struct px_synval zero = {};
    struct px_synval *sv = px_synq.lookup_or_try_init(&k, &zero);
    if (!sv)
        return 0;
    u32 now_us = (u32)(bpf_ktime_get_ns() / 1000);
    sv->n += 1;
#ifdef PX_RTX_SYN_WAIT
    // tcp_request_sock.snt_synack: the first SYN-ACK's send time (tcp_clock_us, the same
    // CLOCK_MONOTONIC as bpf_ktime_get_ns)
    u64 first = 0;
    if (bpf_probe_read_kernel(&first, sizeof(first), (void *)(req + PX_OFF_RTX_SNT_SYNACK)) ==
            0 &&
        first)
        px_rtx_add(&sv->wait_us, &sv->timed, sv->last_us, (u32)first, now_us);
#endif
    sv->last_us = now_us ? now_us : 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_synack) {
    // (copied out: the verifier refuses a read of the context through a moved pointer)
    u8 daddr[4], daddr6[16];
    __builtin_memcpy(daddr, args->daddr, 4);
    __builtin_memcpy(daddr6, args->daddr_v6, 16);
    return px_synack_again((u64)args->req, args->sport, args->dport, args->family, daddr,
                           daddr6);
}

#ifdef PX_STATE_BTF
// (tp_btf: see px_state_btf) A request sock begins with a sock_common: its local port, peer
// port and addresses at the same offsets as a socket's.
int px_synack_btf(u64 *ctx) {
    u64 req = ctx[1];
    u8 daddr[4] = {}, daddr6[16] = {};
    u32 a = *(u32 *)(req + PX_OFF_SKC_DADDR);
    __builtin_memcpy(daddr, &a, 4);
    u16 family = *(u16 *)(ctx[0] + PX_OFF_SKC_FAMILY);
    if (family != PX_AF_INET)
        bpf_probe_read_kernel(daddr6, 16, (void *)(req + PX_OFF_SKC_V6_DADDR));
    u16 dport = __builtin_bswap16(*(u16 *)(req + PX_OFF_SKC_DPORT));  // (network order; x86)
    return px_synack_again(req, *(u16 *)(req + PX_OFF_SKC_NUM), dport, family, daddr, daddr6);
}
#endif
#endif
