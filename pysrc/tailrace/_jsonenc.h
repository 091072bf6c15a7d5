/* tailrace's JSON encoder for plain values: the bytes the standard library writes for
 * json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True), UTF-8
 * encoded (tailrace.serdes' json serde), written straight into a growing buffer.
 *
 * It takes only what it can write exactly as the standard library does: exact dicts
 * with exact str keys, exact lists and tuples, exact str (no lone surrogate), exact int
 * within 64 bits, exact float, True, False and None, nested at most TR_JSON_DEPTH deep.
 * For anything else it says "not plain" (0) and the caller hands the value to the
 * standard library, which writes it, refuses it or raises as it always does (a cycle
 * runs into the depth bound first). It runs no Python code and creates no Python
 * object, so nothing can change the value under it and no other thread runs while it
 * writes (the caller holds the GIL).
 *
 * Why its own: orjson's dumps costs ~1.3k instructions for a three-key record (it
 * allocates a 1 KiB bytes object and shrinks it), and its output could be kept only
 * after a walk that proves the value plain (~300 more); this writes the same record
 * in ~0.7k, into a buffer the caller copies from (tests/core/test_serdes_codec.py holds
 * it to the standard library's bytes). */
#ifndef TAILRACE_JSONENC_H
#define TAILRACE_JSONENC_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_jsonkeys.h"
#include "_shortest.h"

/* deeper than orjson writes (255), far below the interpreter's recursion limit that
 * bounds the standard library; the C stack holds it easily */
#define TR_JSON_DEPTH 256

typedef struct {
    char *buf;      /* PyMem_Malloc'd, or NULL */
    Py_ssize_t len; /* bytes written */
    Py_ssize_t cap; /* bytes allocated */
    /* A dict key met again (the literal keys of a task's records: interned str) is copied
     * as the `"key":` it encoded to (_jsonkeys.h, by the key's address), or NULL */
    tr_jkey *keys;
} tr_jw;

