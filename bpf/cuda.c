// Parallax GPU program: the CUDA driver API seen from the host (bcc uprobes on libcuda.so.1).
// A program of its own, beside agent.c: compiled and attached only where a traced service
// has GPU processes (agent/gpu/cuda.py).
//
// What it sees is *enqueue* time on the host: a kernel launch returns long before the
// kernel runs. What the GPU itself does comes from NVML (agent/gpu/nvml.py).
//   px_cu_launch  entry of cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchKernelEx(_ptsz)
//   px_cu_graph   entry of cuGraphLaunch(_ptsz)
//   px_cu_wait_enter / px_cu_wait_exit  entry and return of the calls that block a host
//                 thread on the GPU: cuStreamSynchronize, cuCtxSynchronize,
//                 cuEventSynchronize, cuMemcpyDtoH_v2
//
// Aggregated in the kernel, never one event per launch (an LLM decode step launches
// hundreds of kernels): per (process, time bucket of 2^PX_GPU_BUCKET_SHIFT ns) the launch
// counts with the first and last launch time, and the host-wait intervals — the union over
// the process's threads, computed here — that ended in the bucket: their total, earliest
// start, latest end and number. User space reads the buckets that can no longer change
// (agent/gpu/cuda.py) and attributes them to request windows (agent/gpu/attribution.py):
// the first/last times make a bucket exact unless a window boundary falls between two
// launches of the same bucket.
//
// The loader defines, with -D:
//   PX_GPU_PID_MAX       size of the pid filter (the kernel's pid_max)
//   PX_GPU_BUCKETS       entries of the bucket table
//   PX_GPU_BUCKET_SHIFT  log2 of the bucket width in ns

#define PX_GPU_DROPPED 0    // a bucket could not be created: the table was full
#define PX_GPU_UNMATCHED 1  // a wait return without its entry (attached mid-call)
#define PX_GPU_NCOUNTERS 2
#define PX_GPU_MAX_DEPTH 8  // nested waits (a driver call reaching another probed one)

struct px_gpu_key {
    u32 tgid;
    u32 pad;
    u64 bucket;  // monotonic ns >> PX_GPU_BUCKET_SHIFT
};

struct px_gpu_agg {
    u64 launches;    // kernel launches
    u64 graphs;      // graph launches
    u64 t_first;     // first and last launch in the bucket (monotonic ns)
    u64 t_last;
    u64 wait_ns;     // union host-wait intervals that ended in this bucket: total length,
    u64 wait_first;  // the earliest start among them,
    u64 wait_last;   // the latest end,
    u32 waits;       // and how many
    u32 pad;
};

struct px_gpu_thread {
    u64 start;  // the outermost wait's entry
    u32 depth;
    u32 pad;
};

struct px_gpu_union {
    u64 since;  // when the first of the process's threads began to wait
    u64 n;      // threads waiting now (64-bit: the BPF backend returns a fetch-and-add's
                // old value for 64-bit operands only)
};

// The service's GPU processes, by tgid (a flat array: an inlined lookup, as in agent.c). A
// uprobe runs in every process mapping the probed file, traced or not.
BPF_ARRAY(px_gpu_pids, u8, PX_GPU_PID_MAX);
BPF_HASH(px_gpu_aggs, struct px_gpu_key, struct px_gpu_agg, PX_GPU_BUCKETS);
BPF_TABLE("lru_hash", u64, struct px_gpu_thread, px_gpu_threads, 16384);
BPF_HASH(px_gpu_unions, u32, struct px_gpu_union, 4096);
BPF_PERCPU_ARRAY(px_gpu_counters, u64, PX_GPU_NCOUNTERS);

static __always_inline void px_gpu_count(u32 idx) {
    u64 *v = px_gpu_counters.lookup(&idx);
    if (v)
        *v += 1;
}

static __always_inline int px_gpu_traced(u32 tgid) {
    u8 *on = px_gpu_pids.lookup(&tgid);
    return on && *on;
}

static __always_inline struct px_gpu_agg *px_gpu_bucket(u32 tgid, u64 t) {
    struct px_gpu_key k = {};
    k.tgid = tgid;
    k.bucket = t >> PX_GPU_BUCKET_SHIFT;
    struct px_gpu_agg *a = px_gpu_aggs.lookup(&k);
    if (a)
        return a;
    struct px_gpu_agg zero = {};
    px_gpu_aggs.update(&k, &zero);  // (another CPU may have created it meanwhile: fine)
    a = px_gpu_aggs.lookup(&k);
    if (!a)
        px_gpu_count(PX_GPU_DROPPED);
    return a;
}

static __always_inline void px_gpu_launch(int graph) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!px_gpu_traced(tgid))
        return;
    u64 t = bpf_ktime_get_ns();
    struct px_gpu_agg *a = px_gpu_bucket(tgid, t);
    if (!a)
        return;
    if (graph)
        __sync_fetch_and_add(&a->graphs, 1);
    else
        __sync_fetch_and_add(&a->launches, 1);
    // threads of one process may launch at once: first/last are kept as min/max, and a
    // lost race moves them by the few nanoseconds between the two launches
    if (a->t_first == 0 || t < a->t_first)
        a->t_first = t;
    if (t > a->t_last)
        a->t_last = t;
}

int px_cu_launch(struct pt_regs *ctx) {
    px_gpu_launch(0);
    return 0;
}

int px_cu_graph(struct pt_regs *ctx) {
    px_gpu_launch(1);
    return 0;
}

int px_cu_wait_enter(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!px_gpu_traced(tgid))
        return 0;
    u64 t = bpf_ktime_get_ns();
    struct px_gpu_thread *th = px_gpu_threads.lookup(&id);
    if (th && th->depth) {
        if (th->depth < PX_GPU_MAX_DEPTH)
            th->depth += 1;  // nested: only the outermost call counts
        return 0;
    }
    struct px_gpu_thread nt = {};
    nt.start = t;
    nt.depth = 1;
    px_gpu_threads.update(&id, &nt);
    struct px_gpu_union *u = px_gpu_unions.lookup(&tgid);
    if (!u) {
        struct px_gpu_union zero = {};
        px_gpu_unions.update(&tgid, &zero);
        u = px_gpu_unions.lookup(&tgid);
        if (!u)
            return 0;
    }
    if (__sync_fetch_and_add(&u->n, 1) == 0)
        u->since = t;
    return 0;
}

int px_cu_wait_exit(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!px_gpu_traced(tgid))
        return 0;
    struct px_gpu_thread *th = px_gpu_threads.lookup(&id);
    if (!th || !th->depth) {
        px_gpu_count(PX_GPU_UNMATCHED);
        return 0;
    }
    if (th->depth > 1) {
        th->depth -= 1;
        return 0;
    }
    th->depth = 0;
    u64 t = bpf_ktime_get_ns();
    struct px_gpu_union *u = px_gpu_unions.lookup(&tgid);
    if (!u || u->n == 0)
        return 0;
    if (__sync_fetch_and_add(&u->n, (u64)-1) != 1)
        return 0;  // another thread still waits: the union interval goes on
    u64 since = u->since;
    if (since == 0 || since > t)
        return 0;
    struct px_gpu_agg *a = px_gpu_bucket(tgid, t);
    if (!a)
        return 0;
    __sync_fetch_and_add(&a->wait_ns, t - since);
    __sync_fetch_and_add(&a->waits, 1);
    if (a->wait_first == 0 || since < a->wait_first)
        a->wait_first = since;
    if (t > a->wait_last)
        a->wait_last = t;
    return 0;
}
