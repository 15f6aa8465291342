/* Compiled HTTP/1.x head parsing (agent/protocols/http1_head.py ``parse_request`` and
 * ``parse_response``).
 *
 * Why: two heads are parsed per request, and in CPython they are ~35 % of the agent's
 * per-request path (docs/benchmarks.md, "The request path alone, replayed"): a lowercased
 * copy of the block, a find per wanted header, a regex per first line, each a bytecode
 * round. This walks the head's lines once and compares the few wanted names in place.
 *
 * Contract: parse_request(head) and parse_response(data) return what the Python reference
 * (http1_head._parse_request_py, _parse_response_py) returns for the same bytes: the same
 * named tuple, field for field (tests/agent/test_http1_fast.py holds them to it on drawn
 * heads). What is not byte work stays the reference's own function, called from here only
 * where a head needs it: the traceparent's parse (parallax_contracts.trace_context), a path
 * with ";" parameters or a scheme, a traceparent in the query, Server-Timing's metric.
 *
 * Safety: the agent runs privileged and these bytes come from any client. Every read is
 * inside the bytes object (its length bounds each loop); nothing is written but new Python
 * objects; no state is kept between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyTypeObject *request_type, *response_type;
/* trace_context.parse(str), clean_path(str), the query's traceparent (str) -> str | None,
 * Server-Timing's traceparent (bytes) -> TraceContext | None */
static PyObject *trace_parse, *clean_path, *query_traceparent, *server_traceparent;
static PyObject *version_text[2], *empty_bytes;

/* The methods, from configure (http1_head's table: one list): names and their text. */
#define MAX_METHODS 32
static int n_methods;
static char method_names[MAX_METHODS][11];
static Py_ssize_t method_lens[MAX_METHODS];
static PyObject *method_text[MAX_METHODS];

static inline unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* Whether p[i:i+n] lowercased is `w` (lowercase, n bytes); the caller bounds i + n. */
static int lower_is(const char *p, Py_ssize_t i, const char *w, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++)
        if (lower((unsigned char)p[i + k]) != (unsigned char)w[k])
            return 0;
    return 1;
}

/* The first "\r\n" at or after `from`, before `end`; -1 if none. */
static Py_ssize_t find_crlf(const char *p, Py_ssize_t from, Py_ssize_t end) {
    while (from + 1 < end) {
        const char *r = memchr(p + from, '\r', (size_t)(end - 1 - from));
        if (r == NULL)
            return -1;
        Py_ssize_t i = r - p;
        if (p[i + 1] == '\n')
            return i;
        from = i + 1;
    }
    return -1;
}

/* A header value: its span, [start, stop) stripped of " \t"; found: start >= 0. */
typedef struct {
    Py_ssize_t start, stop;
} span_t;

enum { H_TRACEPARENT, H_CONTENT_LENGTH, H_TRANSFER_ENCODING, H_UPGRADE, H_SERVER_TIMING,
       H_CONTENT_TYPE, H_WS_EXTENSIONS, N_HEADERS };
static const struct {
    const char *name;
    Py_ssize_t len;
} header_names[N_HEADERS] = {
    {"traceparent:", 12}, {"content-length:", 15}, {"transfer-encoding:", 18}, {"upgrade:", 8},
    {"server-timing:", 14}, {"content-type:", 13}, {"sec-websocket-extensions:", 25}};

/* Each wanted header's first value in the block [b0, b1): a header is "\r\n", its name in
 * any case and ":" (the reference's find of that in the lowercased block), its value up to
 * the next "\r\n" inside the block or the block's end. */
static void find_headers(const char *p, Py_ssize_t b0, Py_ssize_t b1, unsigned wanted,
                         span_t out[N_HEADERS]) {
    for (int h = 0; h < N_HEADERS; h++)
        out[h].start = -1;
    Py_ssize_t i = find_crlf(p, b0, b1);
    while (i >= 0 && wanted) {
        Py_ssize_t name = i + 2, next = find_crlf(p, name, b1);
        for (int h = 0; h < N_HEADERS; h++) {
            Py_ssize_t n = header_names[h].len;
            if (!(wanted & (1u << h)) || name + n > b1)
                continue;
            if (!lower_is(p, name, header_names[h].name, n))
                continue;
            /* the value ends at the line's end: the name holds no "\r\n" */
            Py_ssize_t s = name + n, e = next < 0 ? b1 : next;
            while (s < e && (p[s] == ' ' || p[s] == '\t'))
                s++;
            while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
                e--;
            out[h].start = s;
            out[h].stop = e;
            wanted &= ~(1u << h);
            break;
        }
        i = next;
    }
}

