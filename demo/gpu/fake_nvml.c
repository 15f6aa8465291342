/* A test double of libnvidia-ml.so.1: the NVML functions agent/gpu/nvml.py calls, with the
 * C ABI that pynvml (nvidia-ml-py) binds to through ctypes, answering from a script.
 *
 * Why C: the real pynvml code path (its CDLL load, function lookup, two-call size queries
 * and error mapping) must run in tests on machines without a GPU; only the C library below
 * it is replaced. tests/gpu/fakes.py compiles this file at test time:
 *   gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 [-DOMIT_<function> ...]
 * and a process finds it through LD_LIBRARY_PATH. -DOMIT_<function> leaves one function
 * out, which is how a test plays an older driver (pynvml: NVMLError_FunctionNotFound).
 *
 * The script is the file named by $PARALLAX_FAKE_NVML, re-read whenever its inode, size or
 * modification time change (NvmlScript sets a fresh nanosecond mtime on every write). One
 * directive a line, times in Unix microseconds (CPU time, as NVML's timestamps):
 *   clock T                    freeze "now" at T (default: the real clock)
 *   period P                   the driver's sample period in us (default 166667: 1/6 s)
 *   buffer N                   samples the driver keeps per device (default 100)
 *   driver VERSION
 *   init CODE                  nvmlInit fails with CODE
 *   device UUID MEM_TOTAL MEM_USED SM_MHZ SM_MAX_MHZ POWER_MW LIMIT_MW REASONS NAME...
 *   util DEV T0 T1 GPU_PCT MEM_PCT          device busy GPU_PCT % over [T0, T1)
 *   proc DEV PID T0 T1 SM_PCT MEM_PCT       one process's share over [T0, T1)
 *   running DEV PID USED_BYTES              nvmlDeviceGetComputeRunningProcesses
 *   junk DEV PID T SM_PCT                   a bogus process sample returned as is (the real
 *                                           driver returns stale and >100 % entries)
 *   fail FUNCTION CODE DEV FROM TO          FUNCTION (or *) returns CODE on DEV (-1: any)
 *                                           while FROM <= now < TO (TO 0: for ever)
 *   lost DEV FROM CODE                      every call on DEV returns CODE from FROM on
 *
 * Samples are generated when asked, at the ticks k*P of the clock: a sample stamped t is the
 * time-weighted share of the segments over (t-P, t], as the driver reports the share of its
 * last sample period. A process appears in a tick only with a non-zero share (NVML leaves
 * idle processes out). The driver keeps the last N ticks; lastSeenTimeStamp filters them.
 * Not thread-safe: the poller calls NVML from one thread at a time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, GPU_IS_LOST = 15, UNKNOWN = 999,
};
struct nvmlDevice_st { int index; };
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct {
    unsigned int pid; unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define MAXDEV 16
#define MAXROWS 512
#define MAXPIDS 64
typedef long long i64;

struct device {
    char uuid[96], name[96];
    i64 mem_total, mem_used, sm, sm_max, power, limit, reasons, lost_from;
    int lost_code;
};
struct seg { int dev, pid; i64 t0, t1, a, b; };          /* util: pid -1; a, b = the two pcts */
struct fail { char fn[64]; int code, dev; i64 from, to; };
struct running { int dev, pid; i64 used; };
struct junk { int dev, pid; i64 t, sm; };

static struct {
    i64 clock, period, buffer;
    char driver[80];
    int init_code, ndev, nseg, nfail, nrun, njunk;
    struct device dev[MAXDEV];
    struct seg seg[MAXROWS];
    struct fail fail[MAXROWS];
    struct running run[MAXROWS];
    struct junk junk[MAXROWS];
} S;
static struct nvmlDevice_st handles[MAXDEV];
static int initialized;
static unsigned long long returned[2]; /* samples written: [0] device, [1] process */

/* A test hook, not NVML: the samples written so far, so a test can tell that the poller
 * passes its last-seen timestamp (each sample then leaves the library once). */
unsigned long long fake_nvml_returned(int process) { return returned[process ? 1 : 0]; }

static void defaults(void) {
    memset(&S, 0, sizeof S);
    S.period = 166667;
    S.buffer = 100;
    strcpy(S.driver, "550.00.fake");
}

