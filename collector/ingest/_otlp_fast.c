/* Compiled fast path for OTLP/protobuf trace requests (collector/ingest/otlp.py).
 *
 * Why: parsing with the protobuf runtime builds a Python wrapper object for every span and
 * every attribute (agent spans carry ~25), ~16 µs of GIL-held CPU per span. This reads the
 * wire format directly and builds only the row tuple.
 *
 * Contract: parse() returns (rows, trace_ids, ignored) exactly as otlp.parse_python() would
 * for the plain case, or None ("give up") for anything else: a span the Python path would
 * reject, an attribute of an unexpected type, malformed or truncated input, a construct this
 * reader does not model. The caller then runs the Python path, which stays the reference
 * (rejection counting, 400 answers and odd cases live in one implementation only). So every
 * doubt here is answered by giving up, never by guessing.
 *
 * Acceptance must be a subset of what upb accepts: every string field is checked to be
 * UTF-8 (upb rejects a body otherwise), every message we do not read is still walked with
 * its schema (events, links, status, scope, other resource attributes), groups and
 * unknown wire types give up. Every read is bounds-checked against the end of its message.
 *
 * Field numbers: opentelemetry-proto (collector/trace/v1, trace/v1, common/v1, resource/v1).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GIVE_UP (-1)
#define MAX_DEPTH 32 /* nesting of messages we only check (AnyValue arrays/kvlists) */

/* --- wire-format reader ------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Rd;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static int rd_varint_long(Rd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end)
            return GIVE_UP;
        uint8_t b = *r->p++;
        /* The 10th byte may only carry the 64th bit: more is an overlong varint. */
        if (i == 9 && b > 1)
            return GIVE_UP;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return GIVE_UP;
}

/* Most varints on this path (tags, lengths, small values) are one byte. */
static inline int rd_varint(Rd *r, uint64_t *out) {
    if (r->p < r->end && *r->p < 0x80) {
        *out = *r->p++;
        return 0;
    }
    return rd_varint_long(r, out);
}

static int rd_tag(Rd *r, uint32_t *field, uint32_t *wt) {
    uint64_t t;
    if (rd_varint(r, &t) < 0 || t > UINT32_MAX || (t >> 3) == 0)
        return GIVE_UP; /* field number 0 is invalid */
    *field = (uint32_t)(t >> 3);
    *wt = (uint32_t)(t & 7);
    return 0;
}

/* A length-delimited field: `sub` covers its payload, `r` moves past it. */
static int rd_len(Rd *r, Rd *sub) {
    uint64_t n;
    if (rd_varint(r, &n) < 0 || n > (uint64_t)(r->end - r->p))
        return GIVE_UP;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 0;
}

static int rd_fixed64(Rd *r, uint64_t *out) {
    if (r->end - r->p < 8)
        return GIVE_UP;
    memcpy(out, r->p, 8); /* little-endian on the wire and on the hosts we build for */
    r->p += 8;
    return 0;
}

/* Skips one field of a known wire type (groups and the reserved types give up). */
static int skip(Rd *r, uint32_t wt) {
    uint64_t v;
    Rd sub;
    switch (wt) {
    case WT_VARINT:
        return rd_varint(r, &v);
    case WT_I64:
        return rd_fixed64(r, &v);
    case WT_LEN:
        return rd_len(r, &sub);
    case WT_I32:
        if (r->end - r->p < 4)
            return GIVE_UP;
        r->p += 4;
        return 0;
    default:
        return GIVE_UP;
    }
}

/* UTF-8 check for string fields we do not decode: ASCII inline, else Python's strict
 * decoder (as strict as upb's: no overlongs, surrogates or values over U+10FFFF). */
static int utf8_ok(Rd s) {
    const uint8_t *q;
    for (q = s.p; q < s.end; q++)
        if (*q & 0x80)
            break;
    if (q == s.end)
        return 0;
    PyObject *u = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, NULL);
    if (u == NULL)
        return GIVE_UP;
    Py_DECREF(u);
    return 0;
}

/* A string the row stores. One holding a NUL gives up (NULL, no exception): the Python
 * path rejects the span (invalid_string). */
static PyObject *str_of(Rd s) {
    if (memchr(s.p, 0, (size_t)(s.end - s.p)) != NULL)
        return NULL;
    return PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, NULL);
}