/* _length: a length of 1-19 ASCII digits into *x (unsigned: 19 digits may exceed a signed
 * 64-bit); 0 when malformed. */
static int length_of(const char *p, span_t v, unsigned long long *x) {
    Py_ssize_t n = v.stop - v.start;
    if (n <= 0 || n > 19)
        return 0;
    *x = 0;
    for (Py_ssize_t k = v.start; k < v.stop; k++) {
        if (p[k] < '0' || p[k] > '9')
            return 0;
        *x = *x * 10 + (unsigned long long)(p[k] - '0');
    }
    return 1;
}

/* The lowercased value's bytes. */
static PyObject *lower_bytes(const char *p, span_t v) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, v.stop - v.start);
    if (b == NULL)
        return NULL;
    char *q = PyBytes_AS_STRING(b);
    for (Py_ssize_t k = v.start; k < v.stop; k++)
        q[k - v.start] = (char)lower((unsigned char)p[k]);
    return b;
}

/* Whether the lowercased value contains "chunked". */
static int has_chunked(const char *p, span_t v) {
    for (Py_ssize_t i = v.start; i + 7 <= v.stop; i++)
        if (lower_is(p, i, "chunked", 7))
            return 1;
    return 0;
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* A tuple subclass (the named tuple) filled with `n` new references (stolen; NULL: fails). */
static PyObject *make(PyTypeObject *type, PyObject **items, Py_ssize_t n) {
    PyObject *t = NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        if (items[k] == NULL)
            goto fail;
    t = type->tp_alloc(type, n);
    if (t == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < n; k++)
        PyTuple_SET_ITEM(t, k, items[k]);
    return t;
fail:
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(items[k]);
    return NULL;
}

/* Whether a call may go on: configured, and given bytes (else the error is set). */
static int usable(PyObject *arg, const char *who) {
    if (request_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_http1_fast.configure() was not called");
        return 0;
    }
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() takes bytes", who);
        return 0;
    }
    return 1;
}

/* The request line: "METHOD SP target SP HTTP/1.x", then the line's end (or one "\n" and
 * its end: the reference's "$"). Returns the method's index, or -1. */
static int request_line(const char *p, Py_ssize_t end, Py_ssize_t *t0, Py_ssize_t *t1,
                        int *minor) {
    Py_ssize_t m = 0;
    while (m < end && m < 11 && p[m] >= 'A' && p[m] <= 'Z')
        m++;
    if (m < 3 || m > 10 || m >= end || p[m] != ' ')
        return -1;
    int method = -1;
    for (int k = 0; k < n_methods; k++)
        if (method_lens[k] == m && memcmp(method_names[k], p, (size_t)m) == 0) {
            method = k;
            break;
        }
    if (method < 0)
        return -1;
    Py_ssize_t s = m + 1, e = s;
    while (e < end && !is_space((unsigned char)p[e]))
        e++;
    if (e == s || end - e < 9 || memcmp(p + e, " HTTP/1.", 8) != 0)
        return -1;
    char v = p[e + 8];
    if (v != '0' && v != '1')
        return -1;
    Py_ssize_t after = e + 9;
    if (!(after == end || (after == end - 1 && p[after] == '\n')))
        return -1;
    *t0 = s;
    *t1 = e;
    *minor = v - '0';
    return method;
}

