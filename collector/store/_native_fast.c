/* Compiled ClickHouse Native-format encoder for the store's inserts (collector/store/native.py).
 *
 * Why: clickhouse-connect encodes an insert column by column in per-value Python loops
 * (Array offsets, String lengths, LowCardinality dictionaries, Nullable maps): ~22 % of the
 * collector's GIL time at saturation. This writes the same bytes from the row tuples (or the
 * columns) in one pass per column, without a Python object per value.
 *
 * Contract: encode() returns one Native block byte-identical to what clickhouse-connect's
 * NativeTransform.build_insert writes for the same data and column types (without the INSERT
 * statement it puts in front), or None ("give up") for any value this encoder does not model
 * exactly: a type other than the expected one (bool for an int, bytes for a str, a float in
 * an int column…), an int out of its column's range, a str that is not valid UTF-8 (lone
 * surrogates), a row of the wrong length. The caller then inserts through clickhouse-connect,
 * which stays the reference and raises its own errors for bad data (the writer's bisection
 * depends on them). Every doubt is answered by giving up, never by guessing.
 *
 * No Python code runs while encoding: values are checked with exact-type tests (no
 * subclasses, so no user __hash__/__eq__/__index__), the LowCardinality dictionary is a C
 * hash table, and no GC-tracked object is allocated (so no collection, no finaliser) — which
 * is what makes the borrowed references below safe.
 *
 * Native layout (as clickhouse-connect writes it): LEB128 column count, LEB128 row count,
 * then per column: LEB128 name length, name, LEB128 type length, type, the type's prefix
 * (the LowCardinality serialization version, UInt64 1, also inside Array and Map), the data.
 * All integers little-endian.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GIVE_UP 1 /* a value this encoder does not model: the caller uses the reference path */
#define FAIL (-1) /* a Python exception is set (MemoryError) */

/* Type codes: collector/store/native.py builds them from schema.py's column types. */
enum {
    K_I64 = 1, /* Int64 and DateTime64(p, 'UTC') (ticks) */
    K_U8 = 2,
    K_U16 = 3,
    K_U32 = 4,
    K_U64 = 5,
    K_BOOL = 6,
    K_F64 = 7,
    K_STR = 8,
    K_LC = 9,  /* LowCardinality(String) */
    K_MAP = 10 /* Map(LowCardinality(String), String) */
};
#define K_BASE 0x0f
#define F_NULLABLE 0x10 /* Nullable(I64|U16|U32|U64|F64) */
#define F_ARRAY 0x20    /* Array(I64|F64|STR|LC) */

/* --- output buffer: every growth checked -------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t n) {
    if (n <= b->cap - b->len)
        return 0;
    if (n > (size_t)PY_SSIZE_T_MAX - b->len) { /* also keeps the final bytes object legal */
        PyErr_NoMemory();
        return FAIL;
    }
    size_t need = b->len + n, cap = b->cap ? b->cap : 4096;
    while (cap < need)
        cap = cap > (size_t)PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n))
        return FAIL;
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* Little-endian whatever the host: the shifts compile to plain stores on x86/ARM. */
static int put_le(Buf *b, uint64_t v, int width) {
    if (buf_reserve(b, (size_t)width))
        return FAIL;
    for (int i = 0; i < width; i++)
        b->p[b->len++] = (char)(uint8_t)(v >> (8 * i));
    return 0;
}

static int put_leb128(Buf *b, uint64_t v) {
    if (buf_reserve(b, 10))
        return FAIL;
    do {
        uint8_t c = v & 0x7f;
        v >>= 7;
        b->p[b->len++] = (char)(v ? (c | 0x80) : c);
    } while (v);
    return 0;
}

/* --- a growable vector of borrowed references (flattened arrays, map keys/values) ----- */

typedef struct {
    PyObject **v;
    size_t n, cap;
} Vec;

static int vec_push(Vec *x, PyObject *o) {
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 256;
        if (cap > (size_t)PY_SSIZE_T_MAX / sizeof(PyObject *)) {
            PyErr_NoMemory();
            return FAIL;
        }
        PyObject **v = PyMem_Realloc(x->v, cap * sizeof(PyObject *));
        if (v == NULL) {
            PyErr_NoMemory();
            return FAIL;
        }
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = o;
    return 0;
}

/* --- scalars ------------------------------------------------------------------------ */