static PyObject *hex_of(Rd s) {
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = s.end - s.p;
    PyObject *u = PyUnicode_New(2 * n, 127);
    if (u == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(u);
    for (Py_ssize_t i = 0; i < n; i++) {
        d[2 * i] = digits[s.p[i] >> 4];
        d[2 * i + 1] = digits[s.p[i] & 15];
    }
    return u;
}

/* --- schema walk for the messages we only check ------------------------------------- */

enum { K_VARINT, K_I64, K_I32, K_STR, K_BYTES, K_MSG };
typedef struct Desc Desc;
typedef struct {
    uint32_t num;
    uint8_t kind;
    const Desc *msg;
} Fld;
struct Desc {
    int n;
    const Fld *f;
};

static const Desc D_ANY, D_KV, D_LIST;
static const Fld F_KV[] = {{1, K_STR, NULL}, {2, K_MSG, &D_ANY}, {3, K_VARINT, NULL}};
static const Desc D_KV = {3, F_KV};
static const Fld F_LIST[] = {{1, K_MSG, &D_ANY}}; /* ArrayValue.values */
static const Desc D_ARRAY = {1, F_LIST};
static const Fld F_KVLIST[] = {{1, K_MSG, &D_KV}};
static const Desc D_LIST = {1, F_KVLIST};
static const Fld F_ANY[] = {{1, K_STR, NULL},    {2, K_VARINT, NULL}, {3, K_VARINT, NULL},
                            {4, K_I64, NULL},    {5, K_MSG, &D_ARRAY}, {6, K_MSG, &D_LIST},
                            {7, K_BYTES, NULL},  {8, K_VARINT, NULL}};
static const Desc D_ANY = {8, F_ANY};
static const Fld F_SCOPE[] = {
    {1, K_STR, NULL}, {2, K_STR, NULL}, {3, K_MSG, &D_KV}, {4, K_VARINT, NULL}};
static const Desc D_SCOPE = {4, F_SCOPE};
static const Fld F_STATUS[] = {{2, K_STR, NULL}, {3, K_VARINT, NULL}};
static const Desc D_STATUS = {2, F_STATUS};
static const Fld F_EVENT[] = {
    {1, K_I64, NULL}, {2, K_STR, NULL}, {3, K_MSG, &D_KV}, {4, K_VARINT, NULL}};
static const Desc D_EVENT = {4, F_EVENT};
static const Fld F_LINK[] = {{1, K_BYTES, NULL}, {2, K_BYTES, NULL}, {3, K_STR, NULL},
                             {4, K_MSG, &D_KV},  {5, K_VARINT, NULL}, {6, K_I32, NULL}};
static const Desc D_LINK = {6, F_LINK};
static const Fld F_ENTITY[] = {
    {1, K_STR, NULL}, {2, K_STR, NULL}, {3, K_STR, NULL}, {4, K_STR, NULL}};
static const Desc D_ENTITY = {4, F_ENTITY};

static const uint8_t WT_OF[] = {WT_VARINT, WT_I64, WT_I32, WT_LEN, WT_LEN, WT_LEN};

/* Walks a message we do not read, as upb would parse it: unknown fields skipped, a known
 * field with an unexpected wire type gives up (upb would keep it as unknown: rare). */
static int check_msg(Rd r, const Desc *d, int depth) {
    if (depth > MAX_DEPTH)
        return GIVE_UP;
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0)
            return GIVE_UP;
        const Fld *f = NULL;
        for (int i = 0; i < d->n; i++)
            if (d->f[i].num == num)
                f = &d->f[i];
        if (f == NULL) {
            if (skip(&r, wt) < 0)
                return GIVE_UP;
            continue;
        }
        if (wt != WT_OF[f->kind])
            return GIVE_UP;
        if (f->kind < K_STR) {
            if (skip(&r, wt) < 0)
                return GIVE_UP;
            continue;
        }
        Rd sub;
        if (rd_len(&r, &sub) < 0)
            return GIVE_UP;
        if (f->kind == K_STR && utf8_ok(sub) < 0)
            return GIVE_UP;
        if (f->kind == K_MSG && check_msg(sub, f->msg, depth + 1) < 0)
            return GIVE_UP;
    }
    return 0;
}

/* --- configuration (from otlp.py, once) ---------------------------------------------- */

/* Attribute slots, in the order otlp._FAST_NAMES lists their names. */
enum {
    S_TTFB, S_RECV_Q, S_ACCEPT_Q, S_TTFT, S_GAP_MAX, S_SRTT, S_DUR, /* durations, µs */
    S_CHUNKS, S_BYTES_IN, S_BYTES_OUT, S_RETRANS, S_ARRIVAL,
    S_STATUS, S_HTTP_STATUS, S_SERVER_PORT, S_CLIENT_PORT, S_WS_SEQ,
    S_GPU_PREFILL_LAUNCHES, S_GPU_DECODE_LAUNCHES, S_GPU_PREFILL_WAIT, S_GPU_DECODE_WAIT,
    N_INT,
    S_URL_PATH = N_INT, S_HTTP_TARGET, S_HTTP_ROUTE, S_METHOD, S_HTTP_METHOD, S_SOURCE,
    S_SERVER_ADDRESS, S_CLIENT_ADDRESS, S_GPU_UUID,
    S_STR_END,
    S_PARTIAL = S_STR_END, S_CLIENT_ABORTED, S_TRACEPARENT_MISSED,
    /* doubles: the GPU shares and means (parallax.gpu.*) */
    S_GPU_PREFILL_UTIL, S_GPU_DECODE_UTIL, S_GPU_COVERAGE, S_GPU_INFLIGHT,
    S_OFFSETS,
    N_SLOTS,
    R_SERVICE = N_SLOTS, R_HOST, R_PID, /* resource attributes with a column */
    R_KEPT,                             /* the identity kept in `attributes`: otlp._STORED */
    N_NAMES = R_KEPT + 12
};
#define N_STR (S_STR_END - N_INT)
#define N_DBL (S_OFFSETS - S_GPU_PREFILL_UTIL)
#define N_ROW 47 /* len(schema.SPAN_COLUMNS) */
#define TABLE_SIZE 128 /* a power of two, well above N_SLOTS: short probes */

typedef struct {
    const char *s;
    Py_ssize_t n;
    int slot;
} Name;

static Name names[N_NAMES];
static int16_t table[TABLE_SIZE]; /* open addressing over names by FNV-1a; -1 = empty */
static PyObject *names_keep, *route_fn, *s_sdk, *s_unknown, *s_empty;
static int64_t max_duration_ns, future_slack_ns;
static int configured;