static PyObject *parse_request(PyObject *self, PyObject *arg) {
    (void)self;
    if (!usable(arg, "parse_request"))
        return NULL;
    const char *p = PyBytes_AS_STRING(arg);
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    Py_ssize_t end = find_crlf(p, 0, len);
    if (end < 0)
        end = len > 0 ? len - 1 : 0;
    Py_ssize_t t0, t1;
    int minor;
    int method = request_line(p, end, &t0, &t1, &minor);
    if (method < 0)
        Py_RETURN_NONE;
    span_t h[N_HEADERS];
    find_headers(p, end, len,
                 1u << H_TRACEPARENT | 1u << H_CONTENT_LENGTH | 1u << H_TRANSFER_ENCODING |
                     1u << H_UPGRADE,
                 h);
    /* the path: the target up to "?", cleaned by the reference when it has ";" or "://" */
    Py_ssize_t q = t0;
    while (q < t1 && p[q] != '?')
        q++;
    int plain = 1;
    for (Py_ssize_t k = t0; k < q && plain; k++)
        if (p[k] == ';' || (p[k] == ':' && k + 2 < q && p[k + 1] == '/' && p[k + 2] == '/'))
            plain = 0;
    PyObject *path = PyUnicode_DecodeLatin1(p + t0, q - t0, NULL);
    if (path != NULL && !plain)
        Py_SETREF(path, PyObject_CallOneArg(clean_path, path));
    if (path == NULL)
        return NULL;
    PyObject *tp_value = NULL; /* str, or NULL: none sent */
    if (h[H_TRACEPARENT].start >= 0) {
        tp_value = PyUnicode_DecodeLatin1(p + h[H_TRACEPARENT].start,
                                          h[H_TRACEPARENT].stop - h[H_TRACEPARENT].start, NULL);
    } else if (q < t1) {
        /* EventSource and WebSocket cannot send headers: the probe puts it in the query */
        static const char w[] = "traceparent";
        int in_query = 0;
        for (Py_ssize_t i = q + 1; i + 11 <= t1 && !in_query; i++)
            in_query = memcmp(p + i, w, 11) == 0;
        if (in_query) {
            PyObject *query = PyUnicode_DecodeLatin1(p + q + 1, t1 - q - 1, NULL);
            tp_value = query == NULL ? NULL : PyObject_CallOneArg(query_traceparent, query);
            Py_XDECREF(query);
            if (tp_value == Py_None)
                Py_CLEAR(tp_value);
        }
    }
    if (tp_value == NULL && PyErr_Occurred()) { /* a decode or the reference's call failed */
        Py_DECREF(path);
        return NULL;
    }
    unsigned long long content_length = 0; /* absent or malformed: taken as no body */
    if (h[H_CONTENT_LENGTH].start >= 0 && !length_of(p, h[H_CONTENT_LENGTH], &content_length))
        content_length = 0;
    int chunked = h[H_TRANSFER_ENCODING].start >= 0 && has_chunked(p, h[H_TRANSFER_ENCODING]);
    int upgrade = h[H_UPGRADE].start >= 0 && h[H_UPGRADE].stop - h[H_UPGRADE].start == 9 &&
                  lower_is(p, h[H_UPGRADE].start, "websocket", 9);
    PyObject *tc = tp_value != NULL ? PyObject_CallOneArg(trace_parse, tp_value) : Py_NewRef(Py_None);
    PyObject *items[9] = {
        Py_NewRef(method_text[method]),
        path,
        Py_NewRef(version_text[minor]),
        tc,
        PyBool_FromLong(tp_value != NULL),
        PyLong_FromUnsignedLongLong(content_length),
        PyBool_FromLong(chunked),
        PyBool_FromLong(upgrade),
        PyLong_FromSsize_t(len),
    };
    Py_XDECREF(tp_value);
    return make(request_type, items, 9);
}

/* The status line: "HTTP/1.x SP ddd", then its end, or a space and anything but "\n" up to
 * it (one final "\n" allowed: the reference's "(?: .*)?$"). Returns the status, or -1. */
