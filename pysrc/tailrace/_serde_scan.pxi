# tailrace.serdes' JSON codec, compiled: it runs once per encoded or decoded message
# (files, stores, Redis, Kafka). Plain values and texts are written and read by its own
# C (_jsonenc.h, _jsondec.h); the rest goes to orjson or the standard library, without
# a Python frame for the choice or the guard scans. serdes keeps a pure-Python codec
# (orjson where it agrees, else the standard library; used where the compiled core is
# missing) and tests check that both give the standard library's bytes, values and
# errors, and that the scans agree with the regular expressions they stand for.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_AsUTF8String
from libc.string cimport memcpy

cdef extern from "Python.h":
    # the codec calls orjson once per message: straight through vectorcall, no argument tuple
    object PyObject_CallOneArg(object callable, object arg)


cdef extern from "_jsonenc.h":
    # tailrace's encoder of plain values into a growing buffer (the header says what it takes)
    ctypedef struct tr_jw:
        char *buf
        Py_ssize_t len
        Py_ssize_t cap
    int tr_json_plain(tr_jw *w, object obj) except -1
    void tr_jw_trim(tr_jw *w, Py_ssize_t keep)
    void tr_jw_free(tr_jw *w)


cdef extern from "_shortest.h":
    # the shortest repr of a double (Schubfach), with its table of 10^-k handed in at import
    void tr_sf_set(int i, uint64_t g1, uint64_t g0)
    int tr_shortest(double d, char *out)
    int TR_SF_K_MIN
    int TR_SF_N


def _shortest_table():
    """Fill _shortest.h's table: g(k) = floor(10^-k * 2^(125 - floor(-k log2 10))) + 1, exact
    (Python integers), split into its high and low 63 bits; k from TR_SF_K_MIN on."""
    cdef int i
    mask = (1 << 63) - 1
    for i in range(TR_SF_N):
        e = -(TR_SF_K_MIN + i)
        r = (e * 913124641741) >> 38  # floor(e log2 10), as the header computes it
        if e >= 0:
            g = 10**e << (125 - r) if r <= 125 else 10**e >> (r - 125)
        else:
            g = (1 << (125 - r)) // 10 ** (-e)
        g += 1
        tr_sf_set(i, g >> 63, g & mask)


_shortest_table()


def _float_repr(double d):
    """float.__repr__ of a finite ``d`` by _shortest.h (tests); None where it cannot."""
    cdef char buf[32]
    cdef int n = tr_shortest(d, buf)
    return None if n < 0 else buf[:n].decode("ascii")


cdef extern from "_jsondec.h":
    # tailrace's reader of plain JSON texts (the header says what it takes)
    ctypedef struct tr_jdcache:
        pass
    object tr_json_read(tr_jdcache *cache, const char *s, Py_ssize_t n, object bail)
    void tr_jdcache_free(tr_jdcache *cache)


DEF _SCRATCH_KEEP = 65536  # a codec's encoding buffer grown past this is let go after use

cdef object _NOT_READ = object()  # JsonCodec.read: a text the plain reader does not take


# Bytes a guard of json_std_decides starts from: e and E (a digit before them is an
# exponent), "." (the middle of 0.0000) and n (null). Every other byte is skipped.
cdef unsigned char _STD_TRIGGER[256]


cdef void _std_trigger_init() noexcept:
    cdef int c
    for c in range(256):
        _STD_TRIGGER[c] = 0
    _STD_TRIGGER[101] = 1  # e
    _STD_TRIGGER[69] = 1  # E
    _STD_TRIGGER[46] = 2  # .
    _STD_TRIGGER[110] = 3  # n


_std_trigger_init()


cdef inline bint _is_digit(unsigned char c) noexcept nogil:
    return <unsigned char>(c - 48) < 10


