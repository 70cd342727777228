/*
 * analytics.ingest._copyfmt — the COPY text of a batch of interaction events, in C.
 *
 * The consumer's GIL is the ingest pipeline's bottleneck (bench/ingest/README.md): in
 * Python each event cost ~5 µs to render (the row tuple, the timestamp text, the tags'
 * JSON, psycopg's per-value dumpers, the rollup input row). ``render`` writes the same
 * bytes in one pass over the batch:
 *
 *   render(events, flags, declared, always) -> (interactions_text, fold_text)
 *
 * ``events``: a list of ``contracts.events.InteractionEvent``; ``flags``: one byte per
 * event, 0 = not folded into the rollups, 1 = folded (conv = false), 2 = folded and opens
 * a conversation (conv = true). ``declared``: experiment id -> the set of tag keys folded
 * into its segments, ``always`` the set for an experiment not in it (``rollout_stage``).
 * ``interactions_text`` is the COPY text of the columns
 * ``analytics.ingest.copy_text.INTERACTION_COLUMNS`` (the bytes psycopg's text formatter writes for
 * ``bulk.interaction_row(e, bulk.ts_text(e.ts))``), ``fold_text`` that of the ``lg_fold``
 * rows of the flagged events. Anything outside the common case — an int beyond 64 bits, a
 * non-finite float, a NUL or an unpaired surrogate in a string, a timestamp outside years
 * 1–9999, a folded tag containing the segment separator U+001F, a value of another type — raises
 * ValueError and the caller renders the batch in Python, which decides as before.
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

/* COPY text escaping, as psycopg's formatter: \\ \b \t \n \v \f \r. */
static int put_escaped(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, 2 * n) < 0) return -1;
    char *o = b->p + b->n;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > '\\' || (c > '\r' && c != '\\')) {
            *o++ = (char)c;
            continue;
        }
        switch (c) {
            case '\\': *o++ = '\\'; *o++ = '\\'; break;
            case '\b': *o++ = '\\'; *o++ = 'b'; break;
            case '\t': *o++ = '\\'; *o++ = 't'; break;
            case '\n': *o++ = '\\'; *o++ = 'n'; break;
            case '\v': *o++ = '\\'; *o++ = 'v'; break;
            case '\f': *o++ = '\\'; *o++ = 'f'; break;
            case '\r': *o++ = '\\'; *o++ = 'r'; break;
            default: *o++ = (char)c;
        }
    }
    b->n = o - b->p;
    return 0;
}

static int put_str(Buf *b, PyObject *o) {
    if (o == Py_None) return put(b, "\\N", 2);
    Py_ssize_t n;
    const char *s = utf8_of(o, &n);
    if (!s) return -1;
    return put_escaped(b, s, n);
}

static int put_int(Buf *b, PyObject *o) {
    if (o == Py_None) return put(b, "\\N", 2);
    if (!PyLong_CheckExact(o)) return unsupported("not an int");
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return unsupported("int beyond 64 bits");
    if (v == -1 && PyErr_Occurred()) return -1;
    char tmp[24], *end = tmp + sizeof tmp, *p = end; /* digits written backwards: no snprintf */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    return put(b, p, end - p);
}

static int put_float(Buf *b, PyObject *o) {
    if (o == Py_None) return put(b, "\\N", 2);
    double d;
    if (PyFloat_CheckExact(o))
        d = PyFloat_AS_DOUBLE(o);
    else if (PyLong_CheckExact(o))
        return put_int(b, o); /* psycopg writes an int as an int */
    else
        return unsupported("not a float");
    if (!isfinite(d)) return unsupported("non-finite float");
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return -1;
    int rc = put(b, s, (Py_ssize_t)strlen(s));
    PyMem_Free(s);
    return rc;
}

static int put_bool(Buf *b, PyObject *o) {
    if (o == Py_True) return putc_(b, 't');
    if (o == Py_False) return putc_(b, 'f');
    return unsupported("not a bool");
}

/* Days since 1970-01-01 -> civil date (H. Hinnant's algorithm). */
static void civil(int64_t z, int64_t *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yy + (*m <= 2);
}

#define PG_EPOCH_S 946684800.0 /* 2000-01-01 in Unix time */

/* ``v`` (0 <= v < 10^width) as exactly ``width`` decimal digits, zero-padded, at ``p``. */
static inline void digits(char *p, int width, int64_t v) {
    for (int i = width - 1; i >= 0; i--) {
        p[i] = (char)('0' + v % 10);
        v /= 10;
    }
}

/* As analytics.ingest.copy_text.ts_text: the instant of PostgreSQL's to_timestamp(t), as text. */
static int put_ts(Buf *b, PyObject *o) {
    double t;
    if (PyFloat_CheckExact(o))
        t = PyFloat_AS_DOUBLE(o);
    else if (PyLong_CheckExact(o)) {
        t = PyLong_AsDouble(o);
        if (t == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return unsupported("ts out of range");
        }
    } else
        return unsupported("ts not a number");
    double us = rint((t - PG_EPOCH_S) * 1e6); /* round half to even, as Python's round() */
    if (!(fabs(us) < 4.0e17)) return unsupported("ts out of range");
    int64_t total = (int64_t)us;
    int64_t sec = total / 1000000, micro = total % 1000000;
    if (micro < 0) {
        micro += 1000000;
        sec -= 1;
    }
    int64_t days = sec / 86400, rem = sec % 86400;
    if (rem < 0) {
        rem += 86400;
        days -= 1;
    }
    int64_t y;
    int m, d;
    civil(days + 10957, &y, &m, &d); /* 10957 days from 1970-01-01 to 2000-01-01 */
    if (y < 1 || y > 9999) return unsupported("ts outside years 1-9999");
    /* "%04d-%02d-%02d %02d:%02d:%02d.%06d+00", written by hand (snprintf costs more than the rest) */
    char tmp[29] = "0000-00-00 00:00:00.000000+00";
    digits(tmp, 4, y);
    digits(tmp + 5, 2, m);
    digits(tmp + 8, 2, d);
    digits(tmp + 11, 2, rem / 3600);
    digits(tmp + 14, 2, rem / 60 % 60);
    digits(tmp + 17, 2, rem % 60);
    digits(tmp + 20, 6, micro);
    return put(b, tmp, sizeof tmp);
}

