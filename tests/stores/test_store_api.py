"""The KeyValueStore API on a real backend (rules 25, 29): mapping protocol, serdes,
range scans over cache and backend together, eviction, errors naming store and key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailrace import ConfigError, Container, MemoryCheckpointStore, MemorySystem
from tailrace.config import StoreSpec, parse_config
from tailrace.interfaces import CheckpointStore, EncodedRows
from tailrace.serdes import SerdeError
from tailrace.sqlite import SqliteCheckpointStore
from tailrace.stores import COMPILED, KeyValueStore, TaskStores, _PyKeyValueStore
from tailrace.types import SystemStreamPartition

_IMPLS: dict[str, type[KeyValueStore[Any, Any]]] = {"compiled": KeyValueStore, "python": _PyKeyValueStore}
_impl: list[type[KeyValueStore[Any, Any]]] = [KeyValueStore]


@pytest.fixture(autouse=True, params=list(_IMPLS))
def impl(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test body runs on the compiled hot path and on its pure-Python twin."""
    if request.param == "compiled" and not COMPILED:
        pytest.skip("tailrace._stores is not built")
    _impl[0] = _IMPLS[request.param]
    yield
    _impl[0] = KeyValueStore


def _store(backend: CheckpointStore, **spec: Any) -> tuple[TaskStores, KeyValueStore[Any, Any]]:
    backend.open("job")
    stores = TaskStores("Partition 0", {"s": StoreSpec(**spec)}, backend, _impl[0])
    return stores, stores.get("s")


def _store_named(backend: CheckpointStore, name: str) -> tuple[TaskStores, KeyValueStore[Any, Any]]:
    stores = TaskStores("Partition 0", {name: StoreSpec()}, backend, _impl[0])
    return stores, stores.get(name)


def _commit(backend: CheckpointStore, stores: TaskStores) -> None:
    state = stores.begin_commit()
    ok = False
    try:
        backend.write("Partition 0", {}, state)
        ok = True
    finally:
        stores.end_commit(ok)


def test_mapping_protocol_reads_own_writes(backend: CheckpointStore) -> None:
    # rule 25: a task reads its own writes at once, committed or not
    stores, s = _store(backend)
    assert s.get("a") is None and s.get("a", 7) == 7 and "a" not in s
    s["a"] = 1
    s.put("b", {"x": [1, 2]})
    assert s["a"] == 1 and s["b"] == {"x": [1, 2]} and "a" in s
    with pytest.raises(KeyError):
        s["zz"]
    del s["a"]
    assert "a" not in s
    with pytest.raises(KeyError):
        del s["a"]
    s.put_all({"c": 3, "d": 4})
    s.put_all([("e", 5)])
    s.delete_all(["c", "nope"])
    assert dict(s.items()) == {"b": {"x": [1, 2]}, "d": 4, "e": 5}
    _commit(backend, stores)
    assert dict(s.items()) == {"b": {"x": [1, 2]}, "d": 4, "e": 5}
    backend.close()


def test_the_compiled_hot_path_is_built() -> None:
    # the project builds tailrace._stores; without it stores fall back to the Python twin
    assert COMPILED


def test_values_have_value_semantics(backend: CheckpointStore) -> None:
    _, s = _store(backend)
    v = {"n": 1}
    s["k"] = v
    v["n"] = 2  # mutating after put does not change the store
    got = s["k"]
    assert got == {"n": 1}
    got["n"] = 3  # nor does mutating what get returned
    assert s["k"] == {"n": 1}
    backend.close()


def test_restart_sees_committed_state_only(tmp_path: Path) -> None:
    # rule 26: only committed writes survive; read-through after a restart (rule 29)
    db = tmp_path / "c.db"
    backend = SqliteCheckpointStore(db)
    stores, s = _store(backend)
    s["kept"] = 1
    _commit(backend, stores)
    s["lost"] = 2
    s["kept"] = 99
    backend.close()
    backend = SqliteCheckpointStore(db)
    _, s = _store(backend)
    assert s.get("kept") == 1 and "lost" not in s
    assert list(s.items()) == [("kept", 1)]
    backend.close()


