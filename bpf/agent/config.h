// What to trace: the agent's configuration line (px_config), the traced processes and
// ports, the listening-socket counts, the counters, and the filters every hook calls first.

// All-zero (as between attach and user space's first write) means "trace nothing": bcc
// attaches the programs before the agent can fill its maps, and a filter that defaulted to
// off would follow every process on the node for those milliseconds.
#define PX_CFG_PORTS 8
struct px_cfg {
    u32 all_pids;   // 1: every process (no --pid/--port given)
    u32 all_ports;  // 1: every local port (no --port given)
    u64 stream_limit_ns;
    u32 paused;  // trace nothing until the agent clears it: 1 set by the agent, 2 by a full ring
    // Incremented by the agent at each resume. State written before it (a connection's
    // framing, its pending arrival, a thread's write start) is stale after a pause: the
    // paused path does no work at all, so staleness is found by the epoch instead.
    u32 epoch;
    // 1 once px_send_start is attached. Only a blocking write needs its start stamped, and
    // event-loop servers never make one: with the socket's file flags readable (BTF) the
    // agent attaches that hook only after a followed connection turns out to block.
    u32 send_start;
    // The traced local ports when there are at most PX_CFG_PORTS of them (else 0: see
    // px_ports): sk_data_ready compares a socket's port with them on this line, which
    // every program reads anyway, instead of looking the socket up.
    u32 nports;
    u16 ports[PX_CFG_PORTS];
    // Per-request sampling (sample.h): OpenTelemetry's rejection threshold on 32 bits; a
    // request is kept when its randomness >= it. 0 keeps every request.
    u32 sample_th;
    // The agent's own tgid: with every process traced, not the agent's (its /metrics and
    // health endpoints would become records of its own).
    u32 self_tgid;
};

BPF_ARRAY(px_config, struct px_cfg, 1);
// Traced tgids as a flat array indexed by tgid: the verifier inlines array lookups, so an
// untraced process pays a load and a compare per hook, not a hash helper call.
BPF_ARRAY(px_pids, u8, PX_PID_MAX);
BPF_ARRAY(px_ports, u8, 65536);  // traced local ports: an inlined lookup, like px_pids
// Listening sockets per local port (kept by inet_sock_set_state, seeded from /proc): only
// server-side connections are followed, never a traced process's outbound ones.
BPF_ARRAY(px_listen, u32, 65536);

// the kernel's counters, summed by user space (agent/loader.py COUNTERS)
BPF_PERCPU_ARRAY(px_counters, u64, C_NCOUNTERS);

static __always_inline void px_count(u32 idx) {
    u64 *v = px_counters.lookup(&idx);
    if (v)
        *v += 1;
}

static __always_inline struct px_cfg *px_cfg_get(void) {
    u32 zero = 0;
    return px_config.lookup(&zero);
}

static __always_inline u32 px_epoch(void) {
    struct px_cfg *cfg = px_cfg_get();
    return cfg ? cfg->epoch : 0;
}

static __always_inline int px_pid_on(struct px_cfg *cfg, u32 tgid) {
    if (cfg->all_pids)
        return tgid != cfg->self_tgid;
    u8 *v = px_pids.lookup(&tgid);
    return v && *v;
}

// The earliest exit: two inlined array lookups for an untraced process.
static __always_inline int px_traced(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || cfg->paused)
        return 0;
    return px_pid_on(cfg, tgid);
}

// A process we trace while tracing is paused (the agent shedding load).
static __always_inline int px_shed(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg || !cfg->paused)
        return 0;
    return px_pid_on(cfg, tgid);
}

// A process we trace, paused or not (process exit must be seen either way).
static __always_inline int px_followed(u32 tgid) {
    struct px_cfg *cfg = px_cfg_get();
    return cfg && px_pid_on(cfg, tgid);
}

static __always_inline int px_port_ok(u16 lport) {
    struct px_cfg *cfg = px_cfg_get();
    if (!cfg)
        return 0;
    if (cfg->all_ports)
        return 1;
    u32 k = lport;
    u8 *v = px_ports.lookup(&k);
    return v && *v;
}
