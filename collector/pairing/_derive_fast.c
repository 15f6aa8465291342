/* Compiled one-hop pair derivation (collector/pairing/rules.py ``derive``, one hop).
 *
 * Why: a pair is derived once per request; in CPython the derivation of a one-hop pair costs
 * ~8.5 µs (each field read, each None test and each float a bytecode round), the collector's
 * largest per-row stage. This does the same steps in C.
 *
 * Contract: derive_one(entry, span, sample_th, version) returns the PairRow that
 * rules.derive(entry, [span], [], 0, sample_th, version) returns: the same fields, equal and
 * of the same types (tests/collector/test_derive_fast.py holds them to it on drawn rows),
 * or raises what it raises. It returns None ("use the reference") for rows it does not
 * model: a row that is not a tuple of the configured length, a list field that is not a list
 * or tuple. Every arithmetic step is the Python one (PyNumber_*, PyObject_IsTrue for `or`,
 * the rich comparisons for max and >=) in the reference's order, so the results are the
 * reference's bit for bit whatever the values' types; the LLM columns are the reference's
 * own function (llm.pair_columns) when either side read a stream dialect.
 *
 * Fields are found by name: configure() takes the three rows' field names and looks up the
 * ones used here; a pair field that is neither computed here nor given a constant makes
 * configure fail (ValueError), so a column added to PairRow without this file turns the
 * compiled path off (said in the log) instead of writing a wrong row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The entry fields read. */
#define ENTRY_FIELDS(X) \
    X(E_TIME, "time") X(E_SITE, "site") X(E_SESSION, "session") X(E_KIND, "kind") \
    X(E_TRACE_ID, "trace_id") X(E_SPAN_ID, "span_id") X(E_SEQ, "seq") X(E_COARSE, "coarse") \
    X(E_CHUNKS_COARSE, "chunks_coarse") X(E_ROUTE, "route") X(E_METHOD, "method") \
    X(E_STATUS, "status") X(E_TIME_ORIGIN, "time_origin_ms") X(E_DRIFT, "clock_drift_ms") \
    X(E_T0, "request_start_ms") X(E_T3, "response_start_ms") X(E_END, "response_end_ms") \
    X(E_FIRST, "first_chunk_ms") X(E_CHUNK_MS, "chunk_ms") X(E_RENDERED, "rendered_ms") \
    X(E_LLM_FIRST, "llm_first_token_ms") X(E_LLM_DIALECT, "llm_dialect")
/* The span fields read. */
#define SPAN_FIELDS(X) \
    X(S_TIME, "time") X(S_TTFB, "ttfb_us") X(S_DURATION, "duration_us") X(S_TTFT, "ttft_us") \
    X(S_OFFSETS, "chunk_offsets_us") X(S_ARRIVAL, "arrival") X(S_RECV_QUEUE, "recv_queue_us") \
    X(S_RETRANSMITS, "retransmits") X(S_SRTT, "srtt_us") X(S_ATTRS, "attributes") \
    X(S_SERVICE, "service") X(S_ROUTE, "route") X(S_METHOD, "method") X(S_STATUS, "status") \
    X(S_SPAN_ID, "span_id")
/* The pair fields computed here; the others (the LLM columns) come from configure's
 * constants (their absent values) or from llm.pair_columns. */
