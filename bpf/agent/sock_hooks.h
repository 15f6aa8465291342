// PX_SOCK_HOOKS (x86-64, Linux >= 6.5, the default): no syscall tracepoint at all. Reads
// and writes are seen inside the syscall at sock_recv_length/sock_send_length, the write
// start at tcp_sendmsg_locked (attached lazily), the accept time by a libc uretprobe.

// ---- PX_SOCK_HOOKS: no syscall tracepoint ----------------------------------------------

#ifdef PX_LAZY_SEND_START
// The socket's file lacks O_NONBLOCK: its writes can wait for buffer space (sk->sk_socket
// ->file->f_flags, offsets from BTF). Read once per connection, at its first write.
static __always_inline int px_blocking(u64 sk) {
    u64 sock = 0, file = 0;
    u32 fl = 0;
    if (bpf_probe_read_kernel(&sock, sizeof(sock), (void *)(sk + PX_OFF_SK_SOCKET)) || !sock)
        return 0;
    if (bpf_probe_read_kernel(&file, sizeof(file), (void *)(sock + PX_OFF_SOCKET_FILE)) ||
        !file)
        return 0;
    if (bpf_probe_read_kernel(&fl, sizeof(fl), (void *)(file + PX_OFF_FILE_FLAGS)))
        return 0;
    return !(fl & 04000);  // O_NONBLOCK
}
#endif

// A write that ended without sending (error, or a path not followed): a start stamped for
// it by tcp_sendmsg_locked must not be taken by the socket's next write. No lookup while
// that hook is not attached (nothing can have been stamped): an event-loop server's
// EAGAIN on a full send buffer is common.
static __always_inline void px_send_abandon(u64 sk) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || !cfg->send_start)
        return;
    struct px_conn *c = px_conns.lookup(&sk);
    if (c)
        c->t_send = 0;
}

// A socket read or write of a traced task, from inside the syscall (process context, so
// the pid is the caller's): the syscall's number and arguments come from its user pt_regs.
static __always_inline void px_sock_io(u64 sk, long ret, int is_read) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
#if defined(PX_OFF_TASK_TGID) && defined(PX_OFF_TASK_PID)
    // task->tgid, task->pid by direct loads (BTF offsets, checked by the verifier): the
    // task pointer serves the pt_regs below too, one helper call fewer per traced event
    u64 id = ((u64)*(u32 *)((u64)task + PX_OFF_TASK_TGID) << 32) |
             *(u32 *)((u64)task + PX_OFF_TASK_PID);
#else
    u64 id = bpf_get_current_pid_tgid();
#endif
    if (!px_traced(id >> 32)) {
        if (is_read && px_shed(id >> 32))
            px_paused_read(sk, ret);
        return;
    }
    if (ret < 0) {
        // EAGAIN (a server's read after each request) and errors. A failed blocking
        // write's start must not become the next write's.
        if (!is_read)
            px_send_abandon(sk);
#ifdef PX_HOLDS
        if (!is_read && ret == -11)  // EAGAIN: the send buffer is full
            px_hold_blocked(sk, bpf_ktime_get_ns());
#endif
        return;
    }
    px_tls_note(id, sk, is_read);
    u64 t = bpf_ktime_get_ns();
    u64 regs = (u64)bpf_task_pt_regs(task);
    // A direct load: the verifier knows the pointer (BTF-typed, struct pt_regs) and
    // checks the offsets against the running kernel's BTF; no helper call.
    struct px_uregs r = *(struct px_uregs *)(regs + PX_REGS_DX);
    struct px_active a = {};
    a.sk = sk;
    a.fd = r.di;
    a.buf = r.si;
    a.kind = is_read ? KIND_READ : KIND_WRITE;
    u64 nr = r.orig_ax;
    int iov = px_iov_of(nr);
    if (iov >= 0) {
        a.iov = iov;
        a.vlen = r.dx > 0xffff ? 0xffff : r.dx;  // read only for IOV_VEC
    } else if (nr == PX_NR_SENDFILE && !is_read) {
        a.buf = 0;
        a.kind = KIND_SENDFILE;
    } else {
        if (!is_read)
            px_send_abandon(sk);
        return;  // io_uring, recvmmsg, splice(): not followed (di is no fd there)
    }
    if (is_read) {
        px_on_read(&a, id, ret, t);
        return;
    }
    struct px_conn *c = px_conn_for(id, a.fd, sk);
    if (!c)
        return;
    // the bytes TCP sends and may send again (TLS: the ciphertext), from the write's start
    if (ret > 0)
        px_rtx_mark(c, sk, (u32)ret, 0,
                    c->t_send && c->send_epoch == px_epoch() ? c->t_send : t);
    if (c->tls & PX_TLS_ON) {
        // ciphertext: SSL_write's entry gives the plaintext and the write's start
        c->t_send = 0;
        c->sf_left = 0;
        return;
    }