static void parse(FILE *f) {
    char line[512], word[64];
    defaults();
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (sscanf(line, "%63s", word) != 1 || word[0] == '#') continue;
        const char *rest = line + strlen(word);
        int n = 0;
        if (!strcmp(word, "clock")) sscanf(rest, "%lld", &S.clock);
        else if (!strcmp(word, "period")) sscanf(rest, "%lld", &S.period);
        else if (!strcmp(word, "buffer")) sscanf(rest, "%lld", &S.buffer);
        else if (!strcmp(word, "driver")) sscanf(rest, "%79s", S.driver);
        else if (!strcmp(word, "init")) sscanf(rest, "%d", &S.init_code);
        else if (!strcmp(word, "device") && S.ndev < MAXDEV) {
            struct device *d = &S.dev[S.ndev];
            if (sscanf(rest, "%95s %lld %lld %lld %lld %lld %lld %lli %n", d->uuid, &d->mem_total,
                       &d->mem_used, &d->sm, &d->sm_max, &d->power, &d->limit, &d->reasons,
                       &n) >= 8) {
                snprintf(d->name, sizeof d->name, "%s", rest + n);
                d->lost_from = -1;
                S.ndev++;
            }
        } else if (!strcmp(word, "util") && S.nseg < MAXROWS) {
            struct seg *s = &S.seg[S.nseg];
            s->pid = -1;
            if (sscanf(rest, "%d %lld %lld %lld %lld", &s->dev, &s->t0, &s->t1, &s->a, &s->b) == 5)
                S.nseg++;
        } else if (!strcmp(word, "proc") && S.nseg < MAXROWS) {
            struct seg *s = &S.seg[S.nseg];
            if (sscanf(rest, "%d %d %lld %lld %lld %lld", &s->dev, &s->pid, &s->t0, &s->t1, &s->a,
                       &s->b) == 6)
                S.nseg++;
        } else if (!strcmp(word, "running") && S.nrun < MAXROWS) {
            struct running *r = &S.run[S.nrun];
            if (sscanf(rest, "%d %d %lld", &r->dev, &r->pid, &r->used) == 3) S.nrun++;
        } else if (!strcmp(word, "junk") && S.njunk < MAXROWS) {
            struct junk *j = &S.junk[S.njunk];
            if (sscanf(rest, "%d %d %lld %lld", &j->dev, &j->pid, &j->t, &j->sm) == 4) S.njunk++;
        } else if (!strcmp(word, "fail") && S.nfail < MAXROWS) {
            struct fail *x = &S.fail[S.nfail];
            if (sscanf(rest, "%63s %d %d %lld %lld", x->fn, &x->code, &x->dev, &x->from,
                       &x->to) == 5)
                S.nfail++;
        } else if (!strcmp(word, "lost")) {
            int dev, code;
            i64 from;
            if (sscanf(rest, "%d %lld %d", &dev, &from, &code) == 3 && dev >= 0 && dev < MAXDEV) {
                S.dev[dev].lost_from = from;
                S.dev[dev].lost_code = code;
            }
        }
    }
}