#define PAIR_FIELDS(X) \
    X(P_TIME, "time") X(P_VERSION, "version") X(P_PAIRED_AT, "paired_at") X(P_SITE, "site") \
    X(P_SESSION, "session") X(P_SERVICE, "service") X(P_ROUTE, "route") \
    X(P_METHOD, "method") X(P_STATUS, "status") X(P_KIND, "kind") X(P_TRACE_ID, "trace_id") \
    X(P_SPAN_ID, "span_id") X(P_SEQ, "seq") X(P_COARSE, "coarse") \
    X(P_CHUNKS_COARSE, "chunks_coarse") X(P_USER_TTFB, "user_ttfb_ms") \
    X(P_USER_TTFT, "user_ttft_ms") X(P_USER_VISIBLE_TTFT, "user_visible_ttft_ms") \
    X(P_USER_DURATION, "user_duration_ms") X(P_USER_ITL, "user_itl_ms") \
    X(P_RENDER_DELAY, "render_delay_ms") X(P_SERVER_TTFB, "server_ttfb_ms") \
    X(P_SERVER_TTFT, "server_ttft_ms") X(P_SERVER_DURATION, "server_duration_ms") \
    X(P_SERVER_ITL, "server_itl_ms") X(P_SERVER_TIMED, "server_timed") X(P_HOPS, "hops") \
    X(P_HOP_SPAN_IDS, "hop_span_ids") X(P_HOP_SERVICES, "hop_services") \
    X(P_HOP_ADDED, "hop_added_ms") X(P_EDGE_ITL, "edge_itl_ms") \
    X(P_LINKED, "linked_span_ids") X(P_RECONNECTS, "reconnects") X(P_NETWORK, "network_ms") \
    X(P_QUEUE, "queue_ms") X(P_ACCEPT_QUEUE, "accept_queue_ms") \
    X(P_RECV_QUEUE, "recv_queue_ms") X(P_RETRANSMITS, "retransmits") X(P_SRTT, "srtt_ms") \
    X(P_THETA, "theta_ms") X(P_THETA_DELAY, "theta_delay_ms") X(P_SAMPLE_TH, "sample_th") \
    X(P_WIRE_HOLD, "wire_hold_ms") X(P_WIRE_HOLD_REASON, "wire_hold_reason") \
    X(P_RETRANSMIT_WAIT, "retransmit_wait_ms")

#define AS_ENUM(e, name) e,
#define AS_NAME(e, name) name,
enum { ENTRY_FIELDS(AS_ENUM) N_ENTRY };
enum { SPAN_FIELDS(AS_ENUM) N_SPAN };
enum { PAIR_FIELDS(AS_ENUM) N_COMPUTED };
static const char *const entry_names[] = {ENTRY_FIELDS(AS_NAME)};
static const char *const span_names[] = {SPAN_FIELDS(AS_NAME)};
static const char *const pair_names[] = {PAIR_FIELDS(AS_NAME)};

#define MAX_PAIR 128
static struct {
    PyTypeObject *pair_type; /* NULL until configured */
    Py_ssize_t n_entry, n_span, n_pair;
    Py_ssize_t entry_ix[N_ENTRY], span_ix[N_SPAN], pair_ix[N_COMPUTED];
    /* per pair position: a constant (the LLM columns' absent values), or NULL: computed */
    PyObject *constant[MAX_PAIR];
    Py_ssize_t llm_first, n_llm; /* where llm.pair_columns' values go */
    PyObject *pair_columns;      /* llm.pair_columns */
    PyObject *hold_max, *hold_reason, *retransmit_wait, *dialect; /* attribute names */
    PyObject *zero_f, *zero_i, *thousand, *million_f, *milli, *two, *million_i, *empty;
} C;

#define EF(e, f) PyTuple_GET_ITEM((e), C.entry_ix[f])
#define SF(s, f) PyTuple_GET_ITEM((s), C.span_ix[f])

/* --- the reference's small steps, each the same Python operations ---------------------- */

/* a - b, or None when either is None (user_ttfb_ms …). New reference. */
static PyObject *sub_opt(PyObject *a, PyObject *b) {
    if (a == Py_None || b == Py_None) Py_RETURN_NONE;
    return PyNumber_Subtract(a, b);
}

/* x / d, or None when x is None. New reference. */
static PyObject *div_opt(PyObject *x, PyObject *d) {
    if (x == Py_None) Py_RETURN_NONE;
    return PyNumber_TrueDivide(x, d);
}

/* `a or b`: borrowed, as Python returns one of the two objects; NULL on error. */
static PyObject *or_(PyObject *a, PyObject *b) {
    int t = PyObject_IsTrue(a);
    return t < 0 ? NULL : t ? a : b;
}

/* _gaps(xs or [], scale): [b - a] (scale None: 1.0) or [(b - a) * scale]. New reference;
 * NULL with no error set: xs is not a list or tuple (not modelled). */
static PyObject *gaps(PyObject *xs, PyObject *scale) {
    int t = PyObject_IsTrue(xs);
    if (t < 0) return NULL;
    if (!t) return PyList_New(0);
    if (!PyList_CheckExact(xs) && !PyTuple_CheckExact(xs)) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(xs);
    PyObject **items = PySequence_Fast_ITEMS(xs);
    PyObject *out = PyList_New(n > 1 ? n - 1 : 0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *d = PyNumber_Subtract(items[i], items[i - 1]);
        if (d != NULL && scale != NULL) Py_SETREF(d, PyNumber_Multiply(d, scale));
        if (d == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i - 1, d);
    }
    return out;
}