#ifdef PX_LAZY_SEND_START
    if (!c->mode_seen) {
        c->mode_seen = 1;
        struct px_cfg *cfg = px_cfg_get();
        if (cfg && !cfg->send_start && px_blocking(sk))
            px_count(C_BLOCKING);
    }
#endif
    u64 t_done = t;
    if (c->t_send && c->send_epoch == px_epoch())
        t = c->t_send;  // when the write started (tcp_sendmsg_locked), not ended
    c->t_send = 0;
    if (a.kind == KIND_SENDFILE) {
        // One sendfile() reaches the socket in pipe-sized pieces: one chunk, not one each.
        u64 left = 0;
        if (c->sf_left > 0) {
            a.kind = KIND_SENDFILE_CONT;
            left = c->sf_left;
        } else if (bpf_probe_read_kernel(&left, sizeof(left), (void *)(regs + PX_REGS_R10))) {
            left = 0;  // the count argument (r10): unknown, each piece its own chunk
        }
        c->sf_left = left > (u64)ret ? left - ret : 0;
    } else {
        c->sf_left = 0;  // a new write ends any unfinished sendfile()
    }
    px_on_write_conn(&a, c, id, ret, t, t_done);
}

TRACEPOINT_PROBE(sock, sock_recv_length) {
    if (args->flags & 2)
        return 0;  // MSG_PEEK: the bytes stay queued for the real read
    px_sock_io((u64)args->sk, args->ret, 1);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_send_length) {
    px_sock_io((u64)args->sk, args->ret, 0);
    return 0;
}

#ifdef PX_STATE_BTF
// The same two hooks as BTF tracepoints (agent/kernel/tpbtf.py), where the kernel loads them:
// the arguments come as they are, with no trace record built for them first, and a classic
// program of this hook does not hold the CPU's bpf_prog_active while it runs — during which
// the kernel skips every classic tracepoint program a softirq brings (tcp.h px_state_btf:
// the agent's own, and every other tool's on the node).
int px_recv_btf(u64 *ctx) {
    if ((int)ctx[2] & 2)
        return 0;  // MSG_PEEK
    px_sock_io(ctx[0], (int)ctx[1], 1);
    return 0;
}

int px_send_btf(u64 *ctx) {
    px_sock_io(ctx[0], (int)ctx[1], 0);
    return 0;
}
#endif

#ifdef PX_HAVE_TCP_SENDMSG_LOCKED
// The start of a TCP write, before the copy (sock_send_length fires after it, which for a
// write blocked on a full send buffer is much later). It fires again per segment of a long
// write: the first one is kept until sock_send_length takes it. A raw tracepoint (the
// classic record has no socket address) attached by user space, at once or once a
// followed connection blocks (PX_LAZY_SEND_START): every TCP write on the node runs it.
int px_send_start(struct bpf_raw_tracepoint_args *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;
    u64 sk = ctx->args[0];
#ifdef PX_OFF_MSG_FLAGS
    // A non-blocking write (every event-loop server) never waits for buffer space: its end
    // at sock_send_length is its start within microseconds. Only a blocking one is stamped.
    u32 mflags = 0;
    if (bpf_probe_read_kernel(&mflags, sizeof(mflags), (void *)(ctx->args[1] + PX_OFF_MSG_FLAGS)) == 0 &&
        (mflags & 0x40))  // MSG_DONTWAIT
        return 0;
#endif
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c)
        return 0;
    u32 ep = px_epoch();
    if (!c->t_send || c->send_epoch != ep) {
        c->t_send = bpf_ktime_get_ns();
        c->send_epoch = ep;
    }
    return 0;
}
#endif

// libc's accept()/accept4() returning (a uretprobe, attached by user space to each libc file
// the traced processes map): the new fd and t_acc. Servers that do not call accept through
// libc (Go) are still followed; only their accept-queue wait is unknown.
int px_uret_accept(void *ctx) {
    px_accept_exit((long)((u64 *)ctx)[PX_REGS_AX / 8]);
    return 0;
}