static uint32_t fnv(const uint8_t *p, Py_ssize_t n) {
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

/* The slot of an attribute key (or -1): keys are compared as bytes, no str is built. */
static int slot_of(Rd k) {
    Py_ssize_t n = k.end - k.p;
    for (uint32_t h = fnv(k.p, n) & (TABLE_SIZE - 1);; h = (h + 1) & (TABLE_SIZE - 1)) {
        int i = table[h];
        if (i < 0)
            return -1;
        if (names[i].n == n && memcmp(names[i].s, k.p, n) == 0)
            return names[i].slot;
    }
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *tup, *route;
    long long max_dur, slack;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OLL", &PyTuple_Type, &tup, &route, &max_dur, &slack))
        return NULL;
    if (PyTuple_GET_SIZE(tup) != N_NAMES) {
        PyErr_Format(PyExc_ValueError, "expected %d attribute names", N_NAMES);
        return NULL;
    }
    memset(table, 0xff, sizeof table);
    for (int i = 0; i < N_NAMES; i++) {
        PyObject *o = PyTuple_GET_ITEM(tup, i);
        if (!PyUnicode_Check(o) || !PyUnicode_IS_ASCII(o)) {
            PyErr_SetString(PyExc_ValueError, "attribute names must be ASCII str");
            return NULL;
        }
        names[i].s = PyUnicode_AsUTF8AndSize(o, &names[i].n);
        names[i].slot = i;
        if (i >= N_SLOTS)
            continue; /* resource names are compared directly */
        uint32_t h = fnv((const uint8_t *)names[i].s, names[i].n) & (TABLE_SIZE - 1);
        while (table[h] >= 0)
            h = (h + 1) & (TABLE_SIZE - 1);
        table[h] = (int16_t)i;
    }
    Py_INCREF(tup);
    Py_XSETREF(names_keep, tup);
    Py_INCREF(route);
    Py_XSETREF(route_fn, route);
    max_duration_ns = max_dur;
    future_slack_ns = slack;
    configured = 1;
    Py_RETURN_NONE;
}

/* --- AnyValue ------------------------------------------------------------------------ */

typedef struct {
    uint32_t which; /* the oneof field number: 1 str, 2 bool, 3 int, 4 double, 5 array, 7 bytes */
    uint64_t u;     /* varint / fixed64 payload */
    Rd s;           /* length-delimited payload */
} Any;

/* One AnyValue with exactly one value set (empty, repeated or strindex values give up:
 * repeated oneof members merge in upb; leave that to the reference). */
static int rd_any(Rd r, Any *a) {
    a->which = 0;
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0)
            return GIVE_UP;
        if (num > 8) {
            if (skip(&r, wt) < 0)
                return GIVE_UP;
            continue;
        }
        if (a->which != 0 || num == 6 || num == 8)
            return GIVE_UP; /* kvlist values are left to the reference */
        a->which = num;
        if (num == 2 || num == 3) {
            if (wt != WT_VARINT || rd_varint(&r, &a->u) < 0)
                return GIVE_UP;
        } else if (num == 4) {
            if (wt != WT_I64 || rd_fixed64(&r, &a->u) < 0)
                return GIVE_UP;
        } else if (wt != WT_LEN || rd_len(&r, &a->s) < 0) {
            return GIVE_UP;
        }
    }
    if (a->which == 0 || (a->which == 2 && a->u > 1))
        return GIVE_UP;
    return 0;
}

/* A KeyValue: its key and its value's payload (an absent value gives up). */
static int rd_kv(Rd r, Rd *key, Rd *val) {
    int seen = 0;
    key->p = key->end = r.p;
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0)
            return GIVE_UP;
        if (num == 1 || num == 2) {
            if (wt != WT_LEN || (seen & (int)num) || rd_len(&r, num == 1 ? key : val) < 0)
                return GIVE_UP;
            seen |= (int)num;
        } else if (num == 3 || skip(&r, wt) < 0) {
            return GIVE_UP; /* key_strindex: a dictionary-encoded key */
        }
    }
    return (seen & 2) ? 0 : GIVE_UP;
}