/* `(attrs or {}).get(name)`: a new reference (None when absent); NULL on error. */
static PyObject *attr_get(PyObject *attrs, PyObject *name) {
    int t = PyObject_IsTrue(attrs);
    if (t < 0) return NULL;
    if (!t) Py_RETURN_NONE;
    if (PyDict_CheckExact(attrs)) {
        PyObject *v = PyDict_GetItemWithError(attrs, name);
        return v != NULL ? Py_NewRef(v) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    return PyObject_CallMethod(attrs, "get", "O", name);
}

/* rules._attr_ms: an attribute's µs text in ms; None when absent, empty, not a whole number
 * or negative. New reference. */
static PyObject *attr_ms(PyObject *attrs, PyObject *name) {
    PyObject *raw = attr_get(attrs, name);
    if (raw == NULL || raw == Py_None) return raw;
    int empty = PyObject_RichCompareBool(raw, C.empty, Py_EQ);
    PyObject *v = empty == 0 ? PyNumber_Long(raw) : NULL;
    Py_DECREF(raw);
    if (empty) return empty < 0 ? NULL : Py_NewRef(Py_None);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int ge = PyObject_RichCompareBool(v, C.zero_i, Py_GE);
    PyObject *out = ge < 0 ? NULL : ge ? PyNumber_TrueDivide(v, C.thousand) : Py_NewRef(Py_None);
    Py_DECREF(v);
    return out;
}

/* --- derive_one ---------------------------------------------------------------------- */

/* Sets a computed field (steals v); false when v is NULL (an error is set). */
#define PUT(f, v) ((tmp = (v)) != NULL && (PyTuple_SET_ITEM(row, C.pair_ix[f], tmp), 1))
#define TRY(x)          \
    do {                \
        if (!(x)) goto fail; \
    } while (0)

/* The user's parts (derive's first lines). */
static int user_parts(PyObject *row, PyObject *e, PyObject **user_ttfb) {
    PyObject *tmp, *t0 = EF(e, E_T0), *first = EF(e, E_FIRST), *rendered = EF(e, E_RENDERED);
    TRY(PUT(P_USER_TTFB, sub_opt(EF(e, E_T3), t0)));
    *user_ttfb = tmp;
    TRY(PUT(P_USER_TTFT, sub_opt(first, t0)));
    TRY(PUT(P_USER_VISIBLE_TTFT, sub_opt(rendered, t0)));
    TRY(PUT(P_USER_DURATION, sub_opt(EF(e, E_END), t0)));
    PyObject *itl = gaps(EF(e, E_CHUNK_MS), NULL);
    if (itl == NULL) return PyErr_Occurred() ? -1 : 1;
    TRY(PUT(P_USER_ITL, itl));
    /* _painted_after: the first chunk, or the first answer token on an LLM stream */
    PyObject *llm_first = EF(e, E_LLM_FIRST);
    PyObject *shown = llm_first == Py_None ? first : llm_first;
    TRY(PUT(P_RENDER_DELAY, sub_opt(rendered, shown)));
    return 0;
fail:
    return -1;
}

/* theta_ms: the browser's wall clock at t0/t3 against the edge hop's arrival/t2. */
static PyObject *theta(PyObject *e, PyObject *arrival, PyObject *t2) {
    PyObject *t0 = EF(e, E_T0), *t3 = EF(e, E_T3);
    if (t0 == Py_None || t3 == Py_None) Py_RETURN_NONE;
    PyObject *drift = or_(EF(e, E_DRIFT), C.zero_f);
    if (drift == NULL) return NULL;
    PyObject *a = PyNumber_Float(EF(e, E_TIME_ORIGIN)), *b = PyNumber_Float(drift);
    PyObject *origin = a && b ? PyNumber_Add(a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (origin == NULL) return NULL;
    PyObject *v[7] = {0};
    PyObject *out = NULL;
    if ((v[0] = PyNumber_TrueDivide(arrival, C.million_f)) && (v[1] = PyNumber_Add(origin, t0)) &&
        (v[2] = PyNumber_Subtract(v[0], v[1])) && (v[3] = PyNumber_TrueDivide(t2, C.million_f)) &&
        (v[4] = PyNumber_Add(origin, t3)) && (v[5] = PyNumber_Subtract(v[3], v[4])) &&
        (v[6] = PyNumber_Add(v[2], v[5])))
        out = PyNumber_TrueDivide(v[6], C.two);
    for (int i = 0; i < 7; i++) Py_XDECREF(v[i]);
    Py_DECREF(origin);
    return out;
}

/* _server_parts of one hop: the span is both edge and origin. 1: not modelled. */
static int server_parts(PyObject *row, PyObject *e, PyObject *s, PyObject *user_ttfb) {
    PyObject *tmp, *ttfb = SF(s, S_TTFB), *f = NULL, *t2 = NULL, *arrival = NULL, *x = NULL;
    PyObject *span_ms = NULL, *queue = NULL, *recv = NULL, *network = NULL, *th = NULL;
    int rc = -1;
    f = PyNumber_Float(ttfb != Py_None ? ttfb : SF(s, S_DURATION)); /* _ttfb_us */
    TRY(f && PUT(P_SERVER_TTFB, PyNumber_TrueDivide(f, C.thousand)));
    TRY(PUT(P_SERVER_TTFT, div_opt(SF(s, S_TTFT), C.thousand)));
    TRY((x = PyNumber_Float(SF(s, S_DURATION))));
    TRY(PUT(P_SERVER_DURATION, PyNumber_TrueDivide(x, C.thousand)));
    PyObject *itl = gaps(SF(s, S_OFFSETS), C.milli);
    if (itl == NULL) {
        rc = PyErr_Occurred() ? -1 : 1;
        goto fail;
    }
    TRY(PUT(P_SERVER_ITL, itl));
    TRY(PUT(P_EDGE_ITL, PyList_GetSlice(itl, 0, PyList_GET_SIZE(itl))));
    PyTuple_SET_ITEM(row, C.pair_ix[P_SERVER_TIMED], PyBool_FromLong(ttfb != Py_None));
    /* edge_t2 = float(time) + ttfb_us * 1000.0; the arrival: int(a) if a else int(time) */
    Py_SETREF(x, PyNumber_Float(SF(s, S_TIME)));
    TRY(x && (tmp = PyNumber_Multiply(f, C.thousand)));
    t2 = PyNumber_Add(x, tmp);
    Py_DECREF(tmp);
    PyObject *a = SF(s, S_ARRIVAL);
    int has_arrival = PyObject_IsTrue(a);
    TRY(t2 && has_arrival >= 0 && (arrival = PyNumber_Long(has_arrival ? a : SF(s, S_TIME))));
    Py_SETREF(x, PyNumber_Subtract(t2, arrival));
    TRY(x && (span_ms = PyNumber_TrueDivide(x, C.million_f)));
    TRY(PUT(P_HOP_ADDED, PyList_New(1)));
    PyList_SET_ITEM(tmp, 0, Py_NewRef(span_ms));
    if (has_arrival) { /* queue = (time - arrival) / 1e6, on the span's own arrival */
        Py_SETREF(x, PyNumber_Subtract(SF(s, S_TIME), a));
        TRY(x && (queue = PyNumber_TrueDivide(x, C.million_f)));
    } else
        queue = Py_NewRef(Py_None);
    TRY((recv = div_opt(SF(s, S_RECV_QUEUE), C.thousand)));
    network = user_ttfb == Py_None ? Py_NewRef(Py_None) : PyNumber_Subtract(user_ttfb, span_ms);
    TRY(network && (th = theta(e, arrival, t2)));
    if (queue == Py_None || recv == Py_None)
        tmp = Py_NewRef(Py_None);
    else { /* max(0.0, queue - recv) */
        Py_SETREF(x, PyNumber_Subtract(queue, recv));
        int gt = x ? PyObject_RichCompareBool(x, C.zero_f, Py_GT) : -1;
        TRY(gt >= 0);
        tmp = Py_NewRef(gt ? x : C.zero_f);
    }
    PyTuple_SET_ITEM(row, C.pair_ix[P_ACCEPT_QUEUE], tmp);
    PyTuple_SET_ITEM(row, C.pair_ix[P_NETWORK], Py_NewRef(network));
    PyTuple_SET_ITEM(row, C.pair_ix[P_QUEUE], Py_NewRef(queue));
    PyTuple_SET_ITEM(row, C.pair_ix[P_RECV_QUEUE], Py_NewRef(recv));
    PyTuple_SET_ITEM(row, C.pair_ix[P_RETRANSMITS], Py_NewRef(SF(s, S_RETRANSMITS)));
    TRY(PUT(P_SRTT, div_opt(SF(s, S_SRTT), C.thousand)));
    PyTuple_SET_ITEM(row, C.pair_ix[P_THETA_DELAY], Py_NewRef(th != Py_None ? network : Py_None));
    PyTuple_SET_ITEM(row, C.pair_ix[P_THETA], Py_NewRef(th));
    rc = 0;
fail:
    Py_XDECREF(f);
    Py_XDECREF(t2);
    Py_XDECREF(arrival);
    Py_XDECREF(x);
    Py_XDECREF(span_ms);
    Py_XDECREF(queue);
    Py_XDECREF(recv);
    Py_XDECREF(network);
    Py_XDECREF(th);
    return rc;
}

/* Who: the entry's identity, the origin's service and what it said of the request. */
static int who(PyObject *row, PyObject *e, PyObject *s, PyObject *version) {
    PyObject *tmp, *v;
    PyTuple_SET_ITEM(row, C.pair_ix[P_TIME], Py_NewRef(EF(e, E_TIME)));
    PyTuple_SET_ITEM(row, C.pair_ix[P_VERSION], Py_NewRef(version));
    TRY(PUT(P_PAIRED_AT, PyNumber_FloorDivide(version, C.million_i)));
    static const int same[][2] = {{P_SITE, E_SITE}, {P_SESSION, E_SESSION}, {P_KIND, E_KIND},
                                  {P_TRACE_ID, E_TRACE_ID}, {P_SPAN_ID, E_SPAN_ID}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        PyTuple_SET_ITEM(row, C.pair_ix[same[i][0]], Py_NewRef(EF(e, same[i][1])));
    TRY((v = or_(EF(e, E_SEQ), C.zero_i)));
    PyTuple_SET_ITEM(row, C.pair_ix[P_SEQ], Py_NewRef(v));
    int coarse = PyObject_IsTrue(EF(e, E_COARSE)), chunks = PyObject_IsTrue(EF(e, E_CHUNKS_COARSE));
    TRY(coarse >= 0 && chunks >= 0);
    PyTuple_SET_ITEM(row, C.pair_ix[P_COARSE], PyBool_FromLong(coarse));
    PyTuple_SET_ITEM(row, C.pair_ix[P_CHUNKS_COARSE], PyBool_FromLong(chunks));
    PyObject *service = SF(s, S_SERVICE);
    PyTuple_SET_ITEM(row, C.pair_ix[P_SERVICE], Py_NewRef(service));
    /* (origin.route or e.route or ""), the same for the method */
    static const int text[][3] = {{P_ROUTE, S_ROUTE, E_ROUTE}, {P_METHOD, S_METHOD, E_METHOD}};
    for (size_t i = 0; i < 2; i++) {
        TRY((v = or_(SF(s, text[i][1]), EF(e, text[i][2]))) && (v = or_(v, C.empty)));
        PyTuple_SET_ITEM(row, C.pair_ix[text[i][0]], Py_NewRef(v));
    }
    /* int(origin.status or e.status or 0) */
    TRY((v = or_(SF(s, S_STATUS), EF(e, E_STATUS))) && (v = or_(v, C.zero_i)));
    TRY(PUT(P_STATUS, PyNumber_Long(v)));
    TRY(PUT(P_HOPS, PyLong_FromLong(1)));
    TRY(PUT(P_HOP_SPAN_IDS, PyList_New(1)));
    PyList_SET_ITEM(tmp, 0, Py_NewRef(SF(s, S_SPAN_ID)));
    TRY(PUT(P_HOP_SERVICES, PyList_New(1)));
    PyList_SET_ITEM(tmp, 0, Py_NewRef(service));
    TRY(PUT(P_LINKED, PyList_New(0)));
    PyTuple_SET_ITEM(row, C.pair_ix[P_RECONNECTS], PyLong_FromLong(0));
    return 0;
fail:
    return -1;
}

/* hold_of and the retransmit wait (the hop's attributes), and the LLM columns. */
static int from_attributes(PyObject *row, PyObject *e, PyObject *s) {
    PyObject *tmp, *attrs = SF(s, S_ATTRS), *v;
    TRY(PUT(P_WIRE_HOLD, attr_ms(attrs, C.hold_max)));
    if (tmp == Py_None)
        v = Py_NewRef(C.empty);
    else
        TRY((v = attr_get(attrs, C.hold_reason)));
    PyObject *shown = or_(v, C.empty);
    (void)PUT(P_WIRE_HOLD_REASON, shown ? PyObject_Str(shown) : NULL);
    Py_DECREF(v);
    TRY(tmp);
    TRY(PUT(P_RETRANSMIT_WAIT, attr_ms(attrs, C.retransmit_wait)));
    /* llm.pair_columns' own fast test: neither side read a stream dialect → the constants */
    int user = PyObject_IsTrue(EF(e, E_LLM_DIALECT)), server = 0;
    TRY(user >= 0);
    if (!user) {
        server = PyObject_IsTrue(attrs);
        if (server > 0) server = PySequence_Contains(attrs, C.dialect);
        TRY(server >= 0);
    }
    if (!user && !server) return 0;
    PyObject *cols = PyObject_CallFunctionObjArgs(C.pair_columns, EF(e, E_T0), e, attrs,
                                                  SF(s, S_TTFT), NULL);
    TRY(cols);
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != C.n_llm) {
        Py_DECREF(cols);
        PyErr_SetString(PyExc_ValueError, "llm.pair_columns: not the pair's LLM columns");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < C.n_llm; i++) {
        Py_XSETREF(PyTuple_GET_ITEM(row, C.llm_first + i), Py_NewRef(PyTuple_GET_ITEM(cols, i)));
    }
    Py_DECREF(cols);
    return 0;
fail:
    return -1;
}

static PyObject *derive_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "derive_one(entry, span, sample_th, version)");
        return NULL;
    }
    PyObject *e = args[0], *s = args[1];
    if (C.pair_type == NULL || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != C.n_entry ||
        !PyTuple_Check(s) || PyTuple_GET_SIZE(s) != C.n_span)
        Py_RETURN_NONE;
    PyObject *row = C.pair_type->tp_alloc(C.pair_type, C.n_pair);
    if (row == NULL) return NULL;
    for (Py_ssize_t i = 0; i < C.n_pair; i++)
        if (C.constant[i] != NULL) PyTuple_SET_ITEM(row, i, Py_NewRef(C.constant[i]));
    PyObject *user_ttfb = NULL;
    int rc = user_parts(row, e, &user_ttfb);
    if (rc == 0) rc = server_parts(row, e, s, user_ttfb);
    if (rc == 0) rc = who(row, e, s, args[3]);
    if (rc == 0) rc = from_attributes(row, e, s);
    if (rc == 0) PyTuple_SET_ITEM(row, C.pair_ix[P_SAMPLE_TH], Py_NewRef(args[2]));
    if (rc == 0) return row;
    Py_DECREF(row);
    if (rc > 0) Py_RETURN_NONE; /* not modelled: the reference derives it */
    return NULL;
}

