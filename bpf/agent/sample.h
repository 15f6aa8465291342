// Per-request sampling, decided here at a request's first read with data, and the exact
// count of every request per port, sampled or not (docs/agent.md, "Sampling").
//
// px_cfg.sample_th is OpenTelemetry's rejection threshold, on 32 bits: a request is kept
// when its randomness R >= sample_th (keep probability (2^32 - th) / 2^32; 0 keeps all).
// R is the top 32 of the 56 random bits of the request's W3C trace id where its head
// carries a `traceparent` in the first PX_TP_SCAN bytes — so the hops of one request (a
// proxy and the app behind it) are kept or dropped together, as OpenTelemetry's consistent
// probability sampling does — else a fresh random number: uniform, independent of time.
//
// A connection's state (px_conn.sample): 0 = the next read with data starts a request and
// decides; PX_KEEP or PX_DROP until a final response head is written (then 0 again; a 1xx
// informational head does not end the request, and after "101" the WebSocket frames
// follow the upgrade's decision). Each decision is queued (px_conn.dq) and each final
// response head takes the oldest: it says whether *that* response is dropped, so writes of
// a kept response still in progress when a dropped request arrives stay kept (pipelining).
// A dropped request costs the decision and the counts: nothing is copied to the ring, and
// its response writes return after a peek.

#define PX_KEEP 1
#define PX_DROP 2
#define PX_TTFB_BUCKETS 32  // log2 buckets of the server TTFB in µs: [2^(i-1), 2^i)
#define PX_TP_NAME 11       // strlen("traceparent")
// Bytes searched for the header (a power of two, with room after it for the id): Chromium
// puts script-set headers right after Host and Connection (docs/agent.md), nginx forwards
// them in order after its own two.
#define PX_TP_SCAN (PX_HEAD_WINDOW >= 1024 ? 512 : PX_HEAD_WINDOW / 2)
#define PX_TP_NEED 64  // what the scan reads past a candidate: name, separator, "00-", the id

struct px_port_stat {
    u64 seen;  // requests decided: every request on the port, sampled or not
    u64 kept;
    u64 ttfb_us[PX_TTFB_BUCKETS];  // server TTFB (request read -> response head), all of them
    u64 ttfb_sum_us;
};

BPF_HASH(px_port_stats, u16, struct px_port_stat, 1024);
BPF_PERCPU_ARRAY(px_port_stat_zero, struct px_port_stat, 1);  // never written

static __always_inline struct px_port_stat *px_port_stat_get(u16 port) {
    struct px_port_stat *s = px_port_stats.lookup(&port);
    if (s)
        return s;
    u32 zero = 0;
    struct px_port_stat *z = px_port_stat_zero.lookup(&zero);
    if (!z)
        return 0;
    px_port_stats.update(&port, z);  // (another CPU may have made it meanwhile: fine)
    return px_port_stats.lookup(&port);
}

