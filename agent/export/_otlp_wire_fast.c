/* The attribute loop of agent/export/otlp_wire.py, compiled: a span's ~25 KeyValue fields
 * in one pass, over a dict (attributes) or straight over a record's fields through
 * agent.records' table (record_attributes). In Python each attribute costs 0.5 µs or more
 * (a key lookup, a type test, bytes concatenations), 12 µs and more a span; here ~1 µs.
 *
 * otlp_wire.py's _attributes_py, with records.span_attributes, is the reference
 * (tests/agent/test_otlp_wire.py holds the two equal, and both to the OpenTelemetry SDK's
 * encoder). Values of the types records
 * carry are written here: str, int (int64), bool, float, and lists or tuples of them;
 * any other value (a subclass, bytes, a mapping, an int beyond int64) is handed to the
 * Python reference's any_value, so there is one rule for each.
 *
 * A length-delimited field is written with one byte reserved for its length, then its
 * payload; where the length needs more bytes, the payload is moved up (rare: a field of
 * 128 bytes or more).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} Buf;

static PyObject *any_value_py; /* otlp_wire.any_value: the rare types */

static int grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const void *src, Py_ssize_t n) {
    if (grow(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static int put_byte(Buf *b, unsigned char c) {
    if (grow(b, 1) < 0)
        return -1;
    b->p[b->len++] = c;
    return 0;
}

static int varint_size(uint64_t n) {
    int k = 1;
    while (n > 0x7F) {
        n >>= 7;
        k++;
    }
    return k;
}

static void varint_at(unsigned char *p, uint64_t n) {
    while (n > 0x7F) {
        *p++ = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *p = (unsigned char)n;
}

static int put_varint(Buf *b, uint64_t n) {
    int k = varint_size(n);
    if (grow(b, k) < 0)
        return -1;
    varint_at(b->p + b->len, n);
    b->len += k;
    return 0;
}

/* A length-delimited field's length: reserved before its payload, set after it. */
static Py_ssize_t begin_len(Buf *b) {
    if (put_byte(b, 0) < 0)
        return -1;
    return b->len;
}

static int end_len(Buf *b, Py_ssize_t start) {
    uint64_t n = (uint64_t)(b->len - start);
    int k = varint_size(n);
    if (k > 1) {
        if (grow(b, k - 1) < 0)
            return -1;
        memmove(b->p + start + k - 1, b->p + start, (size_t)n);
        b->len += k - 1;
    }
    varint_at(b->p + start - 1, n);
    return 0;
}

static int any_value(Buf *b, PyObject *v);

static int fallback(Buf *b, PyObject *v) {
    PyObject *r = PyObject_CallOneArg(any_value_py, v);
    if (r == NULL)
        return -1;
    if (!PyBytes_Check(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "any_value did not return bytes");
        return -1;
    }
    int rc = put(b, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r));
    Py_DECREF(r);
    return rc;
}

/* An AnyValue message's payload: string 1, bool 2, int 3, double 4, array 5. */
static int any_value(Buf *b, PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL)
            return -1;
        if (put_byte(b, 0x0a) < 0 || put_varint(b, (uint64_t)n) < 0)
            return -1;
        return put(b, s, n);
    }
    if (t == &PyBool_Type) {
        if (put_byte(b, 0x10) < 0)
            return -1;
        return put_byte(b, v == Py_True ? 1 : 0);
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return fallback(b, v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (put_byte(b, 0x18) < 0)
            return -1;
        return put_varint(b, (uint64_t)x); /* a negative int64: its two's complement */
    }
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        unsigned char le[8];
        if (PyFloat_Pack8(d, (char *)le, 1) < 0) /* little endian */
            return -1;
        if (put_byte(b, 0x21) < 0)
            return -1;
        return put(b, le, 8);
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        PyObject *seq = v;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (put_byte(b, 0x2a) < 0) /* array_value 5: ArrayValue */
            return -1;
        Py_ssize_t arr = begin_len(b);
        if (arr < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i >= PySequence_Fast_GET_SIZE(seq)) /* (shortened by a fallback's code) */
                break;
            PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
            if (put_byte(b, 0x0a) < 0) /* ArrayValue.values 1 */
                return -1;
            Py_ssize_t item = begin_len(b);
            Py_INCREF(x);
            int rc = (item < 0 || any_value(b, x) < 0 || end_len(b, item) < 0) ? -1 : 0;
            Py_DECREF(x);
            if (rc < 0)
                return -1;
        }
        return end_len(b, arr);
    }
    return fallback(b, v);
}

