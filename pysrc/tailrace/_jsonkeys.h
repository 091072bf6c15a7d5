/* The object-key cache of tailrace's JSON writer (_jsonenc.h) and reader (_jsondec.h): a
 * stream's records share their keys, so a key met again is taken from here instead of
 * being encoded (writer: `"key":` by the key's address) or made again (reader: the str
 * by its bytes). TR_JKEY_SETS sets of two ways; each entry holds a strong reference to
 * its str, so no other str can take a cached address meanwhile. All of it runs with the
 * GIL held and no Python code in between (a str's deallocation runs none). */
#ifndef TAILRACE_JSONKEYS_H
#define TAILRACE_JSONKEYS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TR_JKEY_SETS_LOG2 7
#define TR_JKEY_SETS (1 << TR_JKEY_SETS_LOG2)
#define TR_JKEY_BYTES 48 /* bytes an entry keeps at most */

typedef struct {
    PyObject *key;  /* a str (a strong reference), or NULL */
    Py_ssize_t len; /* bytes[:len] */
    char bytes[TR_JKEY_BYTES];
} tr_jkey;

/* The two ways of set `h` (0 <= h < TR_JKEY_SETS) of *keys, made (zeroed) on first use;
 * NULL when that allocation fails (PyMem sets no error). */
static inline tr_jkey *tr_jkeys_set(tr_jkey **keys, uint64_t h) {
    if (*keys == NULL &&
        (*keys = (tr_jkey *)PyMem_Calloc(2 * TR_JKEY_SETS, sizeof(tr_jkey))) == NULL)
        return NULL;
    return *keys + 2 * h;
}

/* Set h's index from a 64-bit hash (Fibonacci hashing: its top bits) */
static inline uint64_t tr_jkeys_index(uint64_t h) {
    return (h * 0x9E3779B97F4A7C15ULL) >> (64 - TR_JKEY_SETS_LOG2);
}

/* Keep `k` (borrowed; the cache takes its own reference) with bytes[:n] (n at most
 * TR_JKEY_BYTES) in `set`: the newer way keeps its key, the older one gives way. */
static inline void tr_jkeys_put(tr_jkey *set, PyObject *k, const char *bytes, Py_ssize_t n) {
    PyObject *old = set[1].key;
    set[1] = set[0];
    Py_INCREF(k);
    set[0].key = k;
    set[0].len = n;
    memcpy(set[0].bytes, bytes, (size_t)n);
    Py_XDECREF(old);
}

/* Every key released and the cache let go (the GIL held). */
static inline void tr_jkeys_free(tr_jkey **keys) {
    if (*keys == NULL)
        return;
    for (int i = 0; i < 2 * TR_JKEY_SETS; i++)
        Py_CLEAR((*keys)[i].key);
    PyMem_Free(*keys);
    *keys = NULL;
}

#endif /* TAILRACE_JSONKEYS_H */