/* An exact int within [lo, hi] (signed columns) — bool is an int subclass: refused. */
static int int_value(PyObject *o, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(o))
        return GIVE_UP;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return GIVE_UP;
    }
    if (v < lo || v > hi)
        return GIVE_UP;
    *out = v;
    return 0;
}

/* One fixed-width value (None already replaced by the caller where Nullable). */
static int put_scalar(Buf *b, int kind, PyObject *o) {
    long long v;
    switch (kind) {
    case K_I64:
        if (int_value(o, LLONG_MIN, LLONG_MAX, &v))
            return GIVE_UP;
        return put_le(b, (uint64_t)v, 8);
    case K_U8:
        if (int_value(o, 0, 0xff, &v))
            return GIVE_UP;
        return put_le(b, (uint64_t)v, 1);
    case K_U16:
        if (int_value(o, 0, 0xffff, &v))
            return GIVE_UP;
        return put_le(b, (uint64_t)v, 2);
    case K_U32:
        if (int_value(o, 0, 0xffffffffLL, &v))
            return GIVE_UP;
        return put_le(b, (uint64_t)v, 4);
    case K_U64: {
        if (!PyLong_CheckExact(o))
            return GIVE_UP;
        unsigned long long u = PyLong_AsUnsignedLongLong(o); /* negative or too big: error */
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return GIVE_UP;
        }
        return put_le(b, (uint64_t)u, 8);
    }
    case K_BOOL:
        if (o == Py_True)
            return put_le(b, 1, 1);
        if (o == Py_False)
            return put_le(b, 0, 1);
        return GIVE_UP;
    case K_F64: {
        double d;
        if (PyFloat_CheckExact(o)) {
            d = PyFloat_AS_DOUBLE(o);
        } else if (PyLong_CheckExact(o)) { /* the driver packs an int as its float() */
            d = PyLong_AsDouble(o);
            if (d == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return GIVE_UP;
            }
        } else {
            return GIVE_UP;
        }
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_le(b, bits, 8);
    }
    default:
        return GIVE_UP;
    }
}

/* A str's UTF-8 (cached in the str by CPython; ASCII strs are their own UTF-8). */
static int utf8_of(PyObject *o, const char **s, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(o))
        return GIVE_UP;
    *s = PyUnicode_AsUTF8AndSize(o, n);
    if (*s == NULL) { /* lone surrogates: the driver raises its own error */
        PyErr_Clear();
        return GIVE_UP;
    }
    return 0;
}

static int put_str(Buf *b, PyObject *o) {
    const char *s;
    Py_ssize_t n;
    int r = utf8_of(o, &s, &n);
    if (r)
        return r;
    if (put_leb128(b, (uint64_t)n))
        return FAIL;
    return put(b, s, (size_t)n);
}

/* --- LowCardinality(String): dictionary in first-seen order, then the keys ------------ */

typedef struct {
    const char *s;
    Py_ssize_t n;
    Py_hash_t h;
} Key;

/* As the driver does: keys of 1 << (int(log(len(index), 2)) >> 3) bytes. The same libm
 * log as math.log(x, 2) = log(x) / log(2), so the width matches at every size. */
static int lc_width_code(size_t n_unique) {
    return (int)(log((double)n_unique) / log(2.0)) >> 3;
}

