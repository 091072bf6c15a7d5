/* tailrace's JSON reader for plain texts: the value json.loads reads from UTF-8 bytes,
 * built straight from the bytes (tailrace.serdes' json serde, file lines, Redis and
 * Kafka values).
 *
 * It reads only what it can read exactly as json.loads does: objects, arrays, strings
 * without control characters (UTF-8 with surrogates passed, as json.loads decodes bytes;
 * the escapes json reads, surrogate pairs joined as it joins them), integers of up to 18
 * digits, numbers with a fraction or an exponent (float() of the same text), true, false
 * and null, separated by JSON whitespace, nested at most TR_JREAD_DEPTH deep, and nothing
 * after the value but whitespace. For any other text it "bails": it returns NULL with no
 * error set and the caller hands the bytes to the next reader (orjson where it reads the
 * same, else json.loads), which reads the value or raises its own error. So a text this reader
 * takes reads as json.loads reads it, and a text it does not take reads as before.
 *
 * It runs no Python code: the only objects it makes are str, int, float, list and dict
 * (a new list or dict may start a garbage collection, which may run finalizers and let
 * another thread run; the key cache below is never left half-changed across one).
 *
 * Object keys met again come from the key cache (_jsonkeys.h) by their bytes: the str
 * made the first time, its hash computed once. (Not interned: since 3.12 an interned str
 * lives for good, and a stream's keys may be unbounded, such as ids.)
 *
 * Every function below that returns a PyObject * returns a new reference, or NULL. */
#ifndef TAILRACE_JSONDEC_H
#define TAILRACE_JSONDEC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_jsonkeys.h"

#define TR_JREAD_DEPTH 200

typedef struct {
    tr_jkey *keys; /* the reader's key cache (_jsonkeys.h), or NULL */
} tr_jdcache;

static void tr_jdcache_free(tr_jdcache *c) {
    tr_jkeys_free(&c->keys);
}

typedef struct {
    const unsigned char *p, *end;
    tr_jdcache *cache;
    int error; /* a Python error is set (else a NULL result is a bail) */
} tr_jr;