@pytest.mark.parametrize(
    ("kserde", "vserde", "key", "value"),
    [
        ("json", "json", ["a", 1], {"x": None, "y": 1.5}),
        ("str", "str", "clé", "välue"),
        ("bytes", "bytes", b"\x00\xff", b"\x01"),
        ("int", "int", -5, 2**62),
        ("pickle", "pickle", ("t", 1), {1, 2}),
        ("str", "msgpack", "k", {"a": [1, b"b"]}),
    ],
)
def test_serdes_round_trip_through_the_backend(
    tmp_path: Path, kserde: str, vserde: str, key: Any, value: Any
) -> None:
    if vserde == "msgpack":
        pytest.importorskip("msgpack")
    db = tmp_path / "c.db"
    backend = SqliteCheckpointStore(db)
    stores, s = _store(backend, key_serde=kserde, value_serde=vserde)
    k = tuple(key) if isinstance(key, list) else key
    s[k] = value
    _commit(backend, stores)
    backend.close()
    backend = SqliteCheckpointStore(db)
    _, s = _store(backend, key_serde=kserde, value_serde=vserde)
    assert s[k] == value
    ((got_key, got_value),) = list(s.items())
    assert got_value == value
    assert got_key == k  # a key comes back as it was put (under json a tuple, not a list)
    backend.close()


def test_range_scans_merge_cache_and_backend_in_key_order(backend: CheckpointStore) -> None:
    # rule 29: range scans see cache and backend as one; order of the encoded keys
    stores, s = _store(backend, key_serde="int", value_serde="json", cache_size=4)
    for k in range(0, 40, 2):
        s[k] = f"c{k}"  # committed, most evicted from the small cache
    _commit(backend, stores)
    assert s.cached() <= 4
    for k in range(1, 40, 4):
        s[k] = f"d{k}"  # dirty, not in the backend
    s[10] = "d10"  # dirty overwrite of a committed key
    del s[20]  # dirty delete of a committed key
    s[-3] = "neg"
    expected = {k: f"c{k}" for k in range(0, 40, 2)}
    expected.update({k: f"d{k}" for k in range(1, 40, 4)})
    expected[10] = "d10"
    del expected[20]
    expected[-3] = "neg"
    assert list(s.items()) == sorted(expected.items())
    assert list(s.items(5, 21)) == sorted((k, v) for k, v in expected.items() if 5 <= k < 21)
    assert list(s.keys(start=30)) == sorted(k for k in expected if k >= 30)
    assert list(s.values(end=0)) == ["neg"]
    _commit(backend, stores)
    assert list(s.items()) == sorted(expected.items())
    backend.close()


def test_scan_crosses_backend_batches(tmp_path: Path) -> None:
    backend = SqliteCheckpointStore(tmp_path / "c.db")
    stores, s = _store(backend, key_serde="int", value_serde="int", cache_size=10)
    s.put_all((k, k * k) for k in range(3000))
    _commit(backend, stores)
    assert list(s.items()) == [(k, k * k) for k in range(3000)]
    assert list(s.keys(1020, 1030)) == list(range(1020, 1030))
    backend.close()


def test_eviction_bounds_the_cache_and_reads_through(backend: CheckpointStore) -> None:
    # rule 29: more keys than cache.size; clean entries evicted, dirty ones kept until commit
    stores, s = _store(backend, key_serde="int", value_serde="int", cache_size=100)
    for k in range(1000):
        s[k] = k
    assert s.cached() == 1000  # dirty entries stay until their commit
    _commit(backend, stores)
    assert s.cached() <= 100
    for k in range(1000):
        s[k] = s[k] + 1  # each read of an evicted key goes to the backend
        if k % 100 == 99:
            _commit(backend, stores)
            assert s.cached() <= 100
    assert s.misses >= 900
    assert dict(s.items()) == {k: k + 1 for k in range(1000)}
    backend.close()


@pytest.mark.parametrize("size", [1, 3, 9, 100])
def test_clean_entries_never_exceed_cache_size_small_or_large(backend: CheckpointStore, size: int) -> None:
    # docs/state.md: clean entries are evicted beyond cache.size (a cache under 10 entries
    # held one more: its pass kept 90% of it, and the read that caused it came in on top)
    stores, s = _store(backend, key_serde="int", value_serde="int", cache_size=size)
    s.put_all((k, k) for k in range(300))
    _commit(backend, stores)
    for k in range(300):
        assert s.get(k) == k
        assert s.cached() <= size, (k, s.cached())
    backend.close()


