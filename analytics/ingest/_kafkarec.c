/*
 * analytics.ingest._kafkarec — the records of one Kafka v2 record batch, parsed in C.
 *
 * analytics.ingest.kafka_records replaced kafka-python's per-record parsing with a flat Python
 * loop (~1.7 µs per record here, still the largest part of the consumer's Kafka cost);
 * this is the same loop in C:
 *
 *   records_v2(buf, pos, count, base_offset, first_ts, max_ts, ts_type, topic, partition,
 *              leader_epoch, record_type) -> (records, bytes_read, error)
 *
 * ``buf``: the (decompressed) batch, records from ``pos``; ``record_type``: kafka-python's
 * ConsumerRecord (a namedtuple), built with the same 13 fields as the Python loop.
 * ``records`` holds every record parsed before the first structural problem, whose
 * description is ``error`` (None when the whole batch parsed and nothing is left over);
 * the caller yields the records, then raises kafka-python's CorruptRecordError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    const unsigned char *p;
    Py_ssize_t n, pos;
    const char *err;
} Reader;

/* A zigzag varint (at most 64 bits); sets r->err on a truncated or overlong one. */
static int64_t varint(Reader *r) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->pos >= r->n) {
            r->err = "truncated varint";
            return 0;
        }
        unsigned char b = r->p[r->pos++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
    }
    r->err = "varint longer than 64 bits";
    return 0;
}

/* ``len`` bytes at the reader as bytes (None when len < 0). */
static PyObject *take(Reader *r, int64_t len) {
    if (len < 0) Py_RETURN_NONE;
    if (len > r->n - r->pos) {
        r->err = "field beyond the end of the batch";
        return NULL;
    }
    PyObject *o = PyBytes_FromStringAndSize((const char *)r->p + r->pos, (Py_ssize_t)len);
    r->pos += (Py_ssize_t)len;
    return o;
}

static PyObject *new_record(PyTypeObject *type, PyObject **items) {
    PyObject *rec = type->tp_alloc(type, 13);
    if (!rec) return NULL;
    for (int i = 0; i < 13; i++) PyTuple_SET_ITEM(rec, i, items[i]); /* steals */
    return rec;
}

static PyObject *records_v2(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, count;
    long long base_offset, first_ts, max_ts;
    int ts_type;
    PyObject *topic, *partition, *epoch;
    PyTypeObject *rtype;
    if (!PyArg_ParseTuple(args, "y*nnLLLiOOOO!", &buf, &pos, &count, &base_offset, &first_ts, &max_ts, &ts_type,
                          &topic, &partition, &epoch, &PyType_Type, &rtype))
        return NULL;
    PyObject *out = NULL, *list = NULL;
    if (!PyType_IsSubtype(rtype, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        goto done;
    }
    if (pos < 0 || pos > buf.len || count < 0) {
        PyErr_SetString(PyExc_ValueError, "bad position or count");
        goto done;
    }
    list = PyList_New(0);
    if (!list) goto done;
    Reader r = {buf.buf, buf.len, pos, NULL};
    long long bytes_read = 0;
    for (Py_ssize_t i = 0; i < count && !r.err; i++) {
        PyObject *key = NULL, *value = NULL, *headers = NULL;
        int64_t length = varint(&r);
        if (r.err) break;
        Py_ssize_t start = r.pos;
        if (r.pos >= r.n) {
            r.err = "truncated record";
            break;
        }
        r.pos++; /* attributes */
        int64_t ts_delta = varint(&r);
        int64_t off_delta = r.err ? 0 : varint(&r);
        int64_t key_len = r.err ? 0 : varint(&r);
        if (r.err) break;
        key = take(&r, key_len);
        if (!key) goto record_failed;
        int64_t value_len = varint(&r);
        if (r.err) goto record_failed;
        value = take(&r, value_len);
        if (!value) goto record_failed;
        headers = PyList_New(0);
        if (!headers) goto record_failed;
        long long header_size = -1;
        if (r.pos >= r.n) {
            r.err = "truncated record";
            goto record_failed;
        }
        if (r.p[r.pos] == 0) {
            r.pos++;
        } else {
            int64_t nh = varint(&r);
            if (r.err) goto record_failed;
            if (nh < 0) {
                r.err = "invalid number of record headers";
                goto record_failed;
            }
            header_size = 0;
            for (int64_t h = 0; h < nh; h++) {
                int64_t hk = varint(&r);
                if (r.err) goto record_failed;
                if (hk < 0) {
                    r.err = "invalid negative header key size";
                    goto record_failed;
                }
                if (hk > r.n - r.pos) {
                    r.err = "header key beyond the end of the batch";
                    goto record_failed;
                }
                PyObject *hkey = PyUnicode_DecodeUTF8((const char *)r.p + r.pos, (Py_ssize_t)hk, "strict");
                if (!hkey) {
                    PyErr_Clear();
                    r.err = "header key is not UTF-8";
                    goto record_failed;
                }
                r.pos += (Py_ssize_t)hk;
                int64_t hv = varint(&r);
                PyObject *hval = r.err ? NULL : take(&r, hv);
                if (!hval) {
                    Py_DECREF(hkey);
                    goto record_failed;
                }
                header_size += hk + (hv >= 0 ? hv : 0);
                PyObject *pair = PyTuple_Pack(2, hkey, hval);
                Py_DECREF(hkey);
                Py_DECREF(hval);
                if (!pair || PyList_Append(headers, pair) < 0) {
                    Py_XDECREF(pair);
                    goto record_failed;
                }
                Py_DECREF(pair);
            }
        }
        if (r.pos - start != length) {
            r.err = "invalid record size";
            goto record_failed;
        }
        {
            PyObject *items[13];
            Py_ssize_t ksize = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
            Py_ssize_t vsize = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
            items[0] = Py_NewRef(topic);
            items[1] = Py_NewRef(partition);
            items[2] = Py_NewRef(epoch);
            items[3] = PyLong_FromLongLong(base_offset + off_delta);
            items[4] = PyLong_FromLongLong(ts_type == 1 ? max_ts : first_ts + ts_delta);
            items[5] = PyLong_FromLong(ts_type);
            items[6] = key;
            items[7] = value;
            items[8] = headers;
            items[9] = Py_NewRef(Py_None);
            items[10] = PyLong_FromSsize_t(ksize);
            items[11] = PyLong_FromSsize_t(vsize);
            items[12] = PyLong_FromLongLong(header_size);
            key = value = headers = NULL;
            int bad = !items[3] || !items[4] || !items[5] || !items[10] || !items[11] || !items[12];
            PyObject *rec = bad ? NULL : new_record(rtype, items);
            if (!rec) {
                for (int k = 0; k < 13; k++) Py_XDECREF(items[k]);
                goto fail;
            }
            int rc = PyList_Append(list, rec);
            Py_DECREF(rec);
            if (rc < 0) goto fail;
        }
        bytes_read += length;
        continue;
    record_failed:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        if (!r.err) goto fail; /* a Python error (memory) */
        break;
    }
    if (!r.err && r.pos != r.n) r.err = "unconsumed bytes after all records";
    out = Py_BuildValue("(OLs)", list, bytes_read, r.err);
    goto done;
fail:
    out = NULL;
done:
    Py_XDECREF(list);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"records_v2", records_v2, METH_VARARGS,
     "records_v2(buf, pos, count, base_offset, first_ts, max_ts, ts_type, topic, partition, epoch, record_type)"
     " -> (records, bytes_read, error or None)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "analytics.ingest._kafkarec", "Kafka v2 record parsing (see analytics.ingest.kafka_records).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kafkarec(void) { return PyModule_Create(&module); }