static int tr_jw_grow(tr_jw *w, Py_ssize_t need) {
    Py_ssize_t cap = w->cap ? w->cap : 256;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *b = (char *)PyMem_Realloc(w->buf, (size_t)cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->buf = b;
    w->cap = cap;
    return 0;
}

/* room for `extra` more bytes */
static inline int tr_jw_reserve(tr_jw *w, Py_ssize_t extra) {
    if (extra > w->cap - w->len)
        return tr_jw_grow(w, w->len + extra);
    return 0;
}

/* one byte more */
static inline int tr_jw_putc(tr_jw *w, char c) {
    if (tr_jw_reserve(w, 1) < 0)
        return -1;
    w->buf[w->len++] = c;
    return 0;
}

/* After an encoding: a buffer grown past `keep` bytes (one huge message) is let go. */
static inline void tr_jw_trim(tr_jw *w, Py_ssize_t keep) {
    if (w->cap > keep) {
        PyMem_Free(w->buf);
        w->buf = NULL;
        w->len = w->cap = 0;
    }
}

/* Everything let go (the GIL held: the cached keys are released). */
static void tr_jw_free(tr_jw *w) {
    tr_jw_trim(w, -1);
    tr_jkeys_free(&w->keys);
}

/* How json's escape_unicode writes an ASCII character: 0 as is, 'u' as \u00XX (lowercase
 * hex), else a backslash and this letter. */
/* clang-format off */
static const char tr_json_esc[128] = {
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u', /* 0x00 */
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', /* 0x10 */
    ['"'] = '"', ['\\'] = '\\',
};
/* clang-format on */

/* an ASCII character that needs escaping, written at p (room for 6 bytes); the end */
static inline char *tr_json_put_esc(char *p, unsigned c) {
    char e = tr_json_esc[c];
    p[0] = '\\';
    if (e != 'u') {
        p[1] = e;
        return p + 2;
    }
    p[1] = 'u';
    p[2] = '0';
    p[3] = '0';
    p[4] = "0123456789abcdef"[c >> 4];
    p[5] = "0123456789abcdef"[c & 15];
    return p + 6;
}

/* an ASCII character at p, escaped as json writes it if it must be (room for 6 bytes) */
static inline char *tr_json_put_ascii(char *p, unsigned c) {
    if (tr_json_esc[c])
        return tr_json_put_esc(p, c);
    *p = (char)c;
    return p + 1;
}

/* 8 ASCII bytes that may hold one to escape (below 0x20, '"' or '\\'): "v has a zero
 * byte" is (v - ONES) & ~v & HIGHS, exact for bytes below 0x80; a false "may" only costs
 * the byte loop */
#define TR_JW_ONES 0x0101010101010101ULL
#define TR_JW_HIGHS 0x8080808080808080ULL
static inline int tr_json_word_may_escape(uint64_t v) {
    uint64_t ctl = (v - 0x2020202020202020ULL) & ~v;
    uint64_t quote = v ^ 0x2222222222222222ULL, bslash = v ^ 0x5C5C5C5C5C5C5C5CULL;
    quote = (quote - TR_JW_ONES) & ~quote;
    bslash = (bslash - TR_JW_ONES) & ~bslash;
    return ((ctl | quote | bslash) & TR_JW_HIGHS) != 0;
}

/* a str as a JSON string; 0 for a lone surrogate (not UTF-8: the standard library's
 * encode raises), 1 written, -1 error */
static int tr_json_str(tr_jw *w, PyObject *s) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0)
        return -1;
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
    char *p;
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *d = (const unsigned char *)PyUnicode_DATA(s);
        if (tr_jw_reserve(w, n + 2) < 0)
            return -1;
        p = w->buf + w->len;
        *p++ = '"';
        /* the common case: nothing to escape, copied a word at a time */
        for (; i + 8 <= n; i += 8) {
            uint64_t v;
            memcpy(&v, d + i, 8);
            if (tr_json_word_may_escape(v))
                break;
            memcpy(p + i, &v, 8);
        }
        for (; i < n; i++) {
            if (tr_json_esc[d[i]])
                break;
            p[i] = (char)d[i];
        }
        if (i == n) {
            p[n] = '"';
            w->len += n + 2;
            return 1;
        }
        /* escapes: the rest a byte at a time, with room for an escape (6) per byte */
        w->len += 1 + i;
        if (tr_jw_reserve(w, 6 * (n - i) + 1) < 0)
            return -1;
        p = w->buf + w->len;
        for (; i < n; i++)
            p = tr_json_put_ascii(p, d[i]);
        *p++ = '"';
        w->len = p - w->buf;
        return 1;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    /* 4 bytes of UTF-8 at most per character, 6 for an escaped (ASCII) one */
    if (tr_jw_reserve(w, 6 * n + 2) < 0)
        return -1;
    p = w->buf + w->len;
    *p++ = '"';
    for (; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            p = tr_json_put_ascii(p, c);
        } else if (c < 0x800) {
            p[0] = (char)(0xC0 | (c >> 6));
            p[1] = (char)(0x80 | (c & 0x3F));
            p += 2;
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF)
                return 0;
            p[0] = (char)(0xE0 | (c >> 12));
            p[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            p[2] = (char)(0x80 | (c & 0x3F));
            p += 3;
        } else {
            p[0] = (char)(0xF0 | (c >> 18));
            p[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            p[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            p[3] = (char)(0x80 | (c & 0x3F));
            p += 4;
        }
    }
    *p++ = '"';
    w->len = p - w->buf;
    return 1;
}

/* s[:n] written: 1, or -1 (no memory) */
static int tr_jw_lit(tr_jw *w, const char *s, Py_ssize_t n) {
    if (tr_jw_reserve(w, n) < 0)
        return -1;
    memcpy(w->buf + w->len, s, (size_t)n);
    w->len += n;
    return 1;
}

static const char tr_json_digits2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* clang-format off */
static const unsigned long long tr_json_pow10[19] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
    1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
    100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL,
};
/* clang-format on */

/* an exact int as int.__repr__ writes it; 0 past 64 bits */
static int tr_json_int(tr_jw *w, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
        return 0;
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (tr_jw_reserve(w, 21) < 0)
        return -1;
    char *p = w->buf + w->len;
    unsigned long long u = (unsigned long long)v;
    if (v < 0) {
        *p++ = '-';
        u = 0ULL - u;
    }
    /* its digits: log10 from the highest bit (1233/4096 ~ log10(2)), corrected once */
#if defined(__GNUC__) || defined(__clang__)
    int digits = (int)(((64 - __builtin_clzll(u | 1)) * 1233) >> 12);
    digits += digits < 19 && u >= tr_json_pow10[digits];
    digits += digits == 0;
#else
    int digits = 1;
    while (digits < 19 && u >= tr_json_pow10[digits]) /* 2**63 has 19 */
        digits++;
#endif
    char *q = p + digits;
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        q -= 2;
        q[0] = tr_json_digits2[2 * r];
        q[1] = tr_json_digits2[2 * r + 1];
    }
    if (u >= 10) {
        q[-2] = tr_json_digits2[2 * u];
        q[-1] = tr_json_digits2[2 * u + 1];
    } else {
        q[-1] = (char)('0' + u);
    }
    w->len = (p + digits) - w->buf;
    return 1;
}

