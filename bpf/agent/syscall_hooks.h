// Without PX_SOCK_HOOKS: reads and writes seen through syscall tracepoints, raw
// (raw_syscalls:sys_enter/exit, x86-64) or per syscall, linked to their socket by
// sock_*_length (Linux >= 6.3) or, before, by the accept peer's 4-tuple. Every syscall on
// the node pays for these hooks: the socket hooks are preferred where the kernel allows.

#ifndef PX_RAW_SYSCALLS
#ifdef PX_LINK_BY_TUPLE
#ifdef PX_HAVE_SYS_ENTER_ACCEPT4
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) {
    px_accept_enter((u64)args->upeer_sockaddr);
    return 0;
}
#endif
#ifdef PX_HAVE_SYS_ENTER_ACCEPT
TRACEPOINT_PROBE(syscalls, sys_enter_accept) {
    px_accept_enter((u64)args->upeer_sockaddr);
    return 0;
}
#endif
#endif

TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { px_accept_exit(args->ret); return 0; }
#ifdef PX_HAVE_SYS_EXIT_ACCEPT
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { px_accept_exit(args->ret); return 0; }
#endif

// A read or write syscall's tracepoints: the enter marks it in flight (the fd, the buffer
// or iovec array the args name, the kind, the iovec shape, the vlen), the exit ends it.
#define PX_IO_SYSCALL(name, fd_arg, buf, kind, iov, vlen)                                \
    TRACEPOINT_PROBE(syscalls, sys_enter_##name) {                                       \
        px_enter(args->fd_arg, buf, kind, iov, vlen);                                    \
        return 0;                                                                        \
    }                                                                                    \
    TRACEPOINT_PROBE(syscalls, sys_exit_##name) { px_exit(args->ret); return 0; }

PX_IO_SYSCALL(read, fd, (u64)args->buf, KIND_READ, IOV_NONE, 0)
#ifdef PX_HAVE_SYS_ENTER_READV
PX_IO_SYSCALL(readv, fd, (u64)args->vec, KIND_READ, IOV_VEC, args->vlen)
#endif
#ifdef PX_HAVE_SYS_ENTER_RECVFROM
PX_IO_SYSCALL(recvfrom, fd, (u64)args->ubuf, KIND_READ, IOV_NONE, 0)
#endif
#ifdef PX_HAVE_SYS_ENTER_RECVMSG
PX_IO_SYSCALL(recvmsg, fd, (u64)args->msg, KIND_READ, IOV_MSG, 0)
#endif
PX_IO_SYSCALL(write, fd, (u64)args->buf, KIND_WRITE, IOV_NONE, 0)
#ifdef PX_HAVE_SYS_ENTER_WRITEV
PX_IO_SYSCALL(writev, fd, (u64)args->vec, KIND_WRITE, IOV_VEC, args->vlen)
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDTO
PX_IO_SYSCALL(sendto, fd, (u64)args->buff, KIND_WRITE, IOV_NONE, 0)
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDMSG
PX_IO_SYSCALL(sendmsg, fd, (u64)args->msg, KIND_WRITE, IOV_MSG, 0)
#endif
#ifdef PX_HAVE_SYS_ENTER_SENDFILE64
PX_IO_SYSCALL(sendfile64, out_fd, 0, KIND_SENDFILE, IOV_NONE, 0)
#endif
#endif  // !PX_RAW_SYSCALLS

static __always_inline void px_close(u32 fd) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    u64 key = (id & 0xffffffff00000000ULL) | fd;
    struct px_fd *f = px_fds.lookup(&key);
    if (!f)
        return;
    u64 sk = f->sk;
    px_fds.delete(&key);
    if (!sk)
        return;
    struct px_conn *c = px_conns.lookup(&sk);
    if (!c)
        return;
    px_conn_end(id, fd, sk, c, bpf_ktime_get_ns());
}