static int put_lc(Buf *b, PyObject **vals, size_t n) {
    if (n == 0) /* the driver writes nothing, not even the header, for no values */
        return 0;
    if (n > UINT32_MAX / 4) /* keys are uint32 below; a batch this large: the driver's */
        return GIVE_UP;
    int rc = FAIL;
    size_t slots = 16;
    while (slots < 2 * n) /* load ≤ 1/2 even if every value is distinct: never grows */
        slots *= 2;
    Key *uniq = PyMem_Malloc(n * sizeof(Key));
    uint32_t *table = PyMem_Calloc(slots, sizeof(uint32_t)); /* 1 + index into uniq; 0 empty */
    uint32_t *keys = PyMem_Malloc(n * sizeof(uint32_t));
    if (uniq == NULL || table == NULL || keys == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t n_unique = 0;
    for (size_t i = 0; i < n; i++) {
        Key k;
        int r = utf8_of(vals[i], &k.s, &k.n);
        if (r) {
            rc = r;
            goto done;
        }
        k.h = PyObject_Hash(vals[i]); /* an exact str: cached, cannot fail */
        size_t j = (size_t)k.h & (slots - 1);
        for (;;) {
            uint32_t t = table[j];
            if (t == 0) {
                uniq[n_unique] = k;
                table[j] = (uint32_t)(++n_unique);
                keys[i] = (uint32_t)(n_unique - 1);
                break;
            }
            Key *u = &uniq[t - 1];
            if (u->h == k.h && u->n == k.n && memcmp(u->s, k.s, (size_t)k.n) == 0) {
                keys[i] = t - 1;
                break;
            }
            j = (j + 1) & (slots - 1);
        }
    }
    int wc = lc_width_code(n_unique);
    /* index type | HasAdditionalKeys (bit 9) | NeedUpdateDictionary (bit 10) */
    if (put_le(b, (1u << 9) | (1u << 10) | (unsigned)wc, 8) || put_le(b, n_unique, 8))
        goto done;
    for (size_t i = 0; i < n_unique; i++)
        if (put_leb128(b, (uint64_t)uniq[i].n) || put(b, uniq[i].s, (size_t)uniq[i].n))
            goto done;
    if (put_le(b, n, 8))
        goto done;
    for (size_t i = 0; i < n; i++)
        if (put_le(b, keys[i], 1 << wc))
            goto done;
    rc = 0;
done:
    PyMem_Free(uniq);
    PyMem_Free(table);
    PyMem_Free(keys);
    return rc;
}

/* --- columns ------------------------------------------------------------------------ */

/* A non-container column of `kind` (Nullable: the null map first, then 0 for each None). */
static int put_plain(Buf *b, int kind, int nullable, PyObject **vals, size_t n) {
    if (kind == K_LC)
        return nullable ? GIVE_UP : put_lc(b, vals, n);
    if (nullable) {
        if (kind == K_STR || kind == K_BOOL)
            return GIVE_UP; /* not in the schema, not modelled */
        if (buf_reserve(b, n))
            return FAIL;
        for (size_t i = 0; i < n; i++)
            b->p[b->len++] = vals[i] == Py_None ? 1 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        int r;
        if (nullable && vals[i] == Py_None)
            r = put_le(b, 0, kind == K_U8 ? 1 : kind == K_U16 ? 2 : kind == K_U32 ? 4 : 8);
        else if (kind == K_STR)
            r = put_str(b, vals[i]);
        else
            r = put_scalar(b, kind, vals[i]);
        if (r)
            return r;
    }
    return 0;
}

/* Array(T): the cumulative end offsets (UInt64), then every element as one column of T. */
static int put_array(Buf *b, int kind, PyObject **vals, size_t n, Vec *flat) {
    flat->n = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *a = vals[i];
        if (!PyList_CheckExact(a) && !PyTuple_CheckExact(a))
            return GIVE_UP;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(a);
        PyObject **items = PySequence_Fast_ITEMS(a);
        for (Py_ssize_t k = 0; k < m; k++)
            if (vec_push(flat, items[k]))
                return FAIL;
        total += (uint64_t)m;
        if (put_le(b, total, 8))
            return FAIL;
    }
    return put_plain(b, kind, 0, flat->v, flat->n);
}

/* Map(LowCardinality(String), String): end offsets, then the keys, then the values. */
static int put_map(Buf *b, PyObject **vals, size_t n, Vec *ks, Vec *vs) {
    ks->n = vs->n = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *d = vals[i], *k, *v;
        if (!PyDict_CheckExact(d))
            return GIVE_UP;
        Py_ssize_t pos = 0;
        while (PyDict_Next(d, &pos, &k, &v)) /* insertion order, as the driver's items() */
            if (vec_push(ks, k) || vec_push(vs, v))
                return FAIL;
        total += (uint64_t)PyDict_GET_SIZE(d);
        if (put_le(b, total, 8))
            return FAIL;
    }
    int r = put_lc(b, ks->v, ks->n);
    return r ? r : put_plain(b, K_STR, 0, vs->v, vs->n);
}

static int put_column(Buf *b, int code, PyObject **vals, size_t n, Vec *v1, Vec *v2) {
    int kind = code & K_BASE;
    /* the LowCardinality version prefix, before any data, also inside Array and Map */
    if ((kind == K_LC || kind == K_MAP) && put_le(b, 1, 8))
        return FAIL;
    if (kind == K_MAP)
        return (code & ~K_BASE) ? GIVE_UP : put_map(b, vals, n, v1, v2);
    if (code & F_ARRAY)
        return (code & F_NULLABLE) ? GIVE_UP : put_array(b, kind, vals, n, v1);
    return put_plain(b, kind, (code & F_NULLABLE) != 0, vals, n);
}