/* An int array for parallax.chunk_offsets_us: every element an int_value, else give up. */
static PyObject *int_list(Rd r, int64_t *min) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    *min = 0;
    while (r.p < r.end) {
        uint32_t num, wt;
        Rd sub;
        Any a;
        if (rd_tag(&r, &num, &wt) < 0)
            goto fail;
        if (num != 1) {
            if (skip(&r, wt) < 0)
                goto fail;
            continue;
        }
        if (wt != WT_LEN || rd_len(&r, &sub) < 0 || rd_any(sub, &a) < 0 || a.which != 3)
            goto fail;
        if ((int64_t)a.u < *min)
            *min = (int64_t)a.u;
        PyObject *v = PyLong_FromLongLong((int64_t)a.u);
        if (v == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* json.dumps of a scalar for the `attributes` map (otlp._str): strings as they are; the
 * others the way json writes them. Arrays, kvlists and non-finite doubles give up. */
static PyObject *rest_str(const Any *a) {
    switch (a->which) {
    case 1:
        return str_of(a->s);
    case 2:
        return PyUnicode_FromString(a->u ? "true" : "false");
    case 3: {
        PyObject *i = PyLong_FromLongLong((int64_t)a->u), *s;
        if (i == NULL)
            return NULL;
        s = PyObject_Str(i);
        Py_DECREF(i);
        return s;
    }
    case 4: {
        double d;
        memcpy(&d, &a->u, 8);
        if (!isfinite(d))
            return NULL;
        PyObject *f = PyFloat_FromDouble(d), *s;
        if (f == NULL)
            return NULL;
        s = PyObject_Repr(f);
        Py_DECREF(f);
        return s;
    }
    case 7:
        return hex_of(a->s);
    default:
        return NULL;
    }
}

/* --- spans ---------------------------------------------------------------------------- */

typedef struct {
    int64_t ival[N_INT];
    uint64_t have;            /* bit per slot: set by an attribute */
    PyObject *sval[N_STR];    /* decoded string slots */
    int bval[3];              /* the three flags */
    double dval[N_DBL];       /* the GPU doubles */
    PyObject *offsets;        /* list or NULL */
    int64_t offsets_min;
    PyObject *rest;           /* dict or NULL */
} Attrs;

static void attrs_clear(Attrs *at) {
    for (int i = 0; i < N_STR; i++)
        Py_CLEAR(at->sval[i]);
    Py_CLEAR(at->offsets);
    Py_CLEAR(at->rest);
}

/* One span attribute into its slot (a later duplicate replaces, as in the reference). */
static int span_attr(Rd kvr, Attrs *at) {
    Rd key, val;
    Any a;
    if (rd_kv(kvr, &key, &val) < 0)
        return GIVE_UP;
    int slot = slot_of(key);
    if (slot == S_OFFSETS) {
        /* An array of ints only; peek at the value's oneof without building anything. */
        if (rd_any(val, &a) < 0 || a.which != 5)
            return GIVE_UP;
        PyObject *lst = int_list(a.s, &at->offsets_min);
        if (lst == NULL)
            return GIVE_UP;
        Py_XSETREF(at->offsets, lst);
        at->have |= (uint64_t)1 << S_OFFSETS;
        return 0;
    }
    if (rd_any(val, &a) < 0)
        return GIVE_UP;
    if (slot >= 0 && slot < N_INT) {
        if (a.which != 3)
            return GIVE_UP;
        at->ival[slot] = (int64_t)a.u;
    } else if (slot >= N_INT && slot < S_STR_END) {
        if (a.which != 1)
            return GIVE_UP;
        PyObject *s = str_of(a.s);
        if (s == NULL)
            return GIVE_UP;
        Py_XSETREF(at->sval[slot - N_INT], s);
    } else if (slot >= S_PARTIAL && slot < S_GPU_PREFILL_UTIL) {
        if (a.which != 2)
            return GIVE_UP;
        at->bval[slot - S_PARTIAL] = (int)a.u;
    } else if (slot >= S_GPU_PREFILL_UTIL && slot < S_OFFSETS) {
        if (a.which != 4) /* an int_value here: the reference converts it */
            return GIVE_UP;
        memcpy(&at->dval[slot - S_GPU_PREFILL_UTIL], &a.u, 8);
    } else {
        PyObject *k = str_of(key), *v;
        if (k == NULL)
            return GIVE_UP;
        v = rest_str(&a);
        if (v == NULL || (at->rest == NULL && (at->rest = PyDict_New()) == NULL) ||
            PyDict_SetItem(at->rest, k, v) < 0) {
            Py_DECREF(k);
            Py_XDECREF(v);
            return GIVE_UP;
        }
        Py_DECREF(k);
        Py_DECREF(v);
        return 0;
    }
    at->have |= (uint64_t)1 << slot;
    return 0;
}

typedef struct {
    PyObject *service, *host, *pid; /* per ResourceSpans */
    PyObject *ident;                /* its kept identity attributes: a dict, or NULL */
    PyObject *received_ms;
    int64_t oldest_ns, now_ns;
    PyObject *rows, *tids;
    Py_ssize_t ignored;
} Ctx;

#define HAVE(s) ((at.have & ((uint64_t)1 << (s))) != 0)
#define SET(i, o)                                                                           \
    do {                                                                                    \
        PyObject *o_ = (o);                                                                 \
        if (o_ == NULL)                                                                     \
            goto fail;                                                                      \
        PyTuple_SET_ITEM(row, (i), o_);                                                     \
    } while (0)

static PyObject *int_or_none(int have, int64_t v) {
    if (have)
        return PyLong_FromLongLong(v);
    Py_RETURN_NONE;
}

static PyObject *new_ref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

/* str.upper()[:16] of an HTTP method (ASCII inline, else str.upper itself). */
static PyObject *method_of(PyObject *m) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(m);
    if (PyUnicode_IS_ASCII(m)) {
        const char *c = (const char *)PyUnicode_1BYTE_DATA(m);
        Py_ssize_t k = n < 16 ? n : 16;
        PyObject *u = PyUnicode_New(k, 127);
        if (u == NULL)
            return NULL;
        Py_UCS1 *d = PyUnicode_1BYTE_DATA(u);
        for (Py_ssize_t i = 0; i < k; i++)
            d[i] = (c[i] >= 'a' && c[i] <= 'z') ? (Py_UCS1)(c[i] - 32) : (Py_UCS1)c[i];
        return u;
    }
    PyObject *up = PyObject_CallMethod(m, "upper", NULL), *out;
    if (up == NULL)
        return NULL;
    out = PyUnicode_Substring(up, 0, 16);
    Py_DECREF(up);
    return out;
}

static PyObject *prefix(PyObject *s, Py_ssize_t n) {
    if (PyUnicode_GET_LENGTH(s) <= n)
        return new_ref(s);
    return PyUnicode_Substring(s, 0, n);
}

/* The sampling threshold of a span's tracestate (W3C list of key=value members): 0 when no
 * member has the key "ot" (kept with probability 1), else that member's value must be
 * exactly "th:" and 1–14 lowercase hex digits, as the agent writes it (trailing zeros
 * dropped: the 56-bit value is the digits padded on the right). Anything else — whitespace
 * or non-ASCII anywhere (the reference strips members), another "ot" value (rv, several
 * fields, an invalid th) — gives up: the reference (sampling.th_from_tracestate) reads it. */
static int th_of(Rd ts, uint64_t *th) {
    *th = 0;
    for (const uint8_t *p = ts.p; p < ts.end; p++)
        if (*p <= ' ' || *p >= 0x7f)
            return GIVE_UP;
    const uint8_t *m = ts.p;
    while (m < ts.end) {
        const uint8_t *e = memchr(m, ',', (size_t)(ts.end - m));
        if (e == NULL)
            e = ts.end;
        if (e - m >= 3 && memcmp(m, "ot=", 3) == 0) {
            const uint8_t *v = m + 3;
            Py_ssize_t digits = e - v - 3;
            if (digits < 1 || digits > 14 || memcmp(v, "th:", 3) != 0)
                return GIVE_UP;
            uint64_t x = 0;
            for (const uint8_t *p = v + 3; p < e; p++) {
                int d = (*p >= '0' && *p <= '9') ? *p - '0' : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10 : -1;
                if (d < 0)
                    return GIVE_UP;
                x = (x << 4) | (uint64_t)d;
            }
            *th = x << (4 * (14 - digits));
            return 0;
        }
        if (e == ts.end)
            break;
        m = e + 1;
    }
    return 0;
}

/* A length-delimited field's payload into `sub`; any other field skipped. */
static int rd_len_or_skip(Rd *r, uint32_t wt, Rd *sub) {
    return wt == WT_LEN ? rd_len(r, sub) : skip(r, wt);
}

static int span(Rd r, Ctx *c) {
    Rd tid = {0}, sid = {0}, par = {0}, name = {0}, tstate = {0}, sub;
    uint64_t kind = 0, start = 0, end = 0, th = 0;
    unsigned seen = 0;
    Rd all = r;
    /* Pass 1: everything but the attributes (field order on the wire is free). */
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0)
            return GIVE_UP;
        /* The singular fields we read: a repeat (last one wins in upb) gives up. */
        if (num <= 8) {
            if (seen & (1u << num))
                return GIVE_UP;
            seen |= 1u << num;
        }
        switch (num) {
        case 1: case 2: case 4: case 5:
            if (wt != WT_LEN || rd_len(&r, &sub) < 0)
                return GIVE_UP;
            if (num == 1)
                tid = sub;
            else if (num == 2)
                sid = sub;
            else if (num == 4)
                par = sub;
            else if (utf8_ok(sub) < 0)
                return GIVE_UP;
            else
                name = sub;
            break;
        case 3: /* trace_state: the sampling threshold (ot=th:…) */
            if (wt != WT_LEN || rd_len(&r, &sub) < 0 || utf8_ok(sub) < 0)
                return GIVE_UP;
            tstate = sub;
            break;
        case 6:
            if (wt != WT_VARINT || rd_varint(&r, &kind) < 0)
                return GIVE_UP;
            break;
        case 7: case 8:
            if (wt != WT_I64 || rd_fixed64(&r, num == 7 ? &start : &end) < 0)
                return GIVE_UP;
            break;
        case 9: /* attributes: pass 2 */
            if (wt != WT_LEN || rd_len(&r, &sub) < 0)
                return GIVE_UP;
            break;
        case 11: case 13: case 15:
            if (wt != WT_LEN || rd_len(&r, &sub) < 0 ||
                check_msg(sub, num == 11 ? &D_EVENT : num == 13 ? &D_LINK : &D_STATUS, 0) < 0)
                return GIVE_UP;
            break;
        case 10: case 12: case 14:
            if (wt != WT_VARINT || skip(&r, wt) < 0)
                return GIVE_UP;
            break;
        case 16:
            if (wt != WT_I32 || skip(&r, wt) < 0)
                return GIVE_UP;
            break;
        default:
            if (skip(&r, wt) < 0)
                return GIVE_UP;
        }
    }
    /* Kind is an int32 enum: upb keeps the low 32 bits of the varint. */
    if ((int32_t)(uint32_t)kind != 2) {
        r = all; /* not stored, but its attributes must still be well-formed */
        while (r.p < r.end) {
            uint32_t num, wt;
            if (rd_tag(&r, &num, &wt) < 0 || rd_len_or_skip(&r, wt, &sub) < 0)
                return GIVE_UP;
            if (num == 9 && check_msg(sub, &D_KV, 0) < 0)
                return GIVE_UP;
        }
        c->ignored++;
        return 0;
    }
    /* The reference's rejections (_span_row): any of them gives up. */
    Py_ssize_t ntid = tid.end - tid.p, nsid = sid.end - sid.p, npar = par.end - par.p;
    static const uint8_t zero[16];
    if (ntid != 16 || memcmp(tid.p, zero, 16) == 0 || nsid != 8 || memcmp(sid.p, zero, 8) == 0 ||
        (npar != 0 && npar != 8))
        return GIVE_UP;
    if (start > INT64_MAX || end > INT64_MAX || end < start ||
        (int64_t)(end - start) > max_duration_ns || (int64_t)start < c->oldest_ns ||
        (int64_t)start > c->now_ns + future_slack_ns)
        return GIVE_UP;
    if (th_of(tstate, &th) < 0)
        return GIVE_UP;

    Attrs at;
    memset(&at, 0, sizeof at);
    r = all;
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0 || rd_len_or_skip(&r, wt, &sub) < 0)
            goto give_up;
        if (num == 9 && span_attr(sub, &at) < 0)
            goto give_up;
    }
    for (int i = S_TTFB; i <= S_DUR; i++)
        if (HAVE(i) && at.ival[i] < 0)
            goto give_up; /* negative_duration */
    if (HAVE(S_DUR) && at.ival[S_DUR] > max_duration_ns / 1000)
        goto give_up; /* duration_over_24h */
    if ((HAVE(S_OFFSETS) && at.offsets_min < 0) ||
        (HAVE(S_CHUNKS) && at.ival[S_CHUNKS] >= ((int64_t)1 << 32)) ||
        (HAVE(S_RETRANS) && at.ival[S_RETRANS] >= ((int64_t)1 << 32)))
        goto give_up; /* out_of_range */
    /* GPU values outside their column's domain are stored as absent by the reference. */
    for (int i = S_GPU_PREFILL_LAUNCHES; i <= S_GPU_DECODE_LAUNCHES; i++)
        if (HAVE(i) && (at.ival[i] < 0 || at.ival[i] > (int64_t)UINT32_MAX))
            goto give_up;
    for (int i = S_GPU_PREFILL_WAIT; i <= S_GPU_DECODE_WAIT; i++)
        if (HAVE(i) && at.ival[i] < 0)
            goto give_up;
    static const double dmax[N_DBL] = {100.0, 100.0, 1.0, HUGE_VAL};
    for (int i = 0; i < N_DBL; i++) {
        double d = at.dval[i];
        /* NaN fails both comparisons; +inf is out of every range (inflight: not finite) */
        if (HAVE(S_GPU_PREFILL_UTIL + i) && !(d >= 0.0 && d <= dmax[i] && isfinite(d)))
            goto give_up;
    }

    /* Who served it (the Resource's identity) into `attributes`, winning over a span
     * attribute of the same name (the reference's rest.update(ident)). */
    if (c->ident != NULL) {
        if (at.rest == NULL) {
            if ((at.rest = PyDict_Copy(c->ident)) == NULL)
                goto give_up;
        } else if (PyDict_Update(at.rest, c->ident) < 0) {
            goto give_up;
        }
    }
    PyObject *row = PyTuple_New(N_ROW), *path = NULL, *hroute, *route = NULL;
    if (row == NULL)
        goto give_up;
    PyObject **sv = at.sval;
