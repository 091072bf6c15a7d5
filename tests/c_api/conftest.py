"""Build the raw C library with cffi (API mode) once per test session.

The C sources under csrc/ are compiled straight into a throwaway extension in a
temporary directory; nothing here depends on the Cython binding. The cdef below
copies the public declarations of csrc/include/tailrace/*.h (structs whose layout
only the C compiler knows are declared with ``...;``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
SOURCES = ["status.c", "clock.c", "notifier.c", "queue.c", "sequencer.c", "watermark.c", "event_time.c"]

CDEF = """
typedef enum tr_status {
    TR_OK = 0, TR_EAGAIN = 1, TR_ETIMEDOUT = 2, TR_EINVAL = 3, TR_ENOMEM = 4,
    TR_EALREADY = 5, TR_EUNKNOWN = 6, TR_EREGRESS = 7, TR_ECLOSED = 8,
    TR_EFAILED = 9, TR_ESYS = 10
} tr_status;
#define TR_STATUS_COUNT ...
const char *tr_status_str(tr_status status);
const char *tr_status_name(tr_status status);

int64_t tr_now_ns(void);

typedef struct tr_notifier { ...; } tr_notifier;
tr_status tr_notifier_init(tr_notifier *n);
void tr_notifier_destroy(tr_notifier *n);
uint64_t tr_notifier_prepare_wait(tr_notifier *n);
void tr_notifier_cancel_wait(tr_notifier *n);
tr_status tr_notifier_commit_wait(tr_notifier *n, uint64_t key, int64_t timeout_ns);
void tr_notifier_notify(tr_notifier *n);

typedef struct tr_item { uint64_t a; uint64_t b; } tr_item;
typedef struct tr_queue tr_queue;
tr_status tr_queue_create(size_t capacity, tr_notifier *notifier, tr_queue **out);
void tr_queue_destroy(tr_queue *q);
size_t tr_queue_capacity(const tr_queue *q);
tr_notifier *tr_queue_notifier(tr_queue *q);
tr_status tr_queue_try_push_mpsc(tr_queue *q, tr_item item);
size_t tr_queue_try_push_batch_mpsc(tr_queue *q, const tr_item *items, size_t n);
tr_status tr_queue_try_pop_sc(tr_queue *q, tr_item *out);
size_t tr_queue_try_pop_batch_sc(tr_queue *q, tr_item *out, size_t max);
tr_status tr_queue_pop_wait_sc(tr_queue *q, tr_item *out, int64_t timeout_ns);
int tr_queue_empty_sc(const tr_queue *q);
size_t tr_queue_size_approx(const tr_queue *q);

#define TR_SEQ_COMMIT ...
#define TR_SEQ_FAILED ...
#define TR_SEQ_USER_SHIFT ...
#define TR_SEQ_FLAGS_MASK ...
#define TR_SEQ_MAX_CONCURRENCY ...
typedef struct tr_seq_release {
    uint64_t seq; uint64_t tag_a; uint64_t tag_b; uint32_t flags;
} tr_seq_release;
typedef struct tr_sequencer tr_sequencer;
tr_status tr_sequencer_create(uint32_t max_concurrency, tr_sequencer **out);
void tr_sequencer_destroy(tr_sequencer *s);
tr_status tr_sequencer_acquire(tr_sequencer *s, uint64_t tag_a, uint64_t tag_b,
                               uint64_t *seq_out);
tr_status tr_sequencer_complete(tr_sequencer *s, uint64_t seq, uint32_t flags);
size_t tr_sequencer_release(tr_sequencer *s, tr_seq_release *out, size_t max);
tr_status tr_sequencer_head_failed(const tr_sequencer *s, uint64_t *seq_out);
uint32_t tr_sequencer_outstanding(const tr_sequencer *s);
uint64_t tr_sequencer_next_seq(const tr_sequencer *s);
uint64_t tr_sequencer_released_upto(const tr_sequencer *s);
uint32_t tr_sequencer_max_concurrency(const tr_sequencer *s);

typedef struct tr_watermark tr_watermark;
typedef struct tr_mark { uint64_t position; uint64_t handle; } tr_mark;
tr_status tr_watermark_create(uint32_t npartitions, tr_watermark **out);
void tr_watermark_destroy(tr_watermark *w);
uint32_t tr_watermark_partitions(const tr_watermark *w);
tr_status tr_watermark_advance(tr_watermark *w, uint32_t partition, uint64_t position,
                               uint64_t handle);
tr_status tr_watermark_get(const tr_watermark *w, uint32_t partition, tr_mark *out);
tr_status tr_watermark_mark_committed(tr_watermark *w, uint32_t partition, tr_mark mark);
tr_status tr_watermark_committed(const tr_watermark *w, uint32_t partition, tr_mark *out);
int tr_watermark_dirty(const tr_watermark *w);

#define TR_ET_NONE ...
#define TR_ET_END ...
typedef struct tr_event_time tr_event_time;
tr_status tr_event_time_create(uint32_t npartitions, int64_t lag_ms, int64_t idle_ns,
                               int64_t start_ns, tr_event_time **out);
void tr_event_time_destroy(tr_event_time *et);
tr_status tr_event_time_read(tr_event_time *et, uint32_t partition, int64_t max_ts,
                             int64_t now_ns);
tr_status tr_event_time_empty(tr_event_time *et, uint32_t partition, int64_t now_ns);
tr_status tr_event_time_ended(tr_event_time *et, uint32_t partition, int64_t now_ns);
int64_t tr_event_time_update(tr_event_time *et, int64_t now_ns);
void tr_event_time_floor(tr_event_time *et, int64_t floor);
int64_t tr_event_time_get(const tr_event_time *et);
int64_t tr_event_time_partition(const tr_event_time *et, uint32_t partition);
tr_status tr_event_time_read_n(tr_event_time *et, uint32_t partition, int64_t max_ts,
                               uint64_t count, int64_t now_ns);
void tr_event_time_track(tr_event_time *et);
int tr_event_time_tracking(const tr_event_time *et);
tr_status tr_event_time_seen(tr_event_time *et, uint32_t partition, int64_t ts);
"""

HEADERS = ("status", "clock", "notifier", "queue", "sequencer", "watermark", "event_time")
SOURCE = "\n".join(f'#include "tailrace/{h}.h"' for h in HEADERS)


def _build(tmpdir: Path):
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.set_source(
        "_tailrace_capi",
        SOURCE,
        sources=[str(CSRC / "src" / name) for name in SOURCES],
        include_dirs=[str(CSRC / "include")],
        extra_compile_args=["-O1", "-std=c11", "-pthread"],
        extra_link_args=["-pthread"],
    )
    so_path = ffi.compile(tmpdir=str(tmpdir), verbose=False)
    spec = importlib.util.spec_from_file_location("_tailrace_capi", so_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_tailrace_capi"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def capi(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The compiled C API: ``capi.ffi`` and ``capi.lib``."""
    module = _build(tmp_path_factory.mktemp("capi"))
    return SimpleNamespace(ffi=module.ffi, lib=module.lib)