/* JSON's whitespace: space, tab, newline, carriage return */
static const unsigned char tr_jr_space[256] = {['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [' '] = 1};

static inline void tr_jr_ws(tr_jr *r) {
    while (r->p < r->end && tr_jr_space[*r->p])
        r->p++;
}

/* How a byte inside a string is read: 0 as is, 1 the closing quote, 2 a backslash (an
 * escape: tr_jr_str_escaped) or a control character (bail: strict json refuses it), 3 a
 * byte of a non-ASCII character. */
#define TR_JR_CTL2 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2
#define TR_JR_HI16 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3
static const unsigned char tr_jr_strbyte[256] = {
    TR_JR_CTL2, TR_JR_CTL2, [0x22] = 1, [0x5C] = 2, [0x80] = TR_JR_HI16, TR_JR_HI16,
    TR_JR_HI16, TR_JR_HI16, TR_JR_HI16, TR_JR_HI16, TR_JR_HI16,          TR_JR_HI16,
};

/* The string whose opening quote r->p has passed: its bytes [*start, *start + *len), and
 * whether any is non-ASCII; 1 when r->p is past its closing quote. 2 at a backslash
 * before the end (r->p unchanged: tr_jr_str_escaped reads it), 0 at a control character
 * or no end (bail). */
static inline int tr_jr_str_span(tr_jr *r, const unsigned char **start, Py_ssize_t *len,
                                 int *nonascii) {
    const unsigned char *p = r->p, *end = r->end;
    int high = 0;
    for (;;) {
        while (p < end && tr_jr_strbyte[*p] == 0)
            p++;
        if (p >= end)
            return 0;
        unsigned char k = tr_jr_strbyte[*p];
        if (k == 1)
            break;
        if (k == 2)
            return *p == '\\' ? 2 : 0;
        high = 1;
        p++;
    }
    *start = r->p;
    *len = p - r->p;
    *nonascii = high;
    r->p = p + 1;
    return 1;
}

/* The code point of the UTF-8 sequence at s (before end) and its length in *len, as
 * bytes.decode("utf-8", "surrogatepass") reads it (an encoded surrogate is one code point
 * of its own); -1 for bytes that are not UTF-8 (json.loads raises on them). */
static inline long tr_jr_utf8_at(const unsigned char *s, const unsigned char *end, int *len) {
    unsigned c = s[0];
    long cp;
    if (c < 0x80) {
        *len = 1;
        return (long)c;
    }
    if (c < 0xC2) /* a continuation byte, or the lead of an overlong form */
        return -1;
    if (c < 0xE0) {
        if (end - s < 2 || (s[1] & 0xC0) != 0x80)
            return -1;
        *len = 2;
        return (long)(((c & 0x1F) << 6) | (s[1] & 0x3F));
    }
    if (c < 0xF0) {
        if (end - s < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return -1;
        cp = (long)(((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F));
        if (cp < 0x800)
            return -1;
        *len = 3;
        return cp; /* U+D800..U+DFFF included: surrogatepass */
    }
    if (c < 0xF5) {
        if (end - s < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return -1;
        cp = (long)(((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) |
                    (s[3] & 0x3F));
        if (cp < 0x10000 || cp > 0x10FFFF)
            return -1;
        *len = 4;
        return cp;
    }
    return -1;
}

/* a str of UTF-8 bytes (surrogates passed, as json.loads decodes); NULL: bail (not
 * UTF-8: json.loads raises its own error) or r->error */
static PyObject *tr_jr_make_str(tr_jr *r, const unsigned char *s, Py_ssize_t n, int nonascii) {
    PyObject *u;
    if (!nonascii) {
        u = PyUnicode_New(n, 127);
        if (u == NULL) {
            r->error = 1;
            return NULL;
        }
        memcpy(PyUnicode_1BYTE_DATA(u), s, (size_t)n);
        return u;
    }
    /* two passes: check and count (and find the widest character), then fill */
    const unsigned char *p = s, *end = s + n;
    Py_ssize_t chars = 0;
    long cp, widest = 0;
    int len;
    while (p < end) {
        if ((cp = tr_jr_utf8_at(p, end, &len)) < 0)
            return NULL;
        if (cp > widest)
            widest = cp;
        p += len;
        chars++;
    }
    u = PyUnicode_New(chars, (Py_UCS4)widest);
    if (u == NULL) {
        r->error = 1;
        return NULL;
    }
    int kind = PyUnicode_KIND(u);
    void *data = PyUnicode_DATA(u);
    Py_ssize_t i = 0;
    for (p = s; p < end; p += len)
        PyUnicode_WRITE(kind, data, i++, (Py_UCS4)tr_jr_utf8_at(p, end, &len));
    return u;
}

/* the value of 4 hex digits at p (json takes either case), or -1 */
static inline long tr_jr_hex4(const unsigned char *p, const unsigned char *end) {
    long v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i];
        if (c - '0' < 10)
            v = (v << 4) | (long)(c - '0');
        else if ((c | 0x20) - 'a' < 6)
            v = (v << 4) | (long)((c | 0x20) - 'a' + 10);
        else
            return -1;
    }
    return v;
}

/* The string whose opening quote r->p has passed, holding backslash escapes, read as json's
 * scanstring does: \" \\ \/ \b \f \n \r \t, and \uXXXX, where a high surrogate followed by
 * a \u escape of a low one is one character and any other surrogate stays as it is. NULL:
 * bail (an escape json refuses, a control character, bytes that are not UTF-8, no end) or
 * r->error. */
static PyObject *tr_jr_str_escaped(tr_jr *r) {
    Py_UCS4 stack[128], *buf = stack;
    Py_ssize_t n = 0, cap = 128;
    const unsigned char *p = r->p, *end = r->end;
    PyObject *u = NULL;
    for (;;) {
        Py_UCS4 ch;
        if (p >= end)
            goto done;
        unsigned c = *p;
        if (c == '"') {
            p++;
            break;
        }
        if (c == '\\') {
            if (end - p < 2)
                goto done;
            switch (p[1]) {
            case '"':
            case '\\':
            case '/':
                ch = p[1];
                break;
            case 'b':
                ch = '\b';
                break;
            case 'f':
                ch = '\f';
                break;
            case 'n':
                ch = '\n';
                break;
            case 'r':
                ch = '\r';
                break;
            case 't':
                ch = '\t';
                break;
            case 'u': {
                long h = tr_jr_hex4(p + 2, end);
                if (h < 0)
                    goto done;
                p += 6;
                ch = (Py_UCS4)h;
                if (h >= 0xD800 && h <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                    long lo = tr_jr_hex4(p + 2, end);
                    if (lo < 0)
                        goto done; /* json refuses the second escape as it stands */
                    if (lo >= 0xDC00 && lo <= 0xDFFF) {
                        ch = (Py_UCS4)(0x10000 + ((h - 0xD800) << 10) + (lo - 0xDC00));
                        p += 6;
                    }
                }
                goto put;
            }
            default:
                goto done;
            }
            p += 2;
        } else if (c < 0x20) {
            goto done;
        } else if (c < 0x80) {
            ch = c;
            p++;
        } else {
            int len;
            long cp = tr_jr_utf8_at(p, end, &len);
            if (cp < 0)
                goto done;
            ch = (Py_UCS4)cp;
            p += len;
        }
    put:
        if (n == cap) {
            Py_UCS4 *grown = (Py_UCS4 *)PyMem_Malloc((size_t)cap * 2 * sizeof(Py_UCS4));
            if (grown == NULL) {
                PyErr_NoMemory();
                r->error = 1;
                goto done;
            }
            memcpy(grown, buf, (size_t)n * sizeof(Py_UCS4));
            if (buf != stack)
                PyMem_Free(buf);
            buf = grown;
            cap *= 2;
        }
        buf[n++] = ch;
    }
    u = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, n);
    if (u == NULL)
        r->error = 1;
    else
        r->p = p;
done:
    if (buf != stack)
        PyMem_Free(buf);
    return u;
}

/* an object key (the opening quote passed), or NULL (bail or error) */
static PyObject *tr_jr_key(tr_jr *r) {
    const unsigned char *s;
    Py_ssize_t n;
    int nonascii;
    int span = tr_jr_str_span(r, &s, &n, &nonascii);
    if (span != 1)
        return span == 2 ? tr_jr_str_escaped(r) : NULL; /* an escaped key is not kept */
    if (n > TR_JKEY_BYTES)
        return tr_jr_make_str(r, s, n, nonascii);
    /* the cache's set: by the key's length and first, middle and last bytes, enough to
     * tell a record's keys apart (two keys that share a set both stay, in its two ways) */
    uint64_t h = tr_jkeys_index(n ? (uint64_t)n ^ ((uint64_t)s[0] << 8) ^
                                        ((uint64_t)s[n >> 1] << 16) ^ ((uint64_t)s[n - 1] << 24)
                                  : 0);
    tr_jkey *set = tr_jkeys_set(&r->cache->keys, h);
    for (int way = 0; set != NULL && way < 2; way++) {
        if (set[way].key != NULL && set[way].len == n &&
            memcmp(set[way].bytes, s, (size_t)n) == 0) {
            Py_INCREF(set[way].key);
            return set[way].key;
        }
    }
    PyObject *k = tr_jr_make_str(r, s, n, nonascii);
    if (k == NULL)
        return NULL;
    if (PyObject_Hash(k) == -1) { /* computed once, kept in the str */
        Py_DECREF(k);
        r->error = 1;
        return NULL;
    }
    if (set != NULL) /* else no cache: every key is made, as without one */
        tr_jkeys_put(set, k, (const char *)s, n);
    return k;
}

static inline int tr_jr_digit(unsigned char c) {
    return (unsigned char)(c - '0') < 10;
}

/* a number at r->p: json's NUMBER_RE, -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?; NULL: bail
 * (no number: NaN, Infinity, -Infinity; an int of 19+ digits; a float text over 63 bytes)
 * or r->error */
static PyObject *tr_jr_number(tr_jr *r) {
    const unsigned char *p = r->p, *end = r->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || !tr_jr_digit(*p))
        return NULL;
    const unsigned char *digits = p;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && tr_jr_digit(*p))
            p++;
    }
    Py_ssize_t ndigits = p - digits;
    int is_float = 0;
    if (p + 1 < end && *p == '.' && tr_jr_digit(p[1])) {
        is_float = 1;
        p += 2;
        while (p < end && tr_jr_digit(*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        const unsigned char *e = p + 1;
        if (e < end && (*e == '+' || *e == '-'))
            e++;
        if (e < end && tr_jr_digit(*e)) {
            is_float = 1;
            p = e + 1;
            while (p < end && tr_jr_digit(*p))
                p++;
        }
    }
    if (!is_float) {
        if (ndigits > 18)
            return NULL;
        long long v = 0;
        for (const unsigned char *d = digits; d < p; d++)
            v = v * 10 + (*d - '0');
        PyObject *o = PyLong_FromLongLong(neg ? -v : v);
        if (o == NULL)
            r->error = 1;
        r->p = p;
        return o;
    }
    char text[64];
    Py_ssize_t n = p - start;
    if (n >= (Py_ssize_t)sizeof text)
        return NULL;
    memcpy(text, start, (size_t)n);
    text[n] = '\0';
    char *stop;
    /* float() of the text (json.loads calls float): the same correctly rounded double,
     * infinite past the range */
    double d = PyOS_string_to_double(text, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        r->error = 1;
        return NULL;
    }
    if (stop != text + n)
        return NULL;
    PyObject *o = PyFloat_FromDouble(d);
    if (o == NULL)
        r->error = 1;
    r->p = p;
    return o;
}

static PyObject *tr_jr_value(tr_jr *r, int depth);

/* After an item of an object or array: 1 past a comma and the whitespace after it, 0 past
 * the closing `close`, -1 at anything else (bail). */
static inline int tr_jr_next(tr_jr *r, unsigned char close) {
    tr_jr_ws(r);
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        tr_jr_ws(r);
        return 1;
    }
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    return -1;
}

static PyObject *tr_jr_object(tr_jr *r, int depth) {
    PyObject *d = PyDict_New();
    if (d == NULL) {
        r->error = 1;
        return NULL;
    }
    tr_jr_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return d;
    }
    for (;;) {
        if (r->p >= r->end || *r->p != '"')
            goto fail;
        r->p++;
        PyObject *k = tr_jr_key(r);
        if (k == NULL)
            goto fail;
        tr_jr_ws(r);
        if (r->p >= r->end || *r->p != ':') {
            Py_DECREF(k);
            goto fail;
        }
        r->p++;
        tr_jr_ws(r);
        PyObject *v = tr_jr_value(r, depth + 1);
        if (v == NULL) {
            Py_DECREF(k);
            goto fail;
        }
        int rc = PyDict_SetItem(d, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) {
            r->error = 1;
            goto fail;
        }
        int next = tr_jr_next(r, '}');
        if (next == 0)
            return d;
        if (next < 0)
            goto fail;
    }
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *tr_jr_array(tr_jr *r, int depth) {
    PyObject *l = PyList_New(0);
    if (l == NULL) {
        r->error = 1;
        return NULL;
    }
    tr_jr_ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return l;
    }
    for (;;) {
        PyObject *v = tr_jr_value(r, depth + 1);
        if (v == NULL)
            goto fail;
        int rc = PyList_Append(l, v);
        Py_DECREF(v);
        if (rc < 0) {
            r->error = 1;
            goto fail;
        }
        int next = tr_jr_next(r, ']');
        if (next == 0)
            return l;
        if (next < 0)
            goto fail;
    }
fail:
    Py_DECREF(l);
    return NULL;
}