#define SV(s) sv[(s) - N_INT]
#define TRUTHY(s) (SV(s) != NULL && PyUnicode_GET_LENGTH(SV(s)) > 0)
    SET(0, PyLong_FromUnsignedLongLong(start));
    SET(1, PyLong_FromUnsignedLongLong(end));
    SET(2, new_ref(c->received_ms));
    SET(3, hex_of(tid));
    SET(4, hex_of(sid));
    SET(5, hex_of(par));
    SET(6, str_of(name));
    SET(7, new_ref(TRUTHY(S_SOURCE) ? SV(S_SOURCE) : s_sdk));
    SET(8, new_ref(c->service));
    SET(9, new_ref(c->host));
    SET(10, new_ref(c->pid));
    SET(11, method_of(TRUTHY(S_METHOD) ? SV(S_METHOD) : TRUTHY(S_HTTP_METHOD) ? SV(S_HTTP_METHOD) : s_empty));
    /* route: otlp._route(path, http.route or None) if either is set, else the span name */
    path = TRUTHY(S_URL_PATH) ? SV(S_URL_PATH) : TRUTHY(S_HTTP_TARGET) ? SV(S_HTTP_TARGET) : s_empty;
    hroute = TRUTHY(S_HTTP_ROUTE) ? SV(S_HTTP_ROUTE) : Py_None;
    if (PyUnicode_GET_LENGTH(path) > 0 || hroute != Py_None) {
        route = PyObject_CallFunctionObjArgs(route_fn, path, hroute, NULL);
        if (route == NULL || !PyUnicode_Check(route))
            goto fail_route;
    } else {
        route = new_ref(PyTuple_GET_ITEM(row, 6));
    }
    PyObject *route512 = prefix(route, 512);
    Py_CLEAR(route);
    SET(12, route512);
    /* path.split("?", 1)[0][:2048] */
    Py_ssize_t q = PyUnicode_FindChar(path, '?', 0, PyUnicode_GET_LENGTH(path), 1);
    if (q == -2)
        goto fail;
    SET(13, q >= 0 ? PyUnicode_Substring(path, 0, q < 2048 ? q : 2048) : prefix(path, 2048));
    /* status: http.response.status_code or http.status_code, 0 when absent or not a u16 */
    int64_t st = HAVE(S_STATUS) && at.ival[S_STATUS] != 0 ? at.ival[S_STATUS]
                 : HAVE(S_HTTP_STATUS)                     ? at.ival[S_HTTP_STATUS]
                                                           : 0;
    SET(14, PyLong_FromLongLong(st >= 0 && st < 65536 ? st : 0));
    SET(15, new_ref(SV(S_SERVER_ADDRESS) ? SV(S_SERVER_ADDRESS) : s_empty));
    int64_t port = HAVE(S_SERVER_PORT) ? at.ival[S_SERVER_PORT] : 0;
    SET(16, PyLong_FromLongLong(port >= 0 && port < 65536 ? port : 0));
    SET(17, new_ref(SV(S_CLIENT_ADDRESS) ? SV(S_CLIENT_ADDRESS) : s_empty));
    port = HAVE(S_CLIENT_PORT) ? at.ival[S_CLIENT_PORT] : 0;
    SET(18, PyLong_FromLongLong(port >= 0 && port < 65536 ? port : 0));
    SET(19, int_or_none(HAVE(S_ARRIVAL) && at.ival[S_ARRIVAL] > 0, at.ival[S_ARRIVAL]));
    SET(20, int_or_none(HAVE(S_TTFB), at.ival[S_TTFB]));
    SET(21, int_or_none(HAVE(S_RECV_Q), at.ival[S_RECV_Q]));
    SET(22, int_or_none(HAVE(S_ACCEPT_Q), at.ival[S_ACCEPT_Q]));
    SET(23, int_or_none(HAVE(S_TTFT), at.ival[S_TTFT]));
    SET(24, PyLong_FromLongLong(HAVE(S_DUR) ? at.ival[S_DUR] : (int64_t)(end - start) / 1000));
    SET(25, at.offsets ? new_ref(at.offsets) : PyList_New(0));
    SET(26, int_or_none(HAVE(S_CHUNKS) && at.ival[S_CHUNKS] >= 0, at.ival[S_CHUNKS]));
    SET(27, int_or_none(HAVE(S_GAP_MAX), at.ival[S_GAP_MAX]));
    SET(28, int_or_none(HAVE(S_BYTES_IN) && at.ival[S_BYTES_IN] >= 0, at.ival[S_BYTES_IN]));
    SET(29, int_or_none(HAVE(S_BYTES_OUT) && at.ival[S_BYTES_OUT] >= 0, at.ival[S_BYTES_OUT]));
    SET(30, int_or_none(HAVE(S_SRTT), at.ival[S_SRTT]));
    SET(31, int_or_none(HAVE(S_RETRANS) && at.ival[S_RETRANS] >= 0, at.ival[S_RETRANS]));
    int64_t seq = HAVE(S_WS_SEQ) ? at.ival[S_WS_SEQ] : 0;
    SET(32, PyLong_FromLongLong(seq >= 0 && seq < ((int64_t)1 << 32) ? seq : 0));
    SET(33, PyBool_FromLong(at.bval[0]));
    SET(34, PyBool_FromLong(at.bval[1]));
    SET(35, PyBool_FromLong(at.bval[2]));
    SET(36, at.rest ? new_ref(at.rest) : PyDict_New());
    /* the GPU columns (schema.SPAN_GPU_COLUMNS) */
    SET(37, int_or_none(HAVE(S_GPU_PREFILL_LAUNCHES), at.ival[S_GPU_PREFILL_LAUNCHES]));
    SET(38, int_or_none(HAVE(S_GPU_DECODE_LAUNCHES), at.ival[S_GPU_DECODE_LAUNCHES]));
    SET(39, int_or_none(HAVE(S_GPU_PREFILL_WAIT), at.ival[S_GPU_PREFILL_WAIT]));
    SET(40, int_or_none(HAVE(S_GPU_DECODE_WAIT), at.ival[S_GPU_DECODE_WAIT]));
    for (int i = 0; i < N_DBL; i++)
        SET(41 + i, HAVE(S_GPU_PREFILL_UTIL + i) ? PyFloat_FromDouble(at.dval[i])
                                                 : new_ref(Py_None));
    SET(45, SV(S_GPU_UUID) ? prefix(SV(S_GPU_UUID), 1024) : new_ref(s_empty));
    SET(46, PyLong_FromUnsignedLongLong(th)); /* schema.SPAN_SAMPLING_COLUMNS */
