/*
 * analytics.ingest._copyfmt — a batch of interaction events as COPY binary rows, in C.
 *
 * The consumer's GIL is the ingest pipeline's bottleneck (bench/ingest/README.md): in
 * Python each event cost ~5 µs to render (the row tuple, the timestamp text, the tags'
 * JSON, psycopg's per-value dumpers, the rollup input row). ``render`` writes the rows in
 * one pass over the batch:
 *
 *   render(events, flags, declared, always) -> (interactions_rows, fold_rows)
 *
 * ``events``: a list of ``contracts.events.InteractionEvent``; ``flags``: one byte per
 * event, 0 = not folded into the rollups, 1 = folded (conv = false), 2 = folded and opens
 * a conversation (conv = true). ``declared``: experiment id -> the set of tag keys folded
 * into its segments, ``always`` the set for an experiment not in it (``rollout_stage``).
 *
 * The rows are in PostgreSQL's COPY binary format (tuples only: the caller writes the
 * signature and the trailer): ``interactions_rows`` those of the columns
 * ``analytics.ingest.copy_text.INTERACTION_COLUMNS`` (uuid, timestamptz, int4, float8,
 * bool, jsonb, text), ``fold_rows`` the ``lg_fold`` rows (``rollups.FOLD_COLUMNS``) of
 * the flagged events. The binary form spares the server the text input functions (the
 * timestamp's and the floats' parsing, the uuid's) and the renderer the float repr and the
 * escaping. The values stored are those of the Python loop's COPY text
 * (``copy_text.python_rows``), tests/analytics/ingest/test_copyfmt.py checks it on the
 * database. Anything outside the common case — an int beyond int4, a non-finite float, a
 * NUL or an unpaired surrogate in a string, a timestamp outside years 1–9999, an event id
 * not in the 8-4-4-4-12 or 32-digit hex form, a folded tag containing the segment separator
 * U+001F, a value of another type — raises ValueError: the caller then stores the batch
 * by the SQL path, which decides as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 65536;
    while (cap < b->n + extra) cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

static inline int putc_(Buf *b, char c) {
    if (buf_grow(b, 1) < 0) return -1;
    b->p[b->n++] = c;
    return 0;
}

static int unsupported(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

/* UTF-8 of a str (None is the caller's business); NUL or surrogates refused. */
static const char *utf8_of(PyObject *o, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(o)) {
        unsupported("not a str");
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8AndSize(o, n);
    if (!s) {
        PyErr_Clear();
        unsupported("unencodable str");
        return NULL;
    }
    if (memchr(s, 0, (size_t)*n)) {
        unsupported("NUL in a str");
        return NULL;
    }
    return s;
}

/* Big-endian integers. */
static inline void be16(char *p, uint16_t v) {
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
}
static inline void be32(char *p, uint32_t v) {
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}
static inline void be64(char *p, uint64_t v) {
    be32(p, (uint32_t)(v >> 32));
    be32(p + 4, (uint32_t)v);
}

/* A field's length word (-1: NULL). */
static inline int put_len(Buf *b, int32_t n) {
    if (buf_grow(b, 4) < 0) return -1;
    be32(b->p + b->n, (uint32_t)n);
    b->n += 4;
    return 0;
}

static inline int put_null(Buf *b) { return put_len(b, -1); }

static int put_field(Buf *b, const char *s, Py_ssize_t n) {
    if (n > INT32_MAX - 1) return unsupported("value too large");
    if (put_len(b, (int32_t)n) < 0) return -1;
    return put(b, s, n);
}

/* Fixed-width fields: the length word, then the value's 4 or 8 bytes. */
static int put_u32_field(Buf *b, uint32_t v) {
    if (buf_grow(b, 8) < 0) return -1;
    be32(b->p + b->n, 4);
    be32(b->p + b->n + 4, v);
    b->n += 8;
    return 0;
}

static int put_u64_field(Buf *b, uint64_t v) {
    if (buf_grow(b, 12) < 0) return -1;
    be32(b->p + b->n, 8);
    be64(b->p + b->n + 4, v);
    b->n += 12;
    return 0;
}

/* A float, or an int correctly rounded (as float8in of its digits), as a double; else
 * ValueError naming ``what``. */
static int as_double(PyObject *o, double *d, const char *what) {
    if (PyFloat_CheckExact(o)) {
        *d = PyFloat_AS_DOUBLE(o);
        return 0;
    }
    if (PyLong_CheckExact(o)) {
        *d = PyLong_AsDouble(o);
        if (*d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return unsupported(what);
        }
        return 0;
    }
    return unsupported(what);
}