/* --- entry point -------------------------------------------------------------------- */

PyDoc_STRVAR(encode_doc,
             "encode(data, by_rows, plan) -> bytes | None\n\n"
             "One Native block of `data` (a list of row tuples if by_rows, else a list of\n"
             "columns), columns as `plan`: a tuple of (header, code) — header the column's\n"
             "LEB128 name length, name, LEB128 type length, type. None: give up (a value\n"
             "not modelled); the caller encodes with clickhouse-connect instead.");

static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *plan;
    int by_rows;
    if (!PyArg_ParseTuple(args, "O!pO!", &PyList_Type, &data, &by_rows, &PyTuple_Type, &plan))
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(plan);
    for (Py_ssize_t j = 0; j < ncols; j++) {
        PyObject *c = PyTuple_GET_ITEM(plan, j);
        if (!PyTuple_CheckExact(c) || PyTuple_GET_SIZE(c) != 2 ||
            !PyBytes_CheckExact(PyTuple_GET_ITEM(c, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(c, 1))) {
            PyErr_SetString(PyExc_TypeError, "plan: a tuple of (bytes, int)");
            return NULL;
        }
    }
    /* The shape: every row a tuple/list of ncols values, or ncols columns of one length. */
    Py_ssize_t nrows;
    if (by_rows) {
        nrows = PyList_GET_SIZE(data);
        for (Py_ssize_t i = 0; i < nrows; i++) {
            PyObject *r = PyList_GET_ITEM(data, i);
            if ((!PyTuple_Check(r) && !PyList_CheckExact(r)) ||
                PySequence_Fast_GET_SIZE(r) != ncols)
                Py_RETURN_NONE;
        }
    } else {
        if (PyList_GET_SIZE(data) != ncols)
            Py_RETURN_NONE;
        nrows = -1;
        for (Py_ssize_t j = 0; j < ncols; j++) {
            PyObject *c = PyList_GET_ITEM(data, j);
            if (!PyTuple_CheckExact(c) && !PyList_CheckExact(c))
                Py_RETURN_NONE;
            Py_ssize_t m = PySequence_Fast_GET_SIZE(c);
            if (nrows >= 0 && m != nrows)
                Py_RETURN_NONE;
            nrows = m;
        }
        if (nrows < 0)
            nrows = 0;
    }
    if (nrows == 0 || ncols == 0) /* the driver writes no block at all */
        return PyBytes_FromStringAndSize("", 0);

    Buf b = {NULL, 0, 0};
    Vec v1 = {NULL, 0, 0}, v2 = {NULL, 0, 0};
    PyObject *out = NULL;
    int rc = FAIL;
    PyObject **vals = PyMem_Malloc((size_t)nrows * sizeof(PyObject *));
    if (vals == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (put_leb128(&b, (uint64_t)ncols) || put_leb128(&b, (uint64_t)nrows))
        goto done;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        PyObject *c = PyTuple_GET_ITEM(plan, j);
        PyObject *head = PyTuple_GET_ITEM(c, 0);
        long code = PyLong_AsLong(PyTuple_GET_ITEM(c, 1));
        if (code == -1 && PyErr_Occurred())
            goto done;
        if (put(&b, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head)))
            goto done;
        /* the column's values as one array of borrowed references */
        if (by_rows) {
            for (Py_ssize_t i = 0; i < nrows; i++)
                vals[i] = PySequence_Fast_ITEMS(PyList_GET_ITEM(data, i))[j];
        } else {
            memcpy(vals, PySequence_Fast_ITEMS(PyList_GET_ITEM(data, j)),
                   (size_t)nrows * sizeof(PyObject *));
        }
        int r = put_column(&b, (int)code, vals, (size_t)nrows, &v1, &v2);
        if (r) {
            rc = r;
            goto done;
        }
    }
    rc = 0;
    out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
done:
    PyMem_Free(vals);
    PyMem_Free(v1.v);
    PyMem_Free(v2.v);
    PyMem_Free(b.p);
    if (rc == GIVE_UP)
        Py_RETURN_NONE;
    return out; /* NULL with the exception set when rc == FAIL */
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native_fast", "Native-format encoder (collector/store/native.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native_fast(void) { return PyModule_Create(&module); }