#undef SV
#undef TRUTHY
    if (PyList_Append(c->rows, row) < 0 || PyList_Append(c->tids, PyTuple_GET_ITEM(row, 3)) < 0)
        goto fail;
    Py_DECREF(row);
    attrs_clear(&at);
    return 0;
fail_route:
    Py_XDECREF(route);
fail:
    Py_DECREF(row);
give_up:
    attrs_clear(&at);
    return GIVE_UP;
}

/* --- resources, scopes, the request -------------------------------------------------- */

static int names_eq(Rd k, int i) {
    return names[i].n == k.end - k.p && memcmp(names[i].s, k.p, names[i].n) == 0;
}

/* The identity attribute a key names (its index in names), or -1. */
static int kept_of(Rd k) {
    for (int i = R_KEPT; i < N_NAMES; i++)
        if (names_eq(k, i))
            return i;
    return -1;
}

/* service.name / host.name (strings) and process.pid (an int) are read, and the identity
 * attributes (strings) into *ident (a later duplicate replaces, as in the reference's dict);
 * other resource attributes are only checked. Another type for any of them gives up, and
 * so does a NUL in a string (the reference rejects the spans: invalid_string). */
static int resource_attr(Rd kvr, PyObject **service, PyObject **host, PyObject **pid,
                         PyObject **ident) {
    Rd key, val;
    Any a;
    if (rd_kv(kvr, &key, &val) < 0)
        return GIVE_UP;
    PyObject **dst = names_eq(key, R_SERVICE) ? service
                     : names_eq(key, R_HOST)  ? host
                     : names_eq(key, R_PID)   ? pid
                                              : NULL;
    if (dst == NULL) {
        int i = kept_of(key);
        if (i < 0)
            return (utf8_ok(key) < 0 || check_msg(val, &D_ANY, 1) < 0) ? GIVE_UP : 0;
        if (rd_any(val, &a) < 0 || a.which != 1)
            return GIVE_UP;
        PyObject *k = PyTuple_GET_ITEM(names_keep, i), *v = str_of(a.s);
        if (v == NULL || (*ident == NULL && (*ident = PyDict_New()) == NULL) ||
            PyDict_SetItem(*ident, k, v) < 0) {
            Py_XDECREF(v);
            return GIVE_UP;
        }
        Py_DECREF(v);
        return 0;
    }
    if (rd_any(val, &a) < 0 || a.which != (dst == pid ? 3u : 1u))
        return GIVE_UP;
    PyObject *o = dst == pid ? PyLong_FromLongLong((int64_t)a.u) : str_of(a.s);
    if (o == NULL)
        return GIVE_UP;
    Py_XSETREF(*dst, o);
    return 0;
}

