/* The shortest decimal of a double, as float.__repr__ writes it, without bignum arithmetic.
 *
 * float.__repr__ (PyOS_double_to_string(d, 'r', ...)) runs David Gay's dtoa in mode 0, which
 * for the long digit strings of sums (512569.13000000006) spends ~300 ns in bignum
 * arithmetic (quorem, multadd): 18% of a float-summing job's CPU. This is the Schubfach
 * method (R. Giulietti, "The Schubfach way to render doubles", 2020): the decimal of the
 * fewest digits inside the rounding interval of the double, and of those the closest (ties
 * to even), found with three 64 x 128-bit products against a table of 10^-k scaled to 126
 * bits. That is exactly the digit string dtoa's mode 0 returns for a normal double (a
 * subnormal is left to the caller: see tr_shortest); the layout follows
 * PyOS_double_to_string's 'r' format (exponent below 1e-4 and from 1e16 on, ".0" on
 * integers). tests/core/test_serdes_codec.py holds it to repr() over random bit patterns,
 * subnormals, powers of two and the format's edges.
 *
 * The table (tr_sf_g) is computed once with exact integers by the module that includes this
 * (tailrace._core, at import: _serde_scan.pxi) and handed in through tr_sf_set; until it is
 * complete, and where the compiler has no 128-bit integers, tr_shortest returns -1 and the
 * caller uses PyOS_double_to_string. No Python dependency. */
#ifndef TAILRACE_SHORTEST_H
#define TAILRACE_SHORTEST_H

#include <stdint.h>
#include <string.h>

#define TR_SF_K_MIN (-324)
#define TR_SF_K_MAX 292
#define TR_SF_N (TR_SF_K_MAX - TR_SF_K_MIN + 1)

/* g(k) = floor(10^-k * 2^(125 - flog2pow10(-k))) + 1 = g1 * 2^63 + g0, g in [2^125, 2^126] */
static uint64_t tr_sf_g[2 * TR_SF_N];
static int tr_sf_count = 0; /* entries set: the table is ready at TR_SF_N */

/* entry i (k = TR_SF_K_MIN + i); called once per entry at import, in order */
static void tr_sf_set(int i, uint64_t g1, uint64_t g0) {
    if (i < 0 || i >= TR_SF_N)
        return;
    tr_sf_g[2 * i] = g1;
    tr_sf_g[2 * i + 1] = g0;
    if (i == tr_sf_count)
        tr_sf_count++;
}

#ifdef __SIZEOF_INT128__