def test_lru_keeps_recently_read_keys(backend: CheckpointStore) -> None:
    stores, s = _store(backend, key_serde="int", value_serde="int", cache_size=10)
    for k in range(10):
        s[k] = k
    _commit(backend, stores)
    for _ in range(5):
        for k in range(10, 40):
            s.get(0)  # key 0 stays hot
            s.get(k)
    misses = s.misses
    s.get(0)
    assert s.misses == misses  # still cached
    backend.close()


def test_hits_keep_recency_order_once_the_cache_is_half_full(backend: CheckpointStore) -> None:
    # a cache under half full keeps no recency order on hits (a hit is one lookup; nothing
    # is evicted before the cache fills); from half full on, a hit makes its key most recent
    _, s = _store(backend, key_serde="int", value_serde="int", cache_size=10)
    for k in range(4):
        s[k] = k
    s.get(0)
    assert list(s._entries) == [0, 1, 2, 3]
    s[4] = 4  # half full
    s.get(0)
    assert list(s._entries) == [1, 2, 3, 4, 0]
    backend.close()


def test_failed_commit_keeps_writes_dirty(tmp_path: Path) -> None:
    backend = SqliteCheckpointStore(tmp_path / "c.db")
    stores, s = _store(backend, cache_size=1)
    s["a"] = 1
    state = stores.begin_commit()
    assert state == {"s": {b'"a"': b"1"}}
    s["b"] = 2  # written while the commit is in flight
    stores.end_commit(False)
    assert s.dirty() == 2
    _commit(backend, stores)
    assert s.dirty() == 0
    assert backend.state_get("Partition 0", "s", b'"a"') == b"1"
    assert backend.state_get("Partition 0", "s", b'"b"') == b"2"
    backend.close()


def test_bad_keys_and_values_name_store_and_key(backend: CheckpointStore) -> None:
    _, s = _store(backend, key_serde="str", value_serde="int")
    with pytest.raises(SerdeError, match=r"store 's' of task 'Partition 0', key 5"):
        s[5] = 1  # type: ignore[index]
    with pytest.raises(SerdeError, match=r"store 's'.*key 'k'.*int"):
        s["k"] = "not an int"
    with pytest.raises(SerdeError, match=r"key 'k'.*2\*\*63"):
        s["k"] = 2**64
    _, j = _store_named(backend, "j")
    with pytest.raises(TypeError, match=r"store 'j'.*key \['list'\].*hashable"):
        j[["list"]] = 1
    with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
        j.get(["list"])
    with pytest.raises(SerdeError, match=r"store 's'"):
        s.get(b"bytes")  # type: ignore[arg-type]
    assert list(s.items()) == []  # nothing half-written
    backend.close()


def test_json_refuses_unencodable_values(backend: CheckpointStore) -> None:
    _, s = _store(backend)
    with pytest.raises(SerdeError, match=r"store 's' of task 'Partition 0', key 'k'.*json"):
        s["k"] = object()
    backend.close()