static int scope_spans(Rd r, Ctx *c) {
    while (r.p < r.end) {
        uint32_t num, wt;
        Rd sub;
        if (rd_tag(&r, &num, &wt) < 0)
            return GIVE_UP;
        if (num > 3) {
            if (skip(&r, wt) < 0)
                return GIVE_UP;
            continue;
        }
        if (wt != WT_LEN || rd_len(&r, &sub) < 0)
            return GIVE_UP;
        if ((num == 1 && check_msg(sub, &D_SCOPE, 0) < 0) || (num == 2 && span(sub, c) < 0) ||
            (num == 3 && utf8_ok(sub) < 0))
            return GIVE_UP;
    }
    return 0;
}

static int resource_spans(Rd r, Ctx *c) {
    Rd all = r, sub;
    int seen_resource = 0, ret = GIVE_UP;
    PyObject *service = NULL, *host = NULL, *pid = NULL, *ident = NULL;
    /* Pass 1: the resource (it may follow the spans on the wire) and the checks. */
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0)
            goto out;
        if (num > 3) {
            if (skip(&r, wt) < 0)
                goto out;
            continue;
        }
        if (wt != WT_LEN || rd_len(&r, &sub) < 0)
            goto out;
        if (num == 3 && utf8_ok(sub) < 0)
            goto out;
        if (num != 1)
            continue;
        if (seen_resource++) /* a second one would merge into the first */
            goto out;
        while (sub.p < sub.end) {
            Rd kv;
            if (rd_tag(&sub, &num, &wt) < 0)
                goto out;
            if (num == 1) {
                if (wt != WT_LEN || rd_len(&sub, &kv) < 0 ||
                    resource_attr(kv, &service, &host, &pid, &ident) < 0)
                    goto out;
            } else if (num == 2) {
                if (wt != WT_VARINT || skip(&sub, wt) < 0)
                    goto out;
            } else if (num == 3) {
                if (wt != WT_LEN || rd_len(&sub, &kv) < 0 || check_msg(kv, &D_ENTITY, 0) < 0)
                    goto out;
            } else if (skip(&sub, wt) < 0) {
                goto out;
            }
        }
    }
    /* As otlp.parse: str(service or "unknown_service"), str(host or ""), pid or 0. */
    c->service = service && PyUnicode_GET_LENGTH(service) > 0 ? new_ref(service)
                                                               : new_ref(s_unknown);
    c->host = new_ref(host ? host : s_empty);
    c->pid = pid ? new_ref(pid) : PyLong_FromLong(0);
    if (c->pid == NULL)
        goto out;
    c->ident = ident; /* borrowed: freed below */
    /* Pass 2: the spans. */
    r = all;
    while (r.p < r.end) {
        uint32_t num, wt;
        if (rd_tag(&r, &num, &wt) < 0 || rd_len_or_skip(&r, wt, &sub) < 0)
            goto out;
        if (num == 2 && scope_spans(sub, c) < 0)
            goto out;
    }
    ret = 0;