static __always_inline int px_hex(u8 ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

// Where the scan stopped (1 + the offset of the candidate, 0: none). Kept in a map so
// that the verifier reads it back as an unknown bounded value: what follows the loop is
// then checked once, not once per offset the loop could have stopped at.
BPF_PERCPU_ARRAY(px_tp_at, u32, 1);
struct px_tp_tab {
    u32 want[16];  // by hash: the four-byte pieces of "traceparent" the scan looks for
    u8 back[16];   // how far into the name each piece starts
};
BPF_ARRAY(px_tp_tabs, struct px_tp_tab, 1);

// The top 32 of the 56 random bits of the trace id of a `traceparent` header (or query
// parameter) in d[0..len): 1 and *r when found and valid, else 0. Only the first place
// that looks like part of the name is examined (a path or header that happens to hold
// "race", say, hides the header behind it: that request is then decided at random).
static __always_inline int px_trace_r32(u8 *d, u32 len, u32 *r) {
    u32 zero = 0;
    u32 *at = px_tp_at.lookup(&zero);
    if (!at)
        return 0;
    *at = 0;
    u32 lim = len < PX_TP_SCAN ? len : PX_TP_SCAN;
    // Every fourth offset: an occurrence of the name at s has an offset i in [s, s + 3]
    // divisible by four, where the four bytes read are "trac", "race", "acep" or "cepa"
    // (case folded). Those four hash (w * 7 >> 28) to distinct slots of a 16-entry table,
    // so an offset costs one load and one compare: the verifier walks each iteration, and
    // a branch fewer per iteration is what lets a 512-byte scan load.
    struct px_tp_tab *tab = px_tp_tabs.lookup(&zero);
    if (!tab)
        return 0;
    if (!tab->want[11]) {  // (a map, not the stack: clang ORs an index into an aligned
        tab->want[11] = 0x63617274;  // stack address, which the verifier refuses)
        tab->want[12] = 0x65636172;  // "trac", "race", "acep", "cepa", little-endian
        tab->want[1] = 0x70656361;
        tab->want[10] = 0x61706563;
        tab->back[12] = 1;
        tab->back[1] = 2;
        tab->back[10] = 3;
    }
    for (u32 i = 0; i < PX_TP_SCAN; i += 4) {
        if (i >= lim)
            break;
        u32 w = 0;
        __builtin_memcpy(&w, d + i, 4);
        w |= 0x20202020;
        u32 h = (w * 7) >> 28;
        if (tab->want[h & 15] == w) {
            *at = i + 1 - tab->back[h & 15];
            break;
        }
    }
    u32 i = *at;
    if (i == 0 || i > lim)  // (also a name cut by the start: i - back wrapped around)
        return 0;
    i = (i - 1) & (PX_TP_SCAN - 1);
    u64 w = 0;
    __builtin_memcpy(&w, d + i, 8);
    if ((w | 0x2020202020202020ULL) != 0x7261706563617274ULL)  // "tracepar", little-endian
        return 0;
    if ((d[i + 8] | 0x20) != 'e' || (d[i + 9] | 0x20) != 'n')
        return 0;
    u32 j = i + PX_TP_NAME;
    if (d[j] != ':' && d[j] != '=')
        return 0;
    j++;
    if (d[j] == ' ')
        j++;
    if (d[j] == ' ')
        j++;
    if (d[j] != '0' || d[j + 1] != '0' || d[j + 2] != '-')
        return 0;
    // the trace id: 32 hex digits from j + 3; its random bits are the last 14 (56 bits),
    // whose top 32 are hex digits 18..25 of the id
    u32 v = 0;
    for (u32 k = 0; k < 8; k++) {
        int x = px_hex(d[j + 3 + 18 + k]);
        if (x < 0)
            return 0;
        v = (v << 4) | x;
    }
    *r = v;
    return 1;
}

// A request's first read: decide, count. ``head``/``len``: its first bytes, where the
// threshold needs them (sample_th != 0). Returns 1 to keep.
static __always_inline int px_sample_decide(struct px_conn *c, u8 *head, u32 len, u64 t) {
    struct px_cfg *cfg = px_cfg_get();
    u32 th = cfg ? cfg->sample_th : 0;
    int keep = 1;
    if (th) {
        u32 r = 0;
        if (!px_trace_r32(head, len, &r))
            r = bpf_get_prandom_u32();
        keep = r >= th;
    }
    c->sample = keep ? PX_KEEP : PX_DROP;
    c->sample_th = th;
    if (!c->t_req)
        c->t_req = t;
    if (c->dn < 8) {
        c->dq |= (keep ? 0 : 1) << c->dn;
        c->dn++;
    }
    px_count(C_REQ_SEEN);  // (per CPU: what the agent's sampler reads every second)
    if (keep)
        px_count(C_REQ_KEPT);
    struct px_port_stat *s = px_port_stat_get(c->lport);
    if (s) {
        __sync_fetch_and_add(&s->seen, 1);
        if (keep)
            __sync_fetch_and_add(&s->kept, 1);
    }
    if (!keep && c->skipped < 0xffff)
        c->skipped++;
    return keep;
}

// A response head ("HTTP/" at the start of a write): the request's server TTFB into the
// port's histogram; a final (non-1xx) head answers the oldest pending request, whose
// decision now applies to the writes, and the next read decides anew.
static __always_inline void px_sample_head(struct px_conn *c, u8 *head, u64 t) {
    int informational = head[9] == '1';
    if (!informational) {
        if (c->dn) {
            c->dlast = c->dq & 1;
            c->dq >>= 1;
            c->dn--;
        }
        c->resp_drop = c->dlast;  // (no pending decision: the last one, e.g. pipelined)
    }
    if (c->t_req && t > c->t_req && !informational) {
        u64 us = (t - c->t_req) / 1000;
        u32 b = 0;
        // log2 bucket: the highest set bit, by halving (bounded for the verifier)
        for (u32 k = 0; k < PX_TTFB_BUCKETS - 1; k++) {
            if (us == 0)
                break;
            us >>= 1;
            b++;
        }
        struct px_port_stat *s = px_port_stat_get(c->lport);
        if (s) {
            __sync_fetch_and_add(&s->ttfb_us[b & (PX_TTFB_BUCKETS - 1)], 1);
            __sync_fetch_and_add(&s->ttfb_sum_us, (t - c->t_req) / 1000);
        }
        c->t_req = 0;
    }
    if (!informational)
        c->sample = 0;
}