cdef bint _scan_long_digits(const unsigned char *b, Py_ssize_t n) noexcept nogil:
    """A run of 19 or more ASCII digits (``[0-9]{19}``), found without looking at most bytes.

    A byte that is not a digit is in no run of 19, so the next run can end 19 bytes
    later at the earliest: the scan probes every 19th byte and, at a digit, walks back
    to the start of its run (at most 18 bytes).
    """
    cdef Py_ssize_t i = 18, j
    while i < n:
        if not _is_digit(b[i]):
            i += 19
            continue
        j = i - 1
        while j > i - 19 and _is_digit(b[j]):
            j -= 1
        if j == i - 19:
            return True  # b[i - 18 .. i] are all digits
        i = j + 19  # b[j] is no digit: a run starts after it
    return False


DEF _DEEP_BYTES = 1000  # tailrace.serdes.DEEP_BYTES
DEF _DEEP_OPENS = 500  # tailrace.serdes.DEEP_OPENS


cdef bint _may_nest_deep(const unsigned char *b, Py_ssize_t n) noexcept nogil:
    """A text that could nest deeper than the standard library reads (about 990 levels,
    its recursion limit; orjson reads 1024): at least _DEEP_BYTES long with at least
    _DEEP_OPENS opening brackets. Short texts (nearly all) cost one compare."""
    cdef Py_ssize_t i, opens = 0
    if n < _DEEP_BYTES:
        return False
    for i in range(n):
        if b[i] == 91 or b[i] == 123:  # [ {
            opens += 1
    return opens >= _DEEP_OPENS


cdef bint _str_may_nest_deep(str text):
    """_may_nest_deep of a str: as long and as many opening brackets (a character each)."""
    return (len(text) >= _DEEP_BYTES
            and text.count("[") + text.count("{") >= _DEEP_OPENS)


cdef extern from *:
    """
    /* Before 3.12 one counter holds Python frames and C recursion alike: json's C scanner
     * and encoder stop as many levels sooner as there are frames below them. From 3.12 on
     * they count C recursion only, where a Python function called by a Python frame costs
     * nothing (json.loads' own frames do not count) and one called from C costs two. */
    #define TR_JSON_DEPTH_COUNTS_FRAMES (PY_VERSION_HEX < 0x030C0000)
    /* Take n levels of the recursion limit, as n Python frames would (3.11; later a no-op
     * that succeeds): 1, or 0 with no error set and nothing taken where the limit is near. */
    static int tr_json_take_frames(int n) {
        if (!TR_JSON_DEPTH_COUNTS_FRAMES)
            return 1;
        for (int i = 0; i < n; i++) {
            if (Py_EnterRecursiveCall("")) {
                while (i--)
                    Py_LeaveRecursiveCall();
                PyErr_Clear();
                return 0;
            }
        }
        return 1;
    }
    static void tr_json_give_frames(int n) {
        if (TR_JSON_DEPTH_COUNTS_FRAMES)
            while (n--)
                Py_LeaveRecursiveCall();
    }
    """
    const bint TR_JSON_DEPTH_COUNTS_FRAMES
    bint tr_json_take_frames(int n)
    void tr_json_give_frames(int n)


cdef extern from *:
    """
    /* bytes of a 64-bit word: "v has a zero byte" is (v - ONES) & ~v & HIGHS != 0 */
    #define TR_SCAN_ONES 0x0101010101010101ULL
    #define TR_SCAN_HIGHS 0x8080808080808080ULL
    #define TR_SCAN_CASE 0x2020202020202020ULL
    #define TR_SCAN_E 0x6565656565656565ULL
    #define TR_SCAN_DOT 0x2e2e2e2e2e2e2e2eULL
    #define TR_SCAN_N 0x6e6e6e6e6e6e6e6eULL
    /* the byte (0..7) of the lowest flagged high bit: memcpy put byte 0 of the text lowest */
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__GNUC__)
    #define TR_SCAN_LE 1
    #define tr_scan_lowest_byte(m) ((Py_ssize_t)(__builtin_ctzll(m) >> 3))
    #else
    #define TR_SCAN_LE 0
    #define tr_scan_lowest_byte(m) ((Py_ssize_t)0)
    #endif
    """
    const uint64_t TR_SCAN_ONES
    const uint64_t TR_SCAN_HIGHS
    const uint64_t TR_SCAN_CASE
    const uint64_t TR_SCAN_E
    const uint64_t TR_SCAN_DOT
    const uint64_t TR_SCAN_N
    const bint TR_SCAN_LE
    Py_ssize_t tr_scan_lowest_byte(uint64_t m) nogil