out:
    Py_CLEAR(c->service);
    Py_CLEAR(c->host);
    Py_CLEAR(c->pid);
    c->ident = NULL;
    Py_XDECREF(ident);
    Py_XDECREF(service);
    Py_XDECREF(host);
    Py_XDECREF(pid);
    return ret;
}

static int as_i64(PyObject *o, int64_t *out) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()))
        return GIVE_UP;
    *out = v;
    return 0;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer body;
    PyObject *received_ms, *oldest, *now, *out = NULL;
    (void)self;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_otlp_fast.configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*O!OO", &body, &PyLong_Type, &received_ms, &oldest, &now))
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.received_ms = received_ms;
    c.rows = PyList_New(0);
    c.tids = PyList_New(0);
    Rd r = {(const uint8_t *)body.buf, (const uint8_t *)body.buf + body.len};
    if (c.rows == NULL || c.tids == NULL || as_i64(oldest, &c.oldest_ns) < 0 ||
        as_i64(now, &c.now_ns) < 0 || c.now_ns > INT64_MAX - future_slack_ns)
        goto give_up;
    while (r.p < r.end) {
        uint32_t num, wt;
        Rd sub;
        if (rd_tag(&r, &num, &wt) < 0)
            goto give_up;
        if (num != 1) {
            if (skip(&r, wt) < 0)
                goto give_up;
        } else if (wt != WT_LEN || rd_len(&r, &sub) < 0 || resource_spans(sub, &c) < 0) {
            goto give_up;
        }
    }
    out = Py_BuildValue("(OOn)", c.rows, c.tids, c.ignored);
give_up:
    if (out == NULL) {
        PyErr_Clear(); /* whatever went wrong, the Python path decides */
        out = new_ref(Py_None);
    }
    Py_XDECREF(c.rows);
    Py_XDECREF(c.tids);
    PyBuffer_Release(&body);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(names, route, max_duration_ns, future_slack_ns): attribute names in slot "
     "order (otlp._FAST_NAMES), the route function, the span limits."},
    {"parse", parse, METH_VARARGS,
     "parse(body, received_ms, oldest_ns, now_ns) -> (rows, trace_ids, ignored) or None "
     "(give up: run the Python path)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlp_fast",
                                    "Compiled OTLP/protobuf span decoder (see otlp.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__otlp_fast(void) {
    s_sdk = PyUnicode_InternFromString("sdk");
    s_unknown = PyUnicode_InternFromString("unknown_service");
    s_empty = PyUnicode_FromString("");
    if (s_sdk == NULL || s_unknown == NULL || s_empty == NULL)
        return NULL;
    return PyModule_Create(&module);
}