/* One KeyValue field ``tag``: key (absent when empty: proto3), then value. */
static int key_value(Buf *b, unsigned char tag, PyObject *key, PyObject *value) {
    Py_ssize_t klen;
    const char *k;
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "an attribute name that is not a str");
        return -1;
    }
    k = PyUnicode_AsUTF8AndSize(key, &klen);
    if (k == NULL || put_byte(b, tag) < 0)
        return -1;
    Py_ssize_t kv = begin_len(b);
    if (kv < 0)
        return -1;
    if (klen && (put_byte(b, 0x0a) < 0 || put_varint(b, (uint64_t)klen) < 0 || put(b, k, klen) < 0))
        return -1;
    if (put_byte(b, 0x12) < 0) /* KeyValue.value 2 */
        return -1;
    Py_ssize_t av = begin_len(b);
    Py_INCREF(value); /* a fallback may run Python code that changes the container */
    int rc = (av < 0 || any_value(b, value) < 0 || end_len(b, av) < 0) ? -1 : 0;
    Py_DECREF(value);
    if (rc < 0)
        return -1;
    return end_len(b, kv);
}

/* The call's field tag (one byte), once configure() has been called. */
static int one_byte_tag(PyObject *o, unsigned char *tag) {
    if (any_value_py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return -1;
    }
    long t = PyLong_Check(o) ? PyLong_AsLong(o) : -1;
    if (t < 0 || t > 0x7F) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a one-byte tag");
        return -1;
    }
    *tag = (unsigned char)t;
    return 0;
}

static PyObject *done(Buf *b) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)b->p, b->len);
    PyMem_Free(b->p);
    return out;
}

/* attributes(tag, attrs): the dict's items as the repeated KeyValue field ``tag``. */
static PyObject *attributes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned char tag;
    if (nargs != 2 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "attributes(tag: int, attrs: dict)");
        return NULL;
    }
    if (one_byte_tag(args[0], &tag) < 0)
        return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(args[1], &pos, &key, &value))
        if (key_value(&b, tag, key, value) < 0) {
            PyMem_Free(b.p);
            return NULL;
        }
    return done(&b);
}

/* The record's value of the field an entry of ``values`` or ``flags`` names (a tuple of
 * ``size``, the field first): 1 (``*v`` borrowed), 0 where the record has no such field,
 * -1 on an error. */
static int field_of(PyObject *rec, PyObject *entry, Py_ssize_t size, PyObject **v) {
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != size) {
        PyErr_SetString(PyExc_TypeError, size == 3 ? "values: (field, name, is_array) tuples"
                                                   : "flags: (field, name) tuples");
        return -1;
    }
    *v = PyDict_GetItemWithError(rec, PyTuple_GET_ITEM(entry, 0));
    if (*v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return 1;
}

/* record_attributes(tag, rec, values, flags): a record's span attributes, as
 * agent.records.span_attributes picks them, without the dict between. ``values``: (field,
 * name, is_array) — the field's value, unless None or an empty array; ``flags``: (field,
 * name) — True where the field is true, else nothing. */
static PyObject *record_attributes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned char tag;
    if (nargs != 4 || !PyDict_Check(args[1]) || !PyTuple_CheckExact(args[2]) ||
        !PyTuple_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "record_attributes(tag: int, rec: dict, values: tuple, flags: tuple)");
        return NULL;
    }
    if (one_byte_tag(args[0], &tag) < 0)
        return NULL;
    PyObject *rec = args[1];
    Buf b = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[2]); i++) {
        PyObject *e = PyTuple_GET_ITEM(args[2], i), *v;
        int found = field_of(rec, e, 3, &v);
        if (found < 0)
            goto fail;
        if (!found || v == Py_None)
            continue;
        if (PyTuple_GET_ITEM(e, 2) == Py_True) {
            int truth = PyObject_IsTrue(v);
            if (truth < 0)
                goto fail;
            if (!truth)
                continue;
        }
        if (key_value(&b, tag, PyTuple_GET_ITEM(e, 1), v) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[3]); i++) {
        PyObject *e = PyTuple_GET_ITEM(args[3], i), *v;
        int found = field_of(rec, e, 2, &v);
        if (found < 0)
            goto fail;
        if (!found)
            continue;
        Py_INCREF(v);
        int truth = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (truth < 0)
            goto fail;
        if (truth && key_value(&b, tag, PyTuple_GET_ITEM(e, 1), Py_True) < 0)
            goto fail;
    }
    return done(&b);
fail:
    PyMem_Free(b.p);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *fn) {
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "configure(any_value: callable)");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(any_value_py, fn);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL,
     "attributes(tag, attrs) -> bytes: the repeated KeyValue field tag of attrs"},
    {"record_attributes", (PyCFunction)(void (*)(void))record_attributes, METH_FASTCALL,
     "record_attributes(tag, rec, values, flags) -> bytes: a record's span attributes"},
    {"configure", configure, METH_O, "configure(any_value): the Python encoder of rare values"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp_wire_fast", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__otlp_wire_fast(void) { return PyModule_Create(&module); }