static int status_line(const char *p, Py_ssize_t end, int *minor) {
    if (end < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
        return -1;
    for (int k = 9; k < 12; k++)
        if (p[k] < '0' || p[k] > '9')
            return -1;
    Py_ssize_t r = 12, rest = end - r;
    if (rest > 0) {
        int ok_start = p[r] == ' ' || (rest == 1 && p[r] == '\n');
        if (!ok_start)
            return -1;
        /* no "\n" inside, but one may end it */
        const char *nl = memchr(p + r + 1, '\n', (size_t)(rest - 1));
        if (nl != NULL && nl != p + end - 1)
            return -1;
    }
    *minor = p[7] - '0';
    return (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
}

static PyObject *parse_response(PyObject *self, PyObject *arg) {
    (void)self;
    if (!usable(arg, "parse_response"))
        return NULL;
    const char *p = PyBytes_AS_STRING(arg);
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    Py_ssize_t end = find_crlf(p, 0, len);
    if (end < 0)
        end = len;
    int minor;
    int status = status_line(p, end, &minor);
    if (status < 0)
        Py_RETURN_NONE;
    /* the head's end: the first blank line of the whole capture */
    Py_ssize_t stop = -1;
    for (Py_ssize_t i = find_crlf(p, 0, len); i >= 0; i = find_crlf(p, i + 1, len))
        if (i + 3 < len && p[i + 2] == '\r' && p[i + 3] == '\n') {
            stop = i;
            break;
        }
    Py_ssize_t b1 = stop >= 0 ? stop : len;
    span_t h[N_HEADERS];
    find_headers(p, end, b1, /* (stop, when found, is at or after end) */
                 1u << H_CONTENT_LENGTH | 1u << H_TRANSFER_ENCODING | 1u << H_SERVER_TIMING |
                     1u << H_CONTENT_TYPE | 1u << H_WS_EXTENSIONS,
                 h);
    unsigned long long n; /* absent or malformed: None */
    PyObject *content_length = h[H_CONTENT_LENGTH].start >= 0 &&
                                       length_of(p, h[H_CONTENT_LENGTH], &n)
                                   ? PyLong_FromUnsignedLongLong(n)
                                   : Py_NewRef(Py_None);
    PyObject *server_tp = Py_NewRef(Py_None);
    if (h[H_SERVER_TIMING].start >= 0) {
        PyObject *st = PyBytes_FromStringAndSize(
            p + h[H_SERVER_TIMING].start, h[H_SERVER_TIMING].stop - h[H_SERVER_TIMING].start);
        Py_SETREF(server_tp, st == NULL ? NULL : PyObject_CallOneArg(server_traceparent, st));
        Py_XDECREF(st);
    }
    PyObject *items[8] = {
        PyLong_FromLong(status),
        Py_NewRef(version_text[minor]),
        stop >= 0 ? PyLong_FromSsize_t(stop + 4) : Py_NewRef(Py_None),
        content_length,
        PyBool_FromLong(h[H_TRANSFER_ENCODING].start >= 0 &&
                        has_chunked(p, h[H_TRANSFER_ENCODING])),
        server_tp,
        h[H_CONTENT_TYPE].start >= 0 ? lower_bytes(p, h[H_CONTENT_TYPE]) : Py_NewRef(empty_bytes),
        h[H_WS_EXTENSIONS].start >= 0 ? lower_bytes(p, h[H_WS_EXTENSIONS])
                                      : Py_NewRef(empty_bytes),
    };
    return make(response_type, items, 8);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rq, *rs, *tp, *cp, *qt, *st, *methods;
    if (!PyArg_ParseTuple(args, "OOOOOOO!:configure", &rq, &rs, &tp, &cp, &qt, &st,
                          &PyDict_Type, &methods))
        return NULL;
    if (PyDict_GET_SIZE(methods) > MAX_METHODS) {
        PyErr_SetString(PyExc_ValueError, "configure: more methods than MAX_METHODS");
        return NULL;
    }
    if (!PyType_Check(rq) || !PyType_IsSubtype((PyTypeObject *)rq, &PyTuple_Type) ||
        !PyType_Check(rs) || !PyType_IsSubtype((PyTypeObject *)rs, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the two heads must be tuple types");
        return NULL;
    }
    if (!PyCallable_Check(tp) || !PyCallable_Check(cp) || !PyCallable_Check(qt) ||
        !PyCallable_Check(st)) {
        PyErr_SetString(PyExc_TypeError, "configure: four callables expected");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *name, *text;
    int n = 0;
    while (PyDict_Next(methods, &pos, &name, &text)) {
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) < 3 || PyBytes_GET_SIZE(name) > 10 ||
            !PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_ValueError, "configure: methods are bytes (3-10) -> str");
            return NULL;
        }
        memcpy(method_names[n], PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
        method_lens[n] = PyBytes_GET_SIZE(name);
        Py_XSETREF(method_text[n], Py_NewRef(text));
        n++;
    }
    n_methods = n;
    Py_XSETREF(request_type, (PyTypeObject *)Py_NewRef(rq));
    Py_XSETREF(response_type, (PyTypeObject *)Py_NewRef(rs));
    Py_XSETREF(trace_parse, Py_NewRef(tp));
    Py_XSETREF(clean_path, Py_NewRef(cp));
    Py_XSETREF(query_traceparent, Py_NewRef(qt));
    Py_XSETREF(server_traceparent, Py_NewRef(st));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(RequestHead, ResponseHead, trace_parse, clean_path, query_traceparent, "
     "server_traceparent, methods)"},
    {"parse_request", parse_request, METH_O, "parse_request(head: bytes) -> RequestHead | None"},
    {"parse_response", parse_response, METH_O,
     "parse_response(data: bytes) -> ResponseHead | None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_http1_fast", "HTTP/1.x head parsing (agent/protocols/http1_head.py).",
    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__http1_fast(void) {
    version_text[0] = PyUnicode_InternFromString("1.0");
    version_text[1] = PyUnicode_InternFromString("1.1");
    empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (version_text[0] == NULL || version_text[1] == NULL || empty_bytes == NULL)
        return NULL;
    return PyModule_Create(&module);
}