/* an exact float as the standard library writes it: float.__repr__, or NaN, Infinity,
 * -Infinity (allow_nan) */
static int tr_json_float(tr_jw *w, PyObject *o) {
    double d = PyFloat_AS_DOUBLE(o);
    if (!isfinite(d)) {
        if (isnan(d))
            return tr_jw_lit(w, "NaN", 3);
        return d > 0 ? tr_jw_lit(w, "Infinity", 8) : tr_jw_lit(w, "-Infinity", 9);
    }
    char buf[32];
    int n = tr_shortest(d, buf); /* the same text, without dtoa's bignums (_shortest.h) */
    if (n >= 0)
        return tr_jw_lit(w, buf, n);
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return -1;
    int r = tr_jw_lit(w, s, (Py_ssize_t)strlen(s));
    PyMem_Free(s);
    return r;
}

static int tr_json_value(tr_jw *w, PyObject *o, int depth);

/* a dict key (an exact str, borrowed) and its colon */
static int tr_json_key(tr_jw *w, PyObject *k) {
    /* the cache's set of k: by its address (small objects share their low bits, which
     * the hash mixes away) */
    uint64_t h = tr_jkeys_index((uint64_t)(uintptr_t)k);
    if (w->keys != NULL) {
        tr_jkey *set = w->keys + 2 * h;
        tr_jkey *e = set[0].key == k ? &set[0] : set[1].key == k ? &set[1] : NULL;
        if (e != NULL) {
            if (tr_jw_reserve(w, TR_JKEY_BYTES) < 0)
                return -1;
            memcpy(w->buf + w->len, e->bytes, TR_JKEY_BYTES); /* whole: a fixed-size copy */
            w->len += e->len;
            return 1;
        }
    }
    Py_ssize_t start = w->len;
    int r = tr_json_str(w, k);
    if (r != 1)
        return r;
    if (tr_jw_putc(w, ':') < 0)
        return -1;
    Py_ssize_t n = w->len - start;
    if (n <= TR_JKEY_BYTES && PyUnicode_CHECK_INTERNED(k)) {
        tr_jkey *set = tr_jkeys_set(&w->keys, h);
        if (set != NULL) /* else no cache: every key is encoded, as without one */
            tr_jkeys_put(set, k, w->buf + start, n);
    }
    return 1;
}

static int tr_json_dict(tr_jw *w, PyObject *o, int depth) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int r, first = 1;
    if (tr_jw_putc(w, '{') < 0)
        return -1;
    /* k and v are borrowed: the dict holds them, and nothing below runs Python code */
    while (PyDict_Next(o, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k))
            return 0;
        if (!first) {
            if (tr_jw_putc(w, ',') < 0)
                return -1;
        }
        first = 0;
        if ((r = tr_json_key(w, k)) != 1)
            return r;
        if ((r = tr_json_value(w, v, depth + 1)) != 1)
            return r;
    }
    if (tr_jw_putc(w, '}') < 0)
        return -1;
    return 1;
}

static int tr_json_seq(tr_jw *w, PyObject *o, int depth) {
    /* an exact list or tuple: nothing below runs Python code, so its size stays put and
     * its items (borrowed) stay in it */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    int r;
    if (tr_jw_putc(w, '[') < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) {
            if (tr_jw_putc(w, ',') < 0)
                return -1;
        }
        if ((r = tr_json_value(w, items[i], depth + 1)) != 1)
            return r;
    }
    if (tr_jw_putc(w, ']') < 0)
        return -1;
    return 1;
}

static int tr_json_value(tr_jw *w, PyObject *o, int depth) {
    if (PyUnicode_CheckExact(o))
        return tr_json_str(w, o);
    if (PyLong_CheckExact(o))
        return tr_json_int(w, o);
    if (o == Py_None)
        return tr_jw_lit(w, "null", 4);
    if (o == Py_True)
        return tr_jw_lit(w, "true", 4);
    if (o == Py_False)
        return tr_jw_lit(w, "false", 5);
    if (PyFloat_CheckExact(o))
        return tr_json_float(w, o);
    if (depth >= TR_JSON_DEPTH)
        return 0;
    if (PyDict_CheckExact(o))
        return tr_json_dict(w, o, depth);
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o))
        return tr_json_seq(w, o, depth);
    return 0;
}

/* `o` as JSON text from w->len on: 1 written, 0 not plain (the standard library decides;
 * w->len is back where it was), -1 an error is set (memory only). */
static int tr_json_plain(tr_jw *w, PyObject *o) {
    Py_ssize_t start = w->len;
    int r = tr_json_value(w, o, 0);
    if (r != 1)
        w->len = start;
    return r;
}

#endif /* TAILRACE_JSONENC_H */