static int put_str(Buf *b, PyObject *o) {
    if (o == Py_None) return put_null(b);
    Py_ssize_t n;
    const char *s = utf8_of(o, &n);
    if (!s) return -1;
    return put_field(b, s, n);
}

/* int4 (every int column of both tables). */
static int put_int(Buf *b, PyObject *o) {
    if (o == Py_None) return put_null(b);
    if (!PyLong_CheckExact(o)) return unsupported("not an int");
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v < INT32_MIN || v > INT32_MAX) return unsupported("int beyond int4");
    if (v == -1 && PyErr_Occurred()) return -1;
    return put_u32_field(b, (uint32_t)(int32_t)v);
}

/* float8: the value psycopg's text (an int's digits or a float's repr) parses to. */
static int put_float(Buf *b, PyObject *o) {
    if (o == Py_None) return put_null(b);
    double d;
    if (as_double(o, &d, "not a float8") < 0) return -1;
    if (!isfinite(d)) return unsupported("non-finite float");
    uint64_t bits;
    memcpy(&bits, &d, 8);
    return put_u64_field(b, bits);
}

static int put_bool(Buf *b, PyObject *o) {
    if (o != Py_True && o != Py_False) return unsupported("not a bool");
    if (buf_grow(b, 5) < 0) return -1;
    be32(b->p + b->n, 1);
    b->p[b->n + 4] = o == Py_True ? 1 : 0;
    b->n += 5;
    return 0;
}

#define PG_EPOCH_S 946684800.0 /* 2000-01-01 in Unix time */
/* Microseconds from 2000-01-01 to 0001-01-01 00:00:00 and to 10000-01-01 00:00:00. */
#define US_YEAR_1 (-63082281600000000LL)
#define US_YEAR_10000 (252455616000000000LL)

/* timestamptz: microseconds since 2000-01-01, the instant of PostgreSQL's to_timestamp(t)
 * (as analytics.ingest.copy_text.ts_text), years 1-9999 only. */