/* --- configure ------------------------------------------------------------------------ */

/* ix[i] = the position of names[i] in fields (a tuple of str); -1 on error. */
static int find_all(PyObject *fields, const char *const *names, int n, Py_ssize_t *ix,
                    const char *what) {
    for (int i = 0; i < n; i++) {
        ix[i] = -1;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(fields); j++) {
            PyObject *f = PyTuple_GET_ITEM(fields, j);
            if (PyUnicode_Check(f) && PyUnicode_CompareWithASCIIString(f, names[i]) == 0) {
                ix[i] = j;
                break;
            }
        }
        if (ix[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s has no field %s", what, names[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pair_type, *entry_fields, *span_fields, *constants, *llm_names, *pair_columns,
        *attr_names;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OO!:configure", &PyType_Type, &pair_type,
                          &PyTuple_Type, &entry_fields, &PyTuple_Type, &span_fields, &PyDict_Type,
                          &constants, &PyTuple_Type, &llm_names, &pair_columns, &PyTuple_Type,
                          &attr_names))
        return NULL;
    PyTypeObject *t = (PyTypeObject *)pair_type;
    PyObject *pair_fields = PyObject_GetAttrString(pair_type, "_fields");
    if (pair_fields == NULL) return NULL;
    int ok = PyType_IsSubtype(t, &PyTuple_Type) && PyTuple_Check(pair_fields) &&
             PyTuple_GET_SIZE(pair_fields) <= MAX_PAIR && PyTuple_GET_SIZE(attr_names) == 4;
    Py_ssize_t n = ok ? PyTuple_GET_SIZE(pair_fields) : 0;
    if (!ok) PyErr_SetString(PyExc_ValueError, "configure: a NamedTuple type, 4 names");
    Py_ssize_t pair_ix[N_COMPUTED], llm_ix[MAX_PAIR];
    if (!ok || find_all(entry_fields, entry_names, N_ENTRY, C.entry_ix, "EntryRow") ||
        find_all(span_fields, span_names, N_SPAN, C.span_ix, "SpanRow") ||
        find_all(pair_fields, pair_names, N_COMPUTED, pair_ix, "PairRow")) {
        Py_DECREF(pair_fields);
        return NULL;
    }
    /* The LLM columns: consecutive, each with its absent value among the constants. */
    Py_ssize_t n_llm = PyTuple_GET_SIZE(llm_names);
    const char *bad = NULL;
    for (Py_ssize_t i = 0; i < n_llm && bad == NULL; i++) {
        PyObject *name = PyTuple_GET_ITEM(llm_names, i);
        llm_ix[i] = PySequence_Index(pair_fields, name);
        if (llm_ix[i] < 0 || (i > 0 && llm_ix[i] != llm_ix[0] + i) ||
            PyDict_GetItemWithError(constants, name) == NULL)
            bad = "the LLM columns: consecutive pair fields, each with a constant";
    }
    /* Every pair field is computed here or an LLM column, never both, never neither. */
    for (Py_ssize_t j = 0; j < n && bad == NULL; j++) {
        int computed = 0, llm = n_llm > 0 && j >= llm_ix[0] && j < llm_ix[0] + n_llm;
        for (int i = 0; i < N_COMPUTED; i++) computed += pair_ix[i] == j;
        if (computed + llm != 1) bad = "a pair field neither computed nor an LLM column";
    }
    Py_DECREF(pair_fields);
    if (bad != NULL || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, bad ? bad : "configure: bad LLM names");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < MAX_PAIR; j++) Py_CLEAR(C.constant[j]);
    for (Py_ssize_t i = 0; i < n_llm; i++)
        C.constant[llm_ix[0] + i] =
            Py_NewRef(PyDict_GetItem(constants, PyTuple_GET_ITEM(llm_names, i)));
    memcpy(C.pair_ix, pair_ix, sizeof pair_ix);
    C.llm_first = n_llm ? llm_ix[0] : 0;
    C.n_llm = n_llm;
    C.n_entry = PyTuple_GET_SIZE(entry_fields);
    C.n_span = PyTuple_GET_SIZE(span_fields);
    C.n_pair = n;
    Py_XSETREF(C.pair_columns, Py_NewRef(pair_columns));
    Py_XSETREF(C.hold_max, Py_NewRef(PyTuple_GET_ITEM(attr_names, 0)));
    Py_XSETREF(C.hold_reason, Py_NewRef(PyTuple_GET_ITEM(attr_names, 1)));
    Py_XSETREF(C.retransmit_wait, Py_NewRef(PyTuple_GET_ITEM(attr_names, 2)));
    Py_XSETREF(C.dialect, Py_NewRef(PyTuple_GET_ITEM(attr_names, 3)));
    Py_XDECREF(C.pair_type);
    C.pair_type = (PyTypeObject *)Py_NewRef(pair_type);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(PairRow, EntryRow._fields, SpanRow._fields, constants, llm_names, "
     "pair_columns, (hold_max, hold_reason, retransmit_wait, dialect))"},
    {"derive_one", (PyCFunction)(void (*)(void))derive_one, METH_FASTCALL,
     "derive_one(entry, span, sample_th, version) -> PairRow | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_derive_fast", "One-hop pair derivation (collector/pairing/rules.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__derive_fast(void) {
    C.zero_f = PyFloat_FromDouble(0.0);
    C.zero_i = PyLong_FromLong(0);
    C.thousand = PyFloat_FromDouble(1000.0);
    C.million_f = PyFloat_FromDouble(1e6);
    C.milli = PyFloat_FromDouble(1e-3);
    C.two = PyFloat_FromDouble(2.0);
    C.million_i = PyLong_FromLong(1000000);
    C.empty = PyUnicode_FromString("");
    if (!C.zero_f || !C.zero_i || !C.thousand || !C.million_f || !C.milli || !C.two ||
        !C.million_i || !C.empty)
        return NULL;
    return PyModule_Create(&module);
}