static inline uint64_t tr_sf_mulhi(uint64_t a, uint64_t b) {
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* floor(q log10(2)), floor(q log10(2) + log10(3/4)), floor(e log2(10)) for the exponents of
 * doubles (exact over those ranges, as the paper shows) */
static inline int tr_sf_flog10pow2(int q) {
    return (int)(((int64_t)q * 661971961083LL) >> 41);
}
static inline int tr_sf_flog10three4pow2(int q) {
    return (int)(((int64_t)q * 661971961083LL - 274743187321LL) >> 41);
}
static inline int tr_sf_flog2pow10(int e) {
    return (int)(((int64_t)e * 913124641741LL) >> 38);
}

/* rop(cp * g * 2^-127): the product rounded to odd (its low bit set when inexact) */
static inline uint64_t tr_sf_rop(uint64_t g1, uint64_t g0, uint64_t cp) {
    uint64_t x1 = tr_sf_mulhi(g0, cp);
    uint64_t y0 = g1 * cp;
    uint64_t y1 = tr_sf_mulhi(g1, cp);
    uint64_t z = (y0 >> 1) + x1;
    uint64_t vbp = y1 + (z >> 63);
    const uint64_t mask63 = (UINT64_C(1) << 63) - 1;
    return vbp | (((z & mask63) + mask63) >> 63);
}

/* the shortest decimal f * 10^e of c * 2^q, a normal double (c >= 2^52: s below has 16 or
 * 17 digits, so the shortest has as many or one fewer before its trailing zeros go) */
static void tr_sf_decimal(int q, uint64_t c, uint64_t *f, int *e) {
    const uint64_t c_min = UINT64_C(1) << 52;
    uint64_t out = c & 1;
    uint64_t cb = c << 2;
    uint64_t cbr = cb + 2;
    uint64_t cbl;
    int k;
    if (c != c_min || q == -1074) { /* regular spacing */
        cbl = cb - 2;
        k = tr_sf_flog10pow2(q);
    } else { /* irregular: the power of two's lower neighbour is half as far */
        cbl = cb - 1;
        k = tr_sf_flog10three4pow2(q);
    }
    int h = q + tr_sf_flog2pow10(-k) + 2;
    uint64_t g1 = tr_sf_g[2 * (k - TR_SF_K_MIN)];
    uint64_t g0 = tr_sf_g[2 * (k - TR_SF_K_MIN) + 1];
    uint64_t vb = tr_sf_rop(g1, g0, cb << h);
    uint64_t vbl = tr_sf_rop(g1, g0, cbl << h);
    uint64_t vbr = tr_sf_rop(g1, g0, cbr << h);
    uint64_t s = vb >> 2;
    if (s >= 100) {
        uint64_t sp10 = 10 * tr_sf_mulhi(s, UINT64_C(115292150460684698) << 4); /* 10 floor(s/10) */
        uint64_t tp10 = sp10 + 10;
        int upin = vbl + out <= sp10 << 2;
        int wpin = (tp10 << 2) + out <= vbr;
        if (upin != wpin) {
            *f = upin ? sp10 : tp10;
            *e = k;
            return;
        }
    }
    uint64_t t = s + 1;
    int uin = vbl + out <= s << 2;
    int win = (t << 2) + out <= vbr;
    if (uin != win) {
        *f = uin ? s : t;
        *e = k;
        return;
    }
    /* both in the interval: the closer, ties to even */
    int64_t cmp = (int64_t)(vb - ((s + t) << 1));
    *f = (cmp < 0 || (cmp == 0 && (s & 1) == 0)) ? s : t;
    *e = k;
}

/* float.__repr__ of d (finite) into out (at least 32 bytes); its length, or -1 when the
 * table is not ready (the caller formats it otherwise) */
static int tr_shortest(double d, char *out) {
    if (tr_sf_count != TR_SF_N)
        return -1;
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    char *p = out;
    if (bits >> 63)
        *p++ = '-';
    uint64_t t = bits & ((UINT64_C(1) << 52) - 1);
    int bq = (int)((bits >> 52) & 0x7FF);
    uint64_t f;
    int e;
    if (bq != 0) {
        uint64_t c = (UINT64_C(1) << 52) | t;
        int mq = 1075 - bq; /* -q */
        if (0 < mq && mq < 53 && ((c >> mq) << mq) == c) {
            f = c >> mq; /* an integer below 2^53: its own digits */
            e = 0;
        } else {
            tr_sf_decimal(-mq, c, &f, &e);
        }
    } else if (t != 0) {
        /* subnormal: the method's two candidate lengths need a significand of 16 digits
         * or more (a normal double's); a subnormal may have fewer, and a shorter decimal
         * than both (5e-324): left to the caller */
        return -1;
    } else {
        memcpy(p, "0.0", 3);
        return (int)(p - out) + 3;
    }
    /* the digits of f (at most 17), trailing zeros dropped into e */
    while (f % 10 == 0) {
        f /= 10;
        e++;
    }
    char digits[24];
    int n = 0;
    for (uint64_t r = f; r; r /= 10)
        n++;
    for (int i = n - 1; i >= 0; i--, f /= 10)
        digits[i] = (char)('0' + f % 10);
    int decpt = n + e;               /* value = 0.digits * 10^decpt */
    if (decpt <= -4 || decpt > 16) { /* d.ddde[+-]XX */
        int exp = decpt - 1;
        *p++ = digits[0];
        if (n > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, (size_t)(n - 1));
            p += n - 1;
        }
        *p++ = 'e';
        *p++ = exp < 0 ? '-' : '+';
        unsigned ue = (unsigned)(exp < 0 ? -exp : exp);
        if (ue >= 100)
            *p++ = (char)('0' + ue / 100);
        *p++ = (char)('0' + ue / 10 % 10);
        *p++ = (char)('0' + ue % 10);
    } else if (decpt <= 0) { /* 0.000ddd */
        *p++ = '0';
        *p++ = '.';
        memset(p, '0', (size_t)(-decpt));
        p += -decpt;
        memcpy(p, digits, (size_t)n);
        p += n;
    } else if (decpt >= n) { /* ddd000.0 */
        memcpy(p, digits, (size_t)n);
        p += n;
        memset(p, '0', (size_t)(decpt - n));
        p += decpt - n;
        *p++ = '.';
        *p++ = '0';
    } else { /* ddd.ddd */
        memcpy(p, digits, (size_t)decpt);
        p += decpt;
        *p++ = '.';
        memcpy(p, digits + decpt, (size_t)(n - decpt));
        p += n - decpt;
    }
    return (int)(p - out);
}

#else /* no 128-bit integers: the caller formats every double otherwise */

static int tr_shortest(double d, char *out) {
    (void)d;
    (void)out;
    return -1;
}

#endif /* __SIZEOF_INT128__ */

#endif /* TAILRACE_SHORTEST_H */