cdef inline uint64_t _zero_byte(uint64_t v) noexcept nogil:
    return (v - TR_SCAN_ONES) & ~v & TR_SCAN_HIGHS


cdef inline bint _std_at(const unsigned char *b, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """Does a match of json_std_decides' pattern hold the trigger byte b[i]?"""
    cdef unsigned char t = _STD_TRIGGER[b[i]]
    if t == 0:
        return False
    if t == 1:  # e, E after a digit
        return i > 0 and _is_digit(b[i - 1])
    if t == 2:  # the "." of 0.0000
        return (i > 0 and i + 4 < n and b[i - 1] == 48 and b[i + 1] == 48 and b[i + 2] == 48
                and b[i + 3] == 48 and b[i + 4] == 48)
    return i + 3 < n and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108  # null


cdef bint _scan_std_decides(const unsigned char *b, Py_ssize_t n) noexcept nogil:
    """``[0-9][eE]|0\\.0000|null`` somewhere in ``b``. Each match holds an e, E, "." or n:
    8 bytes at a time, a word with none of them is skipped (e and E are one test: E | 0x20
    is e), and in the other words only the flagged bytes are looked at (on a little-endian
    machine; elsewhere every byte of the word). A flag can be false (a borrow out of a
    lower flagged byte), never missing: ``_std_at`` decides each."""
    cdef Py_ssize_t i = 0, k
    cdef uint64_t w, flags
    while i + 8 <= n:
        memcpy(&w, b + i, 8)
        flags = (_zero_byte((w | TR_SCAN_CASE) ^ TR_SCAN_E) | _zero_byte(w ^ TR_SCAN_DOT)
                 | _zero_byte(w ^ TR_SCAN_N))
        if flags:
            if TR_SCAN_LE:
                while flags:
                    if _std_at(b, n, i + tr_scan_lowest_byte(flags)):
                        return True
                    flags &= flags - 1
            else:
                for k in range(i, i + 8):
                    if _std_at(b, n, k):
                        return True
        i += 8
    for k in range(i, n):
        if _std_at(b, n, k):
            return True
    return False


def json_long_digits(bytes data not None):
    """True when ``data`` holds a run of 19 or more ASCII digits (regex ``[0-9]{19}``)."""
    return _scan_long_digits(<const unsigned char *>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


def json_std_decides(bytes data not None):
    """True when ``data`` matches ``[0-9][eE]|0\\.0000|null``: orjson output the standard
    library may write differently (an exponent, a small float, NaN or inf as null)."""
    return _scan_std_decides(<const unsigned char *>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


@cython.final
cdef class JsonCodec:
    """The ``json`` serde's two functions (tailrace.serdes), compiled.

    The standard library decides every byte and value. Encoding: a plain value (exact
    dicts with str keys, lists, tuples, str, int within 64 bits, float, bool and None)
    is written by tailrace's own encoder (``_jsonenc.h``), which writes the standard
    library's bytes; anything else goes to the standard library (which writes it,
    refuses it or raises as always). Decoding: bytes holding a plain text (integers of up
    to 18 digits, no NaN or Infinity; ``_jsondec.h`` says exactly) are read by tailrace's own
    reader, which reads json.loads' values; other texts go on to orjson (when given), a
    fast path used only where it reads the same values: bytes with a run of 19+ digits (orjson reads
    such integers as floats), bytes that may nest deeper than the standard library
    reads, and bytes orjson refuses go to the standard library. The standard library
    itself is called below its Python layer: ``scan_once`` (json's C scanner) on a line
    that starts with ``{`` or ``[`` and holds exactly one value, and ``c_encoder``
    (json's C encoder, made once with the encoder's settings and ``markers``), which is
    what ``json.loads`` and ``JSONEncoder.encode`` end up calling. Anything else (other
    input, an error, the C encoder in use by another thread while it runs Python code)
    goes through ``std_loads`` / ``std_encode`` themselves, so values and error messages
    are theirs. Thread-safe (the module keeps the GIL; the plain encoder runs no Python
    code between starting to fill its buffer and copying out of it).
    """

    cdef object std_encode  # JSONEncoder(...).encode: str
    cdef object std_loads  # json.loads
    cdef object scan_once  # json's C scanner (json.decoder.JSONDecoder().scan_once), or None
    cdef object c_encoder  # json.encoder.c_make_encoder(markers, ...) of std_encode's encoder, or None
    cdef dict markers  # c_encoder's circular-reference markers (empty between calls)
    cdef bint encoding  # c_encoder is running (it may call Python code: another thread waits no turn)
    cdef object or_loads  # orjson.loads, or None
    cdef object or_decode_error
    cdef tr_jw w  # the plain encoder's buffer: filled and copied out under one GIL hold
    cdef tr_jdcache keys  # the plain reader's object keys

    def __init__(self, std_encode, std_loads, scan_once=None, c_encoder=None, markers=None,
                 or_loads=None, or_decode_error=None):
        if (c_encoder is None) != (markers is None):
            raise ValueError("JsonCodec: c_encoder and its markers dict go together")
        self.std_encode = std_encode
        self.std_loads = std_loads
        self.scan_once = scan_once
        self.c_encoder = c_encoder
        self.markers = markers
        self.encoding = False
        self.or_loads = or_loads
        self.or_decode_error = or_decode_error if or_decode_error is not None else ()

    def __dealloc__(self):
        tr_jw_free(&self.w)
        tr_jdcache_free(&self.keys)

    @property
    def fast(self):
        """Which fast paths are on: ``(orjson decodes, C scanner, C encoder)``."""
        return (self.or_loads is not None, self.scan_once is not None, self.c_encoder is not None)

    cdef int plain(self, object obj) except -1:
        """Encode ``obj`` into ``self.w`` (from its start) when it is plain: 1, else 0 and
        nothing written. The caller copies ``w.buf[:w.len]`` out, then calls ``trim``,
        before running any Python code."""
        self.w.len = 0
        return tr_json_plain(&self.w, obj)

    cdef inline void trim(self) noexcept:
        tr_jw_trim(&self.w, _SCRATCH_KEEP)

    cpdef bytes encode(self, object obj):
        """``obj`` as compact UTF-8 JSON (the standard library's bytes). Raises its errors."""
        cdef bytes out
        if self.plain(obj):
            out = PyBytes_FromStringAndSize(self.w.buf, self.w.len)
            self.trim()
            return out
        return self.encode_std(obj)

    cpdef bytes encode_std(self, object obj):
        """``obj`` encoded by the standard library alone.

        On 3.11 json's C encoder stops at the recursion limit, which counts the Python
        frames below it: called from here it would have ``std_encode``'s two (encode,
        iterencode) fewer and write values nested two levels deeper than ``std_encode``
        from the same caller (issue 36). It runs with those two levels
        taken (where they cannot be, ``std_encode`` itself raises). From 3.12 on it counts
        C recursion only, where the direct call costs what it costs under ``std_encode``."""
        cdef object chunks
        if (self.c_encoder is None or self.encoding or isinstance(obj, str)
                or not tr_json_take_frames(2)):
            return PyUnicode_AsUTF8String(self.std_encode(obj))
        self.encoding = True
        try:
            chunks = self.c_encoder(obj, 0)
        except BaseException as e:
            # a half-done encoding can leave markers behind (the C encoder does not
            # remove them on error): clear them, then let the encoder itself raise
            self.markers.clear()
            if not isinstance(e, Exception):
                raise
            chunks = None
        finally:
            self.encoding = False
            tr_json_give_frames(2)
        if chunks is None:
            return PyUnicode_AsUTF8String(self.std_encode(obj))
        return PyUnicode_AsUTF8String("".join(chunks))

    cdef inline object read(self, const char *s, Py_ssize_t n):
        """The value of the JSON text ``s[:n]`` (UTF-8) when the plain reader takes it, else
        ``_NOT_READ`` (the caller then reads the text the other ways)."""
        return tr_json_read(&self.keys, s, n, _NOT_READ)

    cpdef object decode(self, object data):
        """The value of one JSON text (bytes or str), as the standard library reads it.
        Bytes go to the plain reader first (``read``), then the other ways (``decode_other``)."""
        cdef object v
        if type(data) is bytes:
            v = self.read(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
            if v is not _NOT_READ:
                return v
        return self.decode_other(data)

    cdef object decode_other(self, object data):
        """``decode`` without the plain reader. orjson's path takes bytes and UTF-8 str only
        (it also reads a memoryview, which the standard library refuses), and no text with
        a run of 19+ digits (orjson reads such integers as floats) or that may nest deeper
        than the standard library reads (``_may_nest_deep``)."""
        cdef const unsigned char *b
        cdef Py_ssize_t n
        cdef object raw
        if self.or_loads is not None:
            if type(data) is bytes:
                raw = data
            elif type(data) is str:
                try:
                    raw = (<str>data).encode()
                except UnicodeEncodeError:  # a lone surrogate: the standard library reads it
                    return self.decode_std(data)
            else:
                return self.decode_std(data)
            b = <const unsigned char *>PyBytes_AS_STRING(raw)
            n = PyBytes_GET_SIZE(raw)
            if not _scan_long_digits(b, n) and not _may_nest_deep(b, n):
                try:
                    return PyObject_CallOneArg(self.or_loads, data)
                except self.or_decode_error:
                    pass  # NaN/Infinity tokens, or the standard library's error
        return self.decode_std(data)

    cpdef object decode_std(self, object data):
        """``data`` decoded by the standard library alone.

        On 3.11 a text that may nest deep goes to ``std_loads`` itself, not to ``scan_once``:
        json's C scanner stops at the recursion limit, which counts the Python frames below
        it, and called from here it has json.loads' three (loads, decode, raw_decode) fewer,
        so it read texts a few levels deeper than json.loads from the same caller (994-996
        from a shallow stack; issue 36). From 3.12 on the scanner counts C recursion only,
        where ``scan_once`` from here costs what it costs under json.loads and ``std_loads``
        called from C would cost more (it then stopped two levels sooner)."""
        cdef Py_ssize_t n
        cdef const char *b
        cdef object text
        if self.scan_once is not None:
            if type(data) is bytes:
                n = PyBytes_GET_SIZE(data)
                b = PyBytes_AS_STRING(data)
                # "{" or "[" first: no BOM, and json.loads would read UTF-8 (a NUL second
                # byte would make it UTF-16) with no leading whitespace to skip
                if (n >= 2 and (b[0] == 123 or b[0] == 91) and b[1] != 0 and not (
                        TR_JSON_DEPTH_COUNTS_FRAMES and _may_nest_deep(<const unsigned char *>b, n))):
                    try:
                        text = PyUnicode_DecodeUTF8(b, n, "surrogatepass")
                    except UnicodeDecodeError:
                        return self.std_loads(data)
                    return self._scan(text, data)
            elif type(data) is str and len(<str>data) >= 1 and (
                    (<str>data)[0] == "{" or (<str>data)[0] == "[") and not (
                    TR_JSON_DEPTH_COUNTS_FRAMES and _str_may_nest_deep(data)):
                return self._scan(data, data)
        return self.std_loads(data)

    cdef object _scan(self, str text, object data):
        try:
            value, end = self.scan_once(text, 0)
        except Exception:  # StopIteration or JSONDecodeError: json.loads says which, and how
            return self.std_loads(data)
        if end != len(text):  # trailing whitespace, or extra data: json.loads decides
            return self.std_loads(data)
        return value