static inline int tr_jr_word(tr_jr *r, const char *w, Py_ssize_t n) {
    if (r->end - r->p >= n && memcmp(r->p, w, (size_t)n) == 0) {
        r->p += n;
        return 1;
    }
    return 0;
}

/* the value at r->p (no whitespace before it) */
static PyObject *tr_jr_value(tr_jr *r, int depth) {
    if (r->p >= r->end)
        return NULL;
    unsigned char c = *r->p;
    if (c == '"') {
        const unsigned char *s;
        Py_ssize_t n;
        int nonascii;
        r->p++;
        int span = tr_jr_str_span(r, &s, &n, &nonascii);
        if (span != 1)
            return span == 2 ? tr_jr_str_escaped(r) : NULL;
        return tr_jr_make_str(r, s, n, nonascii);
    }
    if (c == '-' || tr_jr_digit(c))
        return tr_jr_number(r);
    if (c == '{' || c == '[') {
        if (depth >= TR_JREAD_DEPTH)
            return NULL;
        r->p++;
        return c == '{' ? tr_jr_object(r, depth) : tr_jr_array(r, depth);
    }
    if (tr_jr_word(r, "true", 4))
        Py_RETURN_TRUE;
    if (tr_jr_word(r, "false", 5))
        Py_RETURN_FALSE;
    if (tr_jr_word(r, "null", 4))
        Py_RETURN_NONE;
    return NULL; /* NaN, Infinity or not JSON: the next reader's */
}

/* The value of the JSON text s[0:n] (UTF-8), a new reference; `bail` (a new reference)
 * when it is not a text this reader takes; NULL when a Python error is set. */
static PyObject *tr_json_read(tr_jdcache *cache, const char *s, Py_ssize_t n, PyObject *bail) {
    tr_jr r = {(const unsigned char *)s, (const unsigned char *)s + n, cache, 0};
    /* json.loads reads bytes whose first or second byte is NUL as UTF-16 or UTF-32, and
     * strips a UTF-8 BOM: neither starts a value here, so both bail below */
    tr_jr_ws(&r);
    PyObject *v = tr_jr_value(&r, 0);
    if (v != NULL) {
        tr_jr_ws(&r);
        if (r.p == r.end)
            return v;
        Py_DECREF(v); /* extra data: json.loads' error */
    } else if (r.error) {
        return NULL;
    }
    Py_INCREF(bail);
    return bail;
}

#endif /* TAILRACE_JSONDEC_H */
