// The end of a followed read or write, and what the raw syscall path and the socket hooks
// share: the x86-64 syscall ABI (numbers, user pt_regs layout) and accept()'s return.

// The exit of a read/write syscall whose entry recorded *ap (busy).
static __always_inline void px_exit_active(struct px_active *ap, u64 id, long ret) {
    struct px_active a = *ap;
#ifdef PX_TASK_STORAGE
    ap->busy = 0;
#else
    px_active.delete(&id);
#endif
    if (!a.sk)
        return;  // not a socket (or the link tracepoints are missing)
    if (ret < 0)
        return;  // EAGAIN (a server's read after each request) and errors: no lookup
    px_tls_note(id, a.sk, a.kind == KIND_READ);
    u64 t = bpf_ktime_get_ns();
    if (a.kind == KIND_READ)
        px_on_read(&a, id, ret, t);
    else
        px_on_write(&a, id, ret, t, t);
}

static __always_inline void px_exit(long ret) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;  // before the hash lookup: untraced processes stop here
    struct px_active *ap = px_active_get(id);
    if (!ap || !ap->busy)
        return;
    px_exit_active(ap, id, ret);
}

// x86-64 syscall numbers, and the user pt_regs layout, fixed by the syscall entry code and
// the ptrace ABI (not a header-derived kernel struct): r10 at 56, ax 80, dx, si, di at
// 96..119, orig_ax 120. Used by the raw syscall path and by PX_SOCK_HOOKS (the loader
// enables both on x86-64 only). A 32-bit (compat) task's syscall numbers differ: such
// processes are not followed correctly on these paths.
#define PX_NR_READ 0
#define PX_NR_WRITE 1
#define PX_NR_CLOSE 3
#define PX_NR_READV 19
#define PX_NR_WRITEV 20
#define PX_NR_SENDFILE 40
#define PX_NR_ACCEPT 43
#define PX_NR_SENDTO 44
#define PX_NR_RECVFROM 45
#define PX_NR_SENDMSG 46
#define PX_NR_RECVMSG 47
#define PX_NR_ACCEPT4 288
#define PX_REGS_R10 56
#define PX_REGS_AX 80
#define PX_REGS_DX 96
#define PX_REGS_ORIG_AX 120

// The user registers of the syscall in progress, dx (offset 96) to orig_ax (120): its third,
// second and first arguments, and its number.
struct px_uregs {
    u64 dx, si, di, orig_ax;
};

// How a followed read or write syscall passes its buffer: IOV_NONE, IOV_VEC, IOV_MSG; -1 for
// any other syscall (one mapping for the raw syscall path and the socket hooks).
static __always_inline int px_iov_of(u64 nr) {
    if (nr == PX_NR_READ || nr == PX_NR_RECVFROM || nr == PX_NR_WRITE || nr == PX_NR_SENDTO)
        return IOV_NONE;
    if (nr == PX_NR_READV || nr == PX_NR_WRITEV)
        return IOV_VEC;
    if (nr == PX_NR_RECVMSG || nr == PX_NR_SENDMSG)
        return IOV_MSG;
    return -1;
}

static __always_inline int px_nr_reads(u64 nr) {
    return nr == PX_NR_READ || nr == PX_NR_RECVFROM || nr == PX_NR_READV ||
           nr == PX_NR_RECVMSG;
}

// ---- syscalls ---------------------------------------------------------------------

static __always_inline void px_accept_exit(long ret) {
    if (ret < 0)
        return;
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    u64 key = (id & 0xffffffff00000000ULL) | (u32)ret;
    struct px_fd f = {};
    f.t_acc = bpf_ktime_get_ns();
#ifdef PX_LINK_BY_TUPLE
    u64 *up = px_accept_args.lookup(&id);
    if (up) {
        u64 uaddr = *up;
        px_accept_args.delete(&id);
        u8 sa[24] = {};
        if (uaddr && bpf_probe_read_user(sa, sizeof(sa), (void *)uaddr) == 0) {
            struct px_tuple tk = {};
            u16 fam = sa[0] | (sa[1] << 8);
            tk.rport = (sa[2] << 8) | sa[3];  // network order in the sockaddr
            if (fam == PX_AF_INET)
                __builtin_memcpy(tk.raddr, &sa[4], 4);
            else
                __builtin_memcpy(tk.raddr, &sa[8], 16);
            u64 *skp = px_tuples.lookup(&tk);
            if (skp) {
                f.sk = *skp;
                px_tuples.delete(&tk);
                struct px_conn *c = px_conns.lookup(skp);
                if (c && !c->t_acc)
                    c->t_acc = f.t_acc;
            }
        }
    }
#endif
    px_fds.update(&key, &f);
}

#ifdef PX_LINK_BY_TUPLE
static __always_inline void px_accept_enter(u64 uaddr) {
    u64 id = bpf_get_current_pid_tgid();
    if (!px_traced(id >> 32))
        return;
    px_accept_args.update(&id, &uaddr);
}
#endif
