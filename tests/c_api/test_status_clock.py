"""tr_status names/messages and the clock, through cffi."""

NAMES = [
    "TR_OK",
    "TR_EAGAIN",
    "TR_ETIMEDOUT",
    "TR_EINVAL",
    "TR_ENOMEM",
    "TR_EALREADY",
    "TR_EUNKNOWN",
    "TR_EREGRESS",
    "TR_ECLOSED",
    "TR_EFAILED",
    "TR_ESYS",
]


def test_status_names_and_messages(capi):
    ffi, lib = capi.ffi, capi.lib
    assert lib.TR_STATUS_COUNT == len(NAMES)
    messages = set()
    for code, name in enumerate(NAMES):
        assert getattr(lib, name) == code
        assert ffi.string(lib.tr_status_name(code)).decode() == name
        message = ffi.string(lib.tr_status_str(code)).decode()
        assert message and message not in messages
        messages.add(message)


def test_status_unknown_code(capi):
    ffi, lib = capi.ffi, capi.lib
    for code in (len(NAMES), 1000, 2**31):
        assert ffi.string(lib.tr_status_str(code)) == b"unknown status"
        assert lib.tr_status_name(code) != ffi.NULL


def test_clock_monotonic(capi):
    lib = capi.lib
    samples = [lib.tr_now_ns() for _ in range(1000)]
    assert samples == sorted(samples)
    assert samples[0] > 0