/* Re-read the script when it changed; cheap enough per call (one stat). */
static void load(void) {
    static struct stat seen;
    static int loaded;
    const char *path = getenv("PARALLAX_FAKE_NVML");
    struct stat st;
    if (!path || stat(path, &st) != 0) { /* no script: a driver with no device */
        if (!loaded) defaults();
        loaded = 1;
        return;
    }
    if (loaded && st.st_ino == seen.st_ino && st.st_size == seen.st_size &&
        st.st_mtim.tv_sec == seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == seen.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    parse(f);
    fclose(f);
    seen = st;
    loaded = 1;
}

static i64 now_us(void) {
    if (S.clock) return S.clock;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (i64)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* The scripted answer for FN: a matching "fail" row, else the device's loss, else OK. */
static nvmlReturn_t check(const char *fn, int dev) {
    load();
    if (!initialized) return UNINITIALIZED;
    i64 now = now_us();
    for (int i = 0; i < S.nfail; i++) {
        struct fail *x = &S.fail[i];
        if ((!strcmp(x->fn, fn) || !strcmp(x->fn, "*")) && (x->dev < 0 || x->dev == dev) &&
            now >= x->from && (x->to == 0 || now < x->to))
            return x->code;
    }
    if (dev >= 0) {
        if (dev >= S.ndev) return NOT_FOUND;
        if (S.dev[dev].lost_from >= 0 && now >= S.dev[dev].lost_from) return S.dev[dev].lost_code;
    }
    return OK;
}

static int dev_of(nvmlDevice_t h) {
    return (h >= handles && h < handles + MAXDEV) ? h->index : MAXDEV;
}
#define CHECK(dev)                              \
    do {                                        \
        nvmlReturn_t r_ = check(__func__, dev); \
        if (r_ != OK) return r_;                \
    } while (0)

/* Share (pct a or b) of DEV/PID over the period ending at T: segment overlap / period. */
static unsigned int share(int dev, int pid, i64 t, int which) {
    i64 acc = 0;
    for (int i = 0; i < S.nseg; i++) {
        struct seg *s = &S.seg[i];
        if (s->dev != dev || s->pid != pid) continue;
        i64 lo = s->t0 > t - S.period ? s->t0 : t - S.period, hi = s->t1 < t ? s->t1 : t;
        if (hi > lo) acc += (hi - lo) * (which ? s->b : s->a);
    }
    i64 pct = (acc + S.period / 2) / S.period;
    return (unsigned int)(pct > 100 ? 100 : pct);
}

/* The ticks the driver still holds that are newer than LAST: [*first, last tick]. */
static i64 ticks(i64 last, i64 *first) {
    i64 now = now_us(), newest = now / S.period * S.period;
    i64 oldest = newest - (S.buffer - 1) * S.period;
    if (oldest <= last) oldest = (last / S.period + 1) * S.period;
    *first = oldest;
    return newest >= oldest ? (newest - oldest) / S.period + 1 : 0;
}

/* A string into the caller's buffer, as NVML answers a buffer too small. */
static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (strlen(src) + 1 > len) return INSUFFICIENT_SIZE;
    snprintf(dst, len, "%s", src);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load();
    if (S.init_code) return S.init_code;
    initialized++;
    return OK;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return UNINITIALIZED;
    initialized--;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    CHECK(-1);
    return copy_str(version, length, S.driver);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CHECK(-1);
    *count = (unsigned int)S.ndev;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= MAXDEV) return INVALID_ARGUMENT;
    CHECK((int)index);
    handles[index].index = (int)index;
    *device = &handles[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int d = dev_of(device);
    CHECK(d);
    return copy_str(uuid, length, S.dev[d].uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int d = dev_of(device);
    CHECK(d);
    return copy_str(name, length, S.dev[d].name);
}

#ifndef OMIT_nvmlDeviceGetUtilizationRates
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    int d = dev_of(device);
    CHECK(d);
    i64 t = now_us() / S.period * S.period; /* the last completed sample period */
    u->gpu = share(d, -1, t, 0);
    u->memory = share(d, -1, t, 1);
    return OK;
}
#endif

#ifndef OMIT_nvmlDeviceGetSamples
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, unsigned int type, unsigned long long last,
                                  unsigned int *value_type, unsigned int *count,
                                  nvmlSample_t *samples) {
    int d = dev_of(device);
    CHECK(d);
    if (type != 1 && type != 2) return NOT_SUPPORTED; /* GPU and memory utilisation only */
    i64 first, n = ticks((i64)last, &first);
    *value_type = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (n == 0) return NOT_FOUND; /* no sample newer than lastSeenTimeStamp */
    if (!samples) {
        *count = (unsigned int)n;
        return OK;
    }
    if (n > *count) n = *count; /* oldest first: the rest comes with the next call */
    for (i64 k = 0; k < n; k++) {
        i64 t = first + k * S.period;
        samples[k].timeStamp = (unsigned long long)t;
        samples[k].sampleValue.uiVal = share(d, -1, t, type == 2);
    }
    returned[0] += (unsigned long long)n;
    *count = (unsigned int)n;
    return OK;
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    int d = dev_of(device);
    CHECK(d);
    m->total = (unsigned long long)S.dev[d].mem_total;
    m->used = (unsigned long long)S.dev[d].mem_used;
    m->free = m->total - m->used;
    return OK;
}
#endif