static int put_ts(Buf *b, PyObject *o) {
    double t;
    if (as_double(o, &t, "ts not a number in range") < 0) return -1;
    double us = rint((t - PG_EPOCH_S) * 1e6); /* round half to even, as Python's round() */
    if (!(us >= (double)US_YEAR_1 && us < (double)US_YEAR_10000)) return unsupported("ts outside years 1-9999");
    return put_u64_field(b, (uint64_t)(int64_t)us);
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* uuid: 16 bytes from "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" or 32 hex digits (the forms
 * the gateway and new_event_id write; uuid_in's other spellings go to the SQL path). */
static int put_uuid(Buf *b, PyObject *o) {
    if (o == Py_None) return put_null(b);
    Py_ssize_t n;
    const char *s = utf8_of(o, &n);
    if (!s) return -1;
    int dashed = n == 36;
    if (!dashed && n != 32) return unsupported("event id not a uuid");
    if (buf_grow(b, 20) < 0) return -1;
    char *out = b->p + b->n;
    be32(out, 16);
    const unsigned char *p = (const unsigned char *)s;
    for (int i = 0; i < 16; i++) {
        if (dashed && (i == 4 || i == 6 || i == 8 || i == 10)) {
            if (*p != '-') return unsupported("event id not a uuid");
            p++;
        }
        int hi = hexval(p[0]), lo = hexval(p[1]);
        if (hi < 0 || lo < 0) return unsupported("event id not a uuid");
        out[4 + i] = (char)(hi << 4 | lo);
        p += 2;
    }
    b->n += 20;
    return 0;
}

/* A JSON string as orjson writes it (short escapes for \b \t \n \f \r " \\, \u00xx for
 * other control characters, the rest verbatim). */
static int put_json_string(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, 6 * n + 2) < 0) return -1;
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\b': *o++ = 'b'; break;
            case '\t': *o++ = 't'; break;
            case '\n': *o++ = 'n'; break;
            case '\f': *o++ = 'f'; break;
            case '\r': *o++ = 'r'; break;
            default: {
                static const char hex[] = "0123456789abcdef";
                *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
        }
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

/* tags (dict[str, str]) -> a jsonb field (version 1, then the JSON text) into ``b``, and
 * the segments of those whose key is in ``keys`` ("k=v" joined by U+001F) into ``seg``
 * (left empty when none); ``keys`` NULL: no segments (the event is not folded). */
static int put_tags(Buf *b, Buf *seg, PyObject *tags, PyObject *keys) {
    if (!PyDict_CheckExact(tags)) return unsupported("tags not a dict");
    if (put_len(b, 0) < 0) return -1; /* the length, filled in below */
    Py_ssize_t at = b->n;
    if (putc_(b, 1) < 0 || putc_(b, '{') < 0) return -1;
    Py_ssize_t pos = 0, i = 0, folded = 0;
    PyObject *k, *v;
    while (PyDict_Next(tags, &pos, &k, &v)) {
        Py_ssize_t kn, vn;
        const char *ks = utf8_of(k, &kn);
        if (!ks) return -1;
        const char *vs = utf8_of(v, &vn);
        if (!vs) return -1;
        if (i && putc_(b, ',') < 0) return -1;
        if (put_json_string(b, ks, kn) < 0 || putc_(b, ':') < 0 || put_json_string(b, vs, vn) < 0) return -1;
        i++;
        if (keys == NULL) continue;
        int declared = PySet_Contains(keys, k);
        if (declared < 0) return -1;
        if (!declared) continue;
        if (memchr(ks, 0x1f, (size_t)kn) || memchr(vs, 0x1f, (size_t)vn))
            return unsupported("a tag contains the segment separator U+001F");
        if (folded && putc_(seg, 0x1f) < 0) return -1;
        if (put(seg, ks, kn) < 0 || putc_(seg, '=') < 0 || put(seg, vs, vn) < 0) return -1;
        folded++;
    }
    if (putc_(b, '}') < 0) return -1;
    if (b->n - at > INT32_MAX - 1) return unsupported("tags too large");
    be32(b->p + at - 4, (uint32_t)(b->n - at));
    return 0;
}

/* The event's attributes, in the order of the interactions table's COPY columns. */
enum {
    A_EVENT_ID, A_TS, A_REQUEST_ID, A_ROUTE, A_EXPERIMENT_ID, A_VARIANT, A_UNIT_ID, A_UNIT_SOURCE, A_ROLE,
    A_PAIR_ID, A_MODE, A_ENDPOINT, A_MODEL, A_UPSTREAM, A_STATUS, A_HTTP_STATUS, A_ERROR_TYPE, A_LATENCY_MS,
    A_TTFT_MS, A_PROMPT_TOKENS, A_COMPLETION_TOKENS, A_RESPONSE_CHARS, A_FINISH_REASON, A_STREAM, A_FALLBACK,
    A_FALLBACK_FROM, A_CONVERSATION_ID, A_TAGS, A_PROMPT, A_RESPONSE, A_CATEGORY, N_ATTRS
};
static const char *attr_names[N_ATTRS] = {
    "event_id", "ts", "request_id", "route", "experiment_id", "variant", "unit_id", "unit_source", "role",
    "pair_id", "mode", "endpoint", "model", "upstream", "status", "http_status", "error_type", "latency_ms",
    "ttft_ms", "prompt_tokens", "completion_tokens", "response_chars", "finish_reason", "stream", "fallback",
    "fallback_from", "conversation_id", "tags", "prompt", "response", "category"};
static PyObject *attr_str[N_ATTRS];

typedef enum { K_STR, K_INT, K_FLOAT, K_BOOL, K_TS, K_TAGS, K_UUID } Kind;
static const Kind kinds[N_ATTRS] = {
    K_UUID, K_TS, K_STR, K_STR, K_INT, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR,
    K_INT, K_STR, K_FLOAT, K_FLOAT, K_INT, K_INT, K_INT, K_STR, K_BOOL, K_BOOL, K_STR, K_STR, K_TAGS, K_STR,
    K_STR, K_STR};

/* lg_fold's columns (rollups.FOLD_COLUMNS): experiment_id, variant, unit_id, ts, status,
 * fallback, latency_ms, ttft_ms, prompt_tokens, completion_tokens, response_chars (the
 * interaction's values), segments, conv, category (the interaction's). */
static const int shared[] = {A_EXPERIMENT_ID, A_VARIANT,       A_UNIT_ID,           A_TS,
                             A_STATUS,        A_FALLBACK,      A_LATENCY_MS,        A_TTFT_MS,
                             A_PROMPT_TOKENS, A_COMPLETION_TOKENS, A_RESPONSE_CHARS};
#define N_SHARED ((int)(sizeof shared / sizeof shared[0]))
#define N_FOLD (N_SHARED + 3)

static int put_count(Buf *b, int n) {
    if (buf_grow(b, 2) < 0) return -1;
    be16(b->p + b->n, (uint16_t)n);
    b->n += 2;
    return 0;
}

static int render_event(Buf *rows, Buf *fold, Buf *seg, PyObject *e, int flag, PyObject *declared,
                        PyObject *always) {
    PyObject *v[N_ATTRS];
    PyObject *keys = NULL; /* borrowed: the tag keys folded into segments (flagged events only) */
    int rc = -1, got = 0;
    for (; got < N_ATTRS; got++) {
        v[got] = PyObject_GetAttr(e, attr_str[got]);
        if (!v[got]) goto done;
    }
    if (flag) {
        keys = PyDict_GetItemWithError(declared, v[A_EXPERIMENT_ID]);
        if (keys == NULL) {
            if (PyErr_Occurred()) goto done;
            keys = always;
        }
        if (!PyAnySet_Check(keys)) {
            PyErr_SetString(PyExc_TypeError, "declared keys must be sets");
            goto done;
        }
    }
    /* Where each field (its length word, then its bytes) starts in ``rows``: the lg_fold row
     * copies the fields it shares with the interactions row. Offsets, not pointers: ``rows``
     * may be reallocated. A failed row leaves a partial tuple behind: the caller drops the
     * whole output on ValueError. */
    Py_ssize_t at[N_ATTRS + 1];
    seg->n = 0;
    if (put_count(rows, N_ATTRS) < 0) goto done;
    for (int i = 0; i < N_ATTRS; i++) {
        at[i] = rows->n;
        int r;
        switch (kinds[i]) {
            case K_STR: r = put_str(rows, v[i]); break;
            case K_INT: r = put_int(rows, v[i]); break;
            case K_FLOAT: r = put_float(rows, v[i]); break;
            case K_BOOL: r = put_bool(rows, v[i]); break;
            case K_TS: r = put_ts(rows, v[i]); break;
            case K_UUID: r = put_uuid(rows, v[i]); break;
            default: r = put_tags(rows, seg, v[i], keys); break;
        }
        if (r < 0) goto done;
    }
    at[N_ATTRS] = rows->n;
    if (flag) {
        if (put_count(fold, N_FOLD) < 0) goto done;
        for (int k = 0; k < N_SHARED; k++) {
            int i = shared[k];
            if (put(fold, rows->p + at[i], at[i + 1] - at[i]) < 0) goto done;
        }
        if ((seg->n ? put_field(fold, seg->p, seg->n) : put_null(fold)) < 0) goto done;
        if (put_bool(fold, flag == 2 ? Py_True : Py_False) < 0) goto done;
        if (put(fold, rows->p + at[A_CATEGORY], at[A_CATEGORY + 1] - at[A_CATEGORY]) < 0) goto done;
    }
    rc = 0;
done:
    for (int i = 0; i < got; i++) Py_DECREF(v[i]);
    return rc;
}

static PyObject *render(PyObject *self, PyObject *args) {
    PyObject *events, *declared, *always;
    Py_buffer flags;
    if (!PyArg_ParseTuple(args, "O!y*O!O", &PyList_Type, &events, &flags, &PyDict_Type, &declared, &always))
        return NULL;
    PyObject *out = NULL;
    Buf rows = {0}, fold = {0}, seg = {0};
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (flags.len != n) {
        PyErr_SetString(PyExc_ValueError, "one flag per event");
        goto done;
    }
    const unsigned char *f = flags.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (f[i] > 2) {
            PyErr_SetString(PyExc_ValueError, "flags are 0, 1 or 2");
            goto done;
        }
        if (render_event(&rows, &fold, &seg, PyList_GET_ITEM(events, i), f[i], declared, always) < 0) goto done;
    }
    out = Py_BuildValue("(y#y#)", rows.p ? rows.p : "", rows.n, fold.p ? fold.p : "", fold.n);
done:
    PyBuffer_Release(&flags);
    PyMem_Free(rows.p);
    PyMem_Free(fold.p);
    PyMem_Free(seg.p);
    return out;
}

static PyMethodDef methods[] = {
    {"render", render, METH_VARARGS,
     "render(events, flags, declared, always) -> (interactions COPY binary tuples, lg_fold COPY binary "
     "tuples); ValueError: a value outside the common case (the SQL path stores the batch)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "analytics.ingest._copyfmt",
                                    "COPY binary rows of interaction events (see analytics.ingest.copy_text).", -1, methods};

PyMODINIT_FUNC PyInit__copyfmt(void) {
    for (int i = 0; i < N_ATTRS; i++) {
        attr_str[i] = PyUnicode_InternFromString(attr_names[i]);
        if (!attr_str[i]) return NULL;
    }
    return PyModule_Create(&module);
}