#ifdef PX_RAW_SYSCALLS
// raw_syscalls:sys_enter/sys_exit, one program each, switching on the syscall number: the
// kernel builds no per-syscall trace record (that record building is most of what syscall
// tracepoints cost every process on the node). x86-64 only (the loader checks).
RAW_TRACEPOINT_PROBE(sys_enter) {
    // The syscall number first (in the context, no helper call): every other syscall of
    // every task stops at this switch.
    long nr = ctx->args[1];
    switch (nr) {
    case PX_NR_READ: case PX_NR_WRITE: case PX_NR_CLOSE: case PX_NR_READV: case PX_NR_WRITEV:
    case PX_NR_SENDFILE: case PX_NR_SENDTO: case PX_NR_RECVFROM: case PX_NR_SENDMSG:
    case PX_NR_RECVMSG: case PX_NR_ACCEPT: case PX_NR_ACCEPT4:
        break;
    default:
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;
    struct px_uregs r = {};
    if (bpf_probe_read_kernel(&r, sizeof(r), (void *)(ctx->args[0] + PX_REGS_DX)))
        return 0;
    u32 fd = r.di;
    int iov = px_iov_of(nr);
    if (iov >= 0) {  // vlen (dx) is read only for IOV_VEC
        px_enter_id(id, fd, r.si, px_nr_reads(nr) ? KIND_READ : KIND_WRITE, iov, r.dx);
        return 0;
    }
    switch (nr) {
    case PX_NR_SENDFILE:
        px_enter_id(id, fd, 0, KIND_SENDFILE, IOV_NONE, 0);
        break;
    case PX_NR_CLOSE:
        px_close(fd);
        break;
    case PX_NR_ACCEPT: case PX_NR_ACCEPT4:
        // marked in flight like a read/write: the exit then needs no syscall number
#ifdef PX_LINK_BY_TUPLE
        px_accept_enter(r.si);
#endif
        px_enter_id(id, fd, r.si, KIND_ACCEPT, IOV_NONE, 0);
        break;
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return 0;  // untraced tasks: the program call and two inlined array lookups
    // A traced thread: one task-storage lookup; without a syscall of ours in flight (its
    // epoll_wait, its file I/O) that is all — the syscall number is never read here.
    struct px_active *ap = px_active_get(id);
    if (!ap || !ap->busy) {
#ifdef PX_LINK_BY_TUPLE
        // Before Linux 6.3 an accept() that entered before the programs attached must still
        // record its fd (the only fd->socket link there): read the number in that case.
        u64 nr = 0;
        if (bpf_probe_read_kernel(&nr, sizeof(nr), (void *)(ctx->args[0] + PX_REGS_ORIG_AX)))
            return 0;
        if (nr == PX_NR_ACCEPT || nr == PX_NR_ACCEPT4)
            px_accept_exit(ctx->args[1]);
#endif
        return 0;
    }
    if (ap->kind == KIND_ACCEPT) {
        ap->busy = 0;
#ifndef PX_TASK_STORAGE
        px_active.delete(&id);
#endif
        px_accept_exit(ctx->args[1]);
        return 0;
    }
    px_exit_active(ap, id, ctx->args[1]);
    return 0;
}
#else  // per-syscall tracepoints (other architectures, kernels without raw tracepoints)

TRACEPOINT_PROBE(syscalls, sys_enter_close) {
    px_close(args->fd);
    return 0;
}
#endif

// ---- fd <-> socket link (inside the syscall, Linux >= 6.3) ----------------------------

// Measured side by side as raw tracepoints too (no trace record): no better here — their
// classic records are a few fields — so the classic ones stay (docs/agent.md).
#ifdef PX_HAVE_SOCK_RECV_LENGTH
TRACEPOINT_PROBE(sock, sock_recv_length) { px_link(args->sk, args->ret, 1); return 0; }
#endif
#ifdef PX_HAVE_SOCK_SEND_LENGTH
TRACEPOINT_PROBE(sock, sock_send_length) { px_link(args->sk, args->ret, 0); return 0; }
#endif