/* The one-number readings: a field of the device (CHECK names the function by __func__). */
#define GETTER(fn, type, field)                       \
    nvmlReturn_t fn(nvmlDevice_t device, type *out) { \
        int d = dev_of(device);                       \
        CHECK(d);                                     \
        *out = (type)S.dev[d].field;                  \
        return OK;                                    \
    }

static nvmlReturn_t sm_clock(const char *fn, nvmlDevice_t device, unsigned int type,
                             unsigned int *mhz, int max) {
    int d = dev_of(device);
    nvmlReturn_t r = check(fn, d);
    if (r != OK) return r;
    if (type != 1) return NOT_SUPPORTED; /* NVML_CLOCK_SM only */
    *mhz = (unsigned int)(max ? S.dev[d].sm_max : S.dev[d].sm);
    return OK;
}

#ifndef OMIT_nvmlDeviceGetClockInfo
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *mhz) {
    return sm_clock(__func__, device, type, mhz, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetMaxClockInfo
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *mhz) {
    return sm_clock(__func__, device, type, mhz, 1);
}
#endif

#ifndef OMIT_nvmlDeviceGetPowerUsage
GETTER(nvmlDeviceGetPowerUsage, unsigned int, power)
#endif
#ifndef OMIT_nvmlDeviceGetEnforcedPowerLimit
GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, limit)
#endif
#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, reasons)
#endif

#ifndef OMIT_nvmlDeviceGetProcessUtilization
/* The pids with a "proc" segment on DEV, each once. */
static int pids_of(int d, int *pids) {
    int n = 0;
    for (int i = 0; i < S.nseg; i++) {
        int seen = 0;
        if (S.seg[i].dev != d || S.seg[i].pid < 0) continue;
        for (int j = 0; j < n; j++) seen |= pids[j] == S.seg[i].pid;
        if (!seen && n < MAXPIDS) pids[n++] = S.seg[i].pid;
    }
    return n;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count, unsigned long long last) {
    int d = dev_of(device);
    CHECK(d);
    int pids[MAXPIDS], np = pids_of(d, pids);
    i64 first, nt = ticks((i64)last, &first);
    unsigned int n = 0, cap = out ? *count : 0;
    for (i64 k = 0; k < nt; k++) {
        i64 t = first + k * S.period;
        for (int p = 0; p < np; p++) {
            unsigned int sm = share(d, pids[p], t, 0), mem = share(d, pids[p], t, 1);
            if (!sm && !mem) continue; /* idle processes are left out */
            if (n < cap) out[n] = (nvmlProcessUtilizationSample_t){(unsigned int)pids[p],
                                                                   (unsigned long long)t, sm,
                                                                   mem, 0, 0};
            n++;
        }
    }
    for (int j = 0; j < S.njunk; j++) {
        if (S.junk[j].dev != d) continue;
        if (n < cap) out[n] = (nvmlProcessUtilizationSample_t){(unsigned int)S.junk[j].pid,
                                                               (unsigned long long)S.junk[j].t,
                                                               (unsigned int)S.junk[j].sm, 0, 0, 0};
        n++;
    }
    if (n == 0) return NOT_FOUND; /* no sample newer than lastSeenTimeStamp */
    if (!out) {
        *count = n;
        return INSUFFICIENT_SIZE; /* the size query, as the real library answers it */
    }
    /* Samples that arrived between the two calls wait for the next call (lastSeen). */
    *count = n < cap ? n : cap;
    returned[1] += *count;
    return OK;
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    int d = dev_of(device);
    CHECK(d);
    unsigned int n = 0;
    for (int i = 0; i < S.nrun; i++) n += S.run[i].dev == d;
    if (n > *count || (!infos && n > 0)) {
        *count = n;
        return INSUFFICIENT_SIZE;
    }
    n = 0;
    for (int i = 0; i < S.nrun; i++)
        if (S.run[i].dev == d)
            infos[n++] = (nvmlProcessInfo_t){(unsigned int)S.run[i].pid,
                                             (unsigned long long)S.run[i].used, 0xFFFFFFFF,
                                             0xFFFFFFFF};
    *count = n;
    return OK;
}
#endif