def test_concurrent_writers_from_threads(backend: CheckpointStore) -> None:
    # one lock per store: pool threads and callbacks may call it at once
    stores, s = _store(backend, key_serde="str", value_serde="int", cache_size=50)

    def writer(t: int) -> None:
        for i in range(2000):
            s[f"{t}-{i % 300}"] = i
            s.get(f"{(t + 1) % 4}-{i % 300}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    _commit(backend, stores)
    got = dict(s.items())
    assert got == {
        f"{t}-{j}": max(i for i in range(2000) if i % 300 == j) for t in range(4) for j in range(300)
    }
    backend.close()


class _SlowReads(MemoryCheckpointStore):
    """A memory backend whose reads take a while with the GIL released (as a network or
    disk read does), so that other threads run while a store holds its lock."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.read_done = 0.0

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        self.reading.set()
        time.sleep(0.05)
        data = super().state_get(task_name, store, key)
        self.read_done = time.monotonic()
        return data


def test_write_waits_for_a_read_through_of_the_same_key() -> None:
    # rule 25: a write from another thread while a miss reads the backend (lock held, GIL
    # released) waits for it: the read cannot overwrite the newer write in the cache
    backend = _SlowReads()
    stores, s = _store(backend, key_serde="str", value_serde="int")
    s["x"] = 1
    _commit(backend, stores)
    # a restarted task whose state does not fit its cache (one that fits is read whole at
    # the start): x is not cached
    stores = TaskStores("Partition 0", {"s": StoreSpec("str", "int", cache_size=1)}, backend, _impl[0])
    s = stores.get("s")
    reader = threading.Thread(target=s.get, args=("x",))
    reader.start()
    assert backend.reading.wait(5)
    s["x"] = 5  # waits for the reader's lock
    written = time.monotonic()
    reader.join()
    assert written >= backend.read_done > 0
    assert s["x"] == 5
    _commit(backend, stores)
    assert dict(s.items()) == {"x": 5}
    backend.close()


def test_store_lock_excludes_threads_that_release_the_gil() -> None:
    # the store's lock: holders sleep inside (GIL released), so waiters really wait
    _, s = _store(MemoryCheckpointStore())
    inside = [0]
    most = [0]
    count = [0]

    def worker() -> None:
        for i in range(200):
            with s._lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                if i % 20 == 0:
                    time.sleep(0.0005)  # GIL released with the lock held
                count[0] += 1
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    assert (most[0], count[0]) == (1, 1200)


# -- declaring stores ---------------------------------------------------------------------
def test_config_keys_and_errors() -> None:
    cfg = parse_config({"stores.a.key.serde": "str", "stores.a.cache.size": "10"}, stores={"b": {}})
    assert cfg.stores == {"a": StoreSpec("str", "json", 10), "b": StoreSpec()}
    assert parse_config(cfg.as_samza()).stores == cfg.stores
    with pytest.raises(ConfigError, match=r"stores\.a\.value\.serde.*unknown serde 'yaml'.*json, str"):
        parse_config({"stores.a.value.serde": "yaml"})
    with pytest.raises(ConfigError, match=r"stores\.a\.size.*unknown store option.*stores\.a\.cache\.size"):
        parse_config({"stores.a.size": 3})
    with pytest.raises(ConfigError, match=r"stores\.a\.cache\.size.*out of range"):
        parse_config({"stores.a.cache.size": 0})
    with pytest.raises(ConfigError, match=r"bad store name"):
        parse_config(stores={"a.b": {}})
    # one option given twice names both places it was given
    with pytest.raises(ConfigError, match=r"given twice \(as 'stores\.a\.cache\.size' and \"stores=\{'a'"):
        parse_config({"stores.a.cache.size": 10}, stores={"a": {"cache.size": 20}})


def test_async_commit_with_stores_is_refused() -> None:
    # rule 27: the project refuses task.async.commit with stores at start-up, naming both keys
    with pytest.raises(ConfigError, match=r"task\.async\.commit.*stores.*counts"):
        parse_config({"task.async.commit": True}, stores=["counts"])


class _Uses:
    name = "counts"

    def init(self, context: Any) -> None:
        self.store = context.store(self.name)

    def process(self, env: Any, collector: Any, coordinator: Any) -> None:
        pass


def test_unknown_store_name_is_a_clear_error(engine: str) -> None:
    class Other(_Uses):
        name = "nope"

    system = MemorySystem("mem").add_stream("in", [[1]])
    c = Container(Other, inputs=["mem.in"], systems=[system], engine=engine, stores=["counts"])
    with pytest.raises(Exception, match=r"task 'Partition 0' has no store 'nope'.*counts"):
        c.run()
    c = Container(Other, inputs=["mem.in"], systems=[system], engine=engine)
    with pytest.raises(Exception, match=r"no store 'nope'.*no stores declared"):
        c.run()


@pytest.mark.parametrize("value_serde", ["int", "str", "bytes", "json"])
def test_compiled_commit_encoding_gives_the_serdes_bytes(value_serde: str) -> None:
    # a commit's state is the serdes' encoding whichever path encodes it (rule 26)
    if not COMPILED:
        pytest.skip("tailrace._stores is not built")
    from tailrace._stores import ABSENT, Encoded, encode_changes
    from tailrace.serdes import serde

    kser, vser = serde("str"), serde(value_serde)
    values: dict[str, list[Any]] = {
        "int": [0, 1, -1, 2**63 - 1, -(2**63), 12345678901],
        "str": ["", "é", "abc"],
        "bytes": [b"", b"\x00x"],
        "json": [1, "a", None, 2.5],
    }
    entries: dict[Any, Any] = {f"k{i}é": v for i, v in enumerate(values[value_serde])}
    entries["gone"] = ABSENT
    entries["enc"] = Encoded(vser.encode(values[value_serde][0]))
    got = encode_changes(entries, dict.fromkeys(entries), kser._encode, vser._encode, "str", value_serde)
    assert got == {
        kser.encode(k): None if v is ABSENT else v.data if type(v) is Encoded else vser.encode(v)
        for k, v in entries.items()
    }


@pytest.mark.parametrize("key_serde", ["str", "json"])
@pytest.mark.parametrize("value_serde", ["int", "str", "bytes", "json", "pickle"])
def test_rows_encoding_gives_the_dict_encodings_bytes(key_serde: str, value_serde: str) -> None:
    # encode_rows (the commit writer's encoding for SQLite: one pass, no dict between) gives
    # the rows split_changes makes of encode_changes' dict, row for row, as bytearrays
    if not COMPILED:
        pytest.skip("tailrace._stores is not built")
    from tailrace._stores import ABSENT, Encoded, encode_changes, encode_rows, split_changes
    from tailrace.serdes import serde

    kser, vser = serde(key_serde), serde(value_serde)
    values: dict[str, list[Any]] = {
        "int": [0, 1, -1, 2**63 - 1, -(2**63), 12345678901],
        "str": ["", "é", "abc", "\u4e2d\U0001f600"],
        "bytes": [b"", b"\x00x", bytes(range(256))],
        "json": [1, "a", None, 2.5, {"n": [1, 2]}],
        "pickle": [1, "a", None, (1, 2), {"x": b"y"}],
    }
    entries: dict[Any, Any] = {f"k{i}é": v for i, v in enumerate(values[value_serde])}
    entries["gone"] = ABSENT
    entries["enc"] = Encoded(vser.encode(values[value_serde][0]))
    entries["also gone"] = ABSENT
    for yield_gil in (False, True):
        want = split_changes(
            encode_changes(entries, entries, kser._encode, vser._encode, key_serde, value_serde), yield_gil
        )
        got = encode_rows(entries, entries, kser._encode, vser._encode, key_serde, value_serde, yield_gil)
        assert got == want
        assert all(type(b) is bytearray for part in got for b in part)
        rows = EncodedRows(*got)
        assert len(rows) == len(entries)
        assert dict(rows) == {
            kser.encode(k): None if v is ABSENT else v.data if type(v) is Encoded else vser.encode(v)
            for k, v in entries.items()
        }


def test_encoded_rows_as_a_mapping() -> None:
    rows = EncodedRows(
        [bytearray(b"a"), bytearray(b"1"), bytearray(b"b"), bytearray(b"2")], [bytearray(b"c")]
    )
    assert len(rows) == 3 and rows[b"a"] == b"1" and rows[b"c"] is None
    assert dict(rows) == {b"a": b"1", b"b": b"2", b"c": None}
    assert type(next(iter(rows))) is bytes
    with pytest.raises(KeyError):
        rows[b"zz"]
    assert "2 puts, 1 deletes" in repr(rows)
    # one key written twice (two Python keys that encode alike): the later row wins
    assert dict(EncodedRows([bytearray(b"k"), bytearray(b"1"), bytearray(b"k"), bytearray(b"2")], [])) == {
        b"k": b"2"
    }


def test_sqlite_writes_the_commit_writers_rows_as_it_writes_a_dict(tmp_path: Path) -> None:
    # the commit writer hands SQLite (takes_rows) EncodedRows; the rows it writes and the
    # deletes it applies are those of the same changes as a dict, scope by scope
    assert SqliteCheckpointStore.takes_rows and not MemoryCheckpointStore.takes_rows
    ssp = SystemStreamPartition("mem", "in", 0)
    read: list[dict[bytes, bytes]] = []
    for rows in (False, True):
        backend = SqliteCheckpointStore(tmp_path / f"rows-{rows}.db")
        backend.open("job")
        stores = TaskStores(
            "Partition 0", {"s": StoreSpec("str", "int"), "t": StoreSpec()}, backend, _impl[0]
        )
        s, t = stores.get("s"), stores.get("t")
        for i in range(5000):
            s[f"k{i}"] = i
        t["x"] = {"deep": [1, 2]}
        backend.write("Partition 0", {ssp: 1}, stores.encode(stores.snapshot(), rows=rows))
        stores.end_commit(True)
        for i in range(0, 5000, 3):
            del s[f"k{i}"]
        s["new"] = -1
        state = stores.encode(stores.snapshot(), rows=rows)
        assert all(isinstance(c, EncodedRows) == rows for c in state.values())
        backend.write("Partition 0", {ssp: 2}, state)
        stores.end_commit(True)
        read.append(
            {b"s:" + k: v for k, v in backend.state_scan("Partition 0", "s")}
            | {b"t:" + k: v for k, v in backend.state_scan("Partition 0", "t")}
        )
        assert backend.load("Partition 0") == {ssp: 2}
        backend.close()
    assert read[0] == read[1]
    assert len(read[0]) == 5000 - 1667 + 1 + 1


def test_miss_of_a_fresh_store_checks_the_key(backend: CheckpointStore) -> None:
    # a fresh store answers misses from its cache; a key the serde refuses is still refused
    _, s = _store(backend, key_serde="str", value_serde="int")
    assert s.get("a") is None and s.misses == 1
    with pytest.raises(SerdeError, match=r"store 's'.*key '\\ud800'"):
        s.get("\ud800")
    assert "a" not in s and s.misses == 1  # cached as absent: no second miss
    backend.close()


@pytest.mark.parametrize("key_serde", ["json", "msgpack"])
def test_tuple_keys_read_back_as_tuples_committed_or_not(backend: CheckpointStore, key_serde: str) -> None:
    # docs/state.md: a scan returned uncommitted tuple keys as tuples and committed ones as
    # lists (the serde's arrays), and a list is no key: `for k in store: store[k]` failed
    if key_serde == "msgpack":
        pytest.importorskip("msgpack")
    stores, s = _store(backend, key_serde=key_serde)
    s[("a", 1)] = 1
    s[("b", (2, 3))] = 2
    _commit(backend, stores)
    s[("c", 4)] = 3  # not committed
    assert list(s.keys()) == [("a", 1), ("b", (2, 3)), ("c", 4)]
    assert {k: s[k] for k in s} == {("a", 1): 1, ("b", (2, 3)): 2, ("c", 4): 3}
    backend.close()  # a restart: the committed keys come from the backend only
    stores, s = _store(backend, key_serde=key_serde)
    assert {k: s[k] for k in s} == {("a", 1): 1, ("b", (2, 3)): 2}
    backend.close()


def test_stores_work_without_the_compiled_module(tmp_path: Path) -> None:
    # a build without tailrace._stores falls back to the pure-Python twin: the module imports
    # (its two pure-Python classes once had no consistent MRO there) and a job keeps state
    code = textwrap.dedent(
        """
        import sys, importlib.abc

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "tailrace._stores":
                    raise ImportError("blocked by the test")

        sys.meta_path.insert(0, Block())
        import tailrace
        from tailrace.sqlite import SqliteCheckpointStore
        from tailrace.stores import COMPILED

        class Count(tailrace.StreamTask):
            def init(self, context):
                self.counts = context.store("counts")

            def process(self, envelope, collector, coordinator):
                w = envelope.message
                self.counts[w] = self.counts.get(w, 0) + 1

        for run in range(2):
            mem = tailrace.MemorySystem("mem").add_stream("in", [["a", "b", "a"] * (run + 1)])
            c = tailrace.Container(Count, inputs=["mem.in"], systems=[mem],
                                   checkpoints=SqliteCheckpointStore(sys.argv[1]), stores=["counts"])
            c.run()
        store = SqliteCheckpointStore(sys.argv[1])
        store.open("tailrace-job")
        print(COMPILED, sorted(store.state_scan("Partition 0", "counts")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c.db")], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    # run 1: a a b; run 2 resumes after offset 2 and reads a b a (offsets 3..5)
    assert out.stdout.strip() == "False [(b'\"a\"', b'4'), (b'\"b\"', b'2')]"


def test_the_undo_journal_puts_back_what_an_invocation_wrote(backend: CheckpointStore) -> None:
    # rule 39: the engines bind a journal around a sync invocation; journal_undo puts every key
    # it wrote back, whatever was cached, dirty or committed before, and a get before a write
    # (its entry remembered) never stands for a write made while no journal was bound
    from tailrace.stores import Journal, journal_bind, journal_undo

    stores, s = _store(backend)
    s["committed"] = 1
    s["gone"] = 9
    _commit(backend, stores)
    s["dirty"] = 2
    journal = Journal()
    journal_bind(journal)
    try:
        assert s.get("later") is None  # remembered, then written unbound below
        journal_bind(None)
        s["later"] = 5
        journal_bind(journal)
        mark = len(journal)
        s["committed"] = s["committed"] + 10
        s["dirty"] = s["dirty"] + 10
        s["new"] = 3
        s["later"] = 6
        s.put_all({"new": 4, "other": 7})
        del s["gone"]
        s.delete_all(["committed"])
        assert journal_undo(journal, mark) == 8
    finally:
        journal_bind(None)
    assert len(journal) == 0
    assert {k: s.get(k) for k in ("committed", "dirty", "new", "later", "other", "gone")} == {
        "committed": 1,
        "dirty": 2,
        "new": None,
        "later": 5,
        "other": None,
        "gone": 9,
    }
    _commit(backend, stores)
    _, s2 = _store_named(backend, "s")
    assert {k: s2.get(k) for k in ("committed", "dirty", "new", "later", "other", "gone")} == {
        "committed": 1,
        "dirty": 2,
        "new": None,
        "later": 5,
        "other": None,
        "gone": 9,
    }


def test_unhashable_keys_refused_on_every_path_with_a_journal_bound(backend: CheckpointStore) -> None:
    # the compiled hot paths check a key's hash before any dict operation (they have no
    # try): an unhashable key gets the store's TypeError on each of them, with or without
    # an undo journal bound, and a __hash__ that raises something else is not renamed
    from tailrace.stores import Journal, journal_bind

    class BadHash:
        def __hash__(self) -> int:
            raise ValueError("no hash today")

    backend.open("job")
    _, j = _store_named(backend, "j")
    j["ok"] = 1
    for journal in (None, Journal()):
        journal_bind(journal)
        try:
            with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
                j.get(["list"])
            with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
                j.put(["list"], 1)
            with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
                j[{"a": 1}] = 1
            with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
                j[["list"]]
            with pytest.raises(TypeError, match=r"store 'j'.*hashable"):
                ["list"] in j  # noqa: B015 - the check is the point
            with pytest.raises(ValueError, match="no hash today"):
                j.get(BadHash())
            with pytest.raises(ValueError, match="no hash today"):
                j[BadHash()] = 2
            if journal is not None:
                assert len(journal) == 0  # nothing refused was recorded
        finally:
            journal_bind(None)
    assert dict(j.items()) == {"ok": 1}  # the lock was released each time, nothing written
    j["ok"] = 3
    assert j["ok"] == 3
    backend.close()


def test_store_methods_are_the_subclass_own_and_a_further_subclass_works(backend: CheckpointStore) -> None:
    # KeyValueStore has its own descriptors of the compiled get/put (the interpreter
    # specializes calls of a method descriptor only for its exact type); a subclass of
    # KeyValueStore still gets the same methods through the generic call path
    if _impl[0] is KeyValueStore and COMPILED:
        for name in ("get", "put"):
            d = KeyValueStore.__dict__[name]
            assert type(d).__name__ == "method_descriptor"
            assert d.__objclass__ is KeyValueStore
            assert d.__doc__
    sub = type("SubStore", (_impl[0],), {})
    backend.open("job")
    stores = TaskStores("Partition 0", {"s": StoreSpec(key_serde="str", value_serde="int")}, backend, sub)
    s = stores.get("s")
    assert type(s) is sub
    s.put("a", 1)
    s["b"] = s.get("a", 0) + 1
    assert (s.get("a"), s["b"], s.get("c", 7)) == (1, 2, 7)
    with pytest.raises(TypeError, match=r"store 's'.*hashable"):
        s.get(["list"])
    _commit(backend, stores)
    assert backend.state_get("Partition 0", "s", b"b") is not None
    backend.close()