/* A JSON string as orjson writes it (short escapes for \b \t \n \f \r " \\, \u00xx for
 * other control characters, the rest verbatim), appended COPY-escaped. */
static int put_json_string(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, 12 * n + 4) < 0) return -1;
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        /* a JSON escape's backslash is doubled for COPY */
        *o++ = '\\';
        *o++ = '\\';
        switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; *o++ = '\\'; break;
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

/* tags (dict[str, str]) -> its JSON text into ``b``, and the segments text of those whose
 * key is in ``keys`` ("k=v" joined by U+001F, COPY-escaped, or \N when none) into ``seg``;
 * ``keys`` NULL: no segments text (the event is not folded). */
static int put_tags(Buf *b, Buf *seg, PyObject *tags, PyObject *keys) {
    if (!PyDict_CheckExact(tags)) return unsupported("tags not a dict");
    if (putc_(b, '{') < 0) return -1;
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
        if (put_escaped(seg, ks, kn) < 0 || putc_(seg, '=') < 0 || put_escaped(seg, vs, vn) < 0) return -1;
        folded++;
    }
    if (keys != NULL && !folded && put(seg, "\\N", 2) < 0) return -1;
    return putc_(b, '}');
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

typedef enum { K_STR, K_INT, K_FLOAT, K_BOOL, K_TS, K_TAGS } Kind;
static const Kind kinds[N_ATTRS] = {
    K_STR, K_TS, K_STR, K_STR, K_INT, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR,
    K_INT, K_STR, K_FLOAT, K_FLOAT, K_INT, K_INT, K_INT, K_STR, K_BOOL, K_BOOL, K_STR, K_STR, K_TAGS, K_STR,
    K_STR, K_STR};

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
    /* Where each value's text starts in ``rows`` and ends: the lg_fold row copies the values it
     * shares with the interactions row instead of rendering them again (a float's shortest
     * repr is the costliest part of a row). Offsets, not pointers: ``rows`` may be reallocated. */
    Py_ssize_t at[N_ATTRS + 1];
    seg->n = 0;
    for (int i = 0; i < N_ATTRS; i++) {
        if (i && putc_(rows, '\t') < 0) goto done;
        at[i] = rows->n;
        int r;
        switch (kinds[i]) {
            case K_STR: r = put_str(rows, v[i]); break;
            case K_INT: r = put_int(rows, v[i]); break;
            case K_FLOAT: r = put_float(rows, v[i]); break;
            case K_BOOL: r = put_bool(rows, v[i]); break;
            case K_TS: r = put_ts(rows, v[i]); break;
            default: r = put_tags(rows, seg, v[i], keys); break;
        }
        if (r < 0) goto done;
    }
    at[N_ATTRS] = rows->n + 1; /* as if a tab followed the last value */
    if (putc_(rows, '\n') < 0) goto done;
    if (flag) {
        /* lg_fold: experiment_id, variant, unit_id, ts, status, fallback, latency_ms, ttft_ms,
         * prompt_tokens, completion_tokens, response_chars, segments, conv, category */
        static const int shared[] = {A_EXPERIMENT_ID, A_VARIANT, A_UNIT_ID, A_TS, A_STATUS, A_FALLBACK,
                                     A_LATENCY_MS, A_TTFT_MS, A_PROMPT_TOKENS, A_COMPLETION_TOKENS,
                                     A_RESPONSE_CHARS};
        for (size_t k = 0; k < sizeof shared / sizeof shared[0]; k++) {
            int i = shared[k];
            /* value i ends one byte (its tab) before value i + 1 starts */
            if (put(fold, rows->p + at[i], at[i + 1] - 1 - at[i]) < 0 || putc_(fold, '\t') < 0) goto done;
        }
        if (put(fold, seg->p, seg->n) < 0 || putc_(fold, '\t') < 0) goto done;
        if (put(fold, flag == 2 ? "t\t" : "f\t", 2) < 0) goto done;
        if (put(fold, rows->p + at[A_CATEGORY], at[A_CATEGORY + 1] - 1 - at[A_CATEGORY]) < 0 ||
            putc_(fold, '\n') < 0)
            goto done;
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
     "render(events, flags, declared, always) -> (interactions COPY text, lg_fold COPY text); ValueError: "
     "render in Python"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "analytics.ingest._copyfmt",
                                    "COPY text of interaction events (see analytics.ingest.copy_text).", -1, methods};

PyMODINIT_FUNC PyInit__copyfmt(void) {
    for (int i = 0; i < N_ATTRS; i++) {
        attr_str[i] = PyUnicode_InternFromString(attr_names[i]);
        if (!attr_str[i]) return NULL;
    }
    return PyModule_Create(&module);
}
