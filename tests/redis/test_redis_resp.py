"""The RESP2 fast path (tailrace.redis._resp, RespConnection) against a real redis-server.

Every XREAD reply decoded from raw socket bytes must equal what redis-py's own
parsing gives (the path the cluster and TLS still take), whatever the reply's
shape and however the bytes arrive.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from redis_support import RedisServer, free_port

from tailrace.redis import _resp
from tailrace.redis._io import RespConnection
from tailrace.redis.system import _KINDS, RedisSystem, _decode_reply, _decoder
from tailrace.types import BadInput, SystemStreamPartition


def _conn(system: RedisSystem) -> RespConnection:
    params = RespConnection.usable_for(system.client)
    assert params is not None  # a unix-socket server: the fast path applies
    return RespConnection(params)


def _comparable(decoded: list[Any]) -> list[Any]:
    """Decoded streams with bad entries' messages as (exception type, text, bytes): comparable."""
    out = []
    for key, ids, keys, messages, eos, bad in decoded:
        shown = [(type(m.error), str(m.error), m.raw) if isinstance(m, BadInput) else m for m in messages]
        out.append((key, ids, keys, shown, eos, bad))
    return out


class _Trickle:
    """A real socket whose reads return at most ``chunk`` bytes."""

    def __init__(self, sock: Any, chunk: int) -> None:
        self.sock = sock
        self.chunk = chunk
        self.reads = 0

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_into(self, view: Any) -> int:
        self.reads += 1
        return int(self.sock.recv_into(view, self.chunk))

    def close(self) -> None:
        self.sock.close()


def _xread_both(system: RedisSystem, streams: dict[str, str], count: int, chunk: int | None = None) -> Any:
    """The same XREAD through RespConnection and through redis-py, both decoded."""
    args = ("XREAD", "COUNT", count, "STREAMS", *streams.keys(), *streams.values())
    conn = _conn(system)
    conn.connect()
    trickle = None
    if chunk is not None:  # the same socket, read at most `chunk` bytes at a time
        conn._sock = trickle = _Trickle(conn._sock, chunk)  # type: ignore[assignment]
    conn.send_packed_command(_resp.pack(args))
    fast = conn.read_xread(_KINDS[system.codec], _decoder(system.codec))
    if trickle is not None:
        assert trickle.reads > 1000  # the reply really came in pieces
    conn.disconnect()
    slow = _decode_reply(system.client.execute_command(*args), _decoder(system.codec))
    return fast, slow


@pytest.mark.parametrize("codec", ["json", "str", "bytes"])
def test_xread_replies_decode_as_redis_py_parses_them_keys_end_markers_and_bad_entries(
    redis_server: RedisServer, codec: str
) -> None:
    system = RedisSystem("redis", redis_server.url, codec=codec)
    c = system.client
    a, b, e = system.keys.stream("s", 0), system.keys.stream("s", 1), system.keys.stream("s", 2)
    c.xadd(a, {"m": json.dumps({"i": 0})})
    c.xadd(a, {"k": json.dumps("key é"), "m": json.dumps({"i": 1})})  # key first, then message
    c.xadd(a, {"m": json.dumps("ünï"), "k": json.dumps([1, 2]), "x": "ignored"})
    c.xadd(a, {"eos": "1"})
    c.xadd(a, {"m": json.dumps("after the end")})  # never delivered
    c.xadd(b, {"m": json.dumps(2)})
    c.xadd(b, {"m": b"\xff not utf-8 nor json"})  # a bad entry keeps its place, the rest go on
    c.xadd(b, {"m": json.dumps(3)})
    c.xadd(b, {"m": json.dumps(4), "k": b"\xff{"})  # a key that cannot be decoded
    c.xadd(e, {"k": json.dumps("no message")})  # no field m: a bad entry
    fast, slow = _xread_both(system, {a: "0-0", b: "0-0", e: "0-0"}, 100)
    assert fast is not None and _comparable(fast) == _comparable(slow)
    by_key = {k.decode(): (ids, keys, messages, eos, err) for k, ids, keys, messages, eos, err in fast}
    ids, keys, messages, eos, bad = by_key[a]
    assert len(ids) == 3 and eos and bad is None
    if codec == "json":
        assert keys == [None, "key é", [1, 2]] and messages == [{"i": 0}, {"i": 1}, "ünï"]
    else:
        assert keys[0] is None and len(messages) == 3
    ids, keys, messages, eos, bad = by_key[b]
    assert not eos and ids == [x[0].decode() for x in c.xrange(b)]  # every entry, in its place
    if codec == "bytes":  # bytes decode anything
        assert bad is None and messages == [b"2", b"\xff not utf-8 nor json", b"3", b"4"]
        assert keys[3] == b"\xff{"
    else:  # the bad entries as BadInput (the decoder's error, the bytes of field m)
        assert bad == [(1, "m"), (3, "k")] and keys[1] is keys[3] is None
        assert isinstance(messages[1], BadInput) and isinstance(messages[1].error, ValueError)
        assert messages[1].raw == b"\xff not utf-8 nor json"
        assert isinstance(messages[3], BadInput) and messages[3].raw == json.dumps(4).encode()
        assert messages[2] == (3 if codec == "json" else "3")
    ids, keys, messages, eos, bad = by_key[e]
    assert len(ids) == 1 and bad == [(0, "m")] and isinstance(messages[0], BadInput)
    assert isinstance(messages[0].error, KeyError) and messages[0].raw is None
    system.close()


def test_large_replies_arriving_a_few_bytes_at_a_time_decode_whole(redis_server: RedisServer) -> None:
    system = RedisSystem("redis", redis_server.url, codec="str")
    keys = [system.keys.stream("big", p) for p in range(3)]
    pipe = system.client.pipeline(transaction=False)
    for p, key in enumerate(keys):
        for i in range(3000):
            pipe.xadd(key, {"m": f"{p}:{i}:" + "x" * (i % 200)})
        pipe.xadd(key, {"m": "y" * 1_000_000, "k": "huge"})  # one 1 MB message
    pipe.execute()
    fast, slow = _xread_both(system, dict.fromkeys(keys, "0-0"), 5000)
    assert fast is not None and _comparable(fast) == _comparable(slow)
    assert [len(ids) for _, ids, _, _, _, _ in fast] == [3001] * 3
    assert fast[1][3][7] == "1:7:" + "x" * 7 and fast[2][3][-1] == "y" * 1_000_000
    small = {k: ids[2990] for k, (_, ids, *_rest) in zip(keys, fast)}
    trickled, slow = _xread_both(system, small, 5000, chunk=7)  # 7 bytes per read: splits everywhere
    assert trickled is not None and _comparable(trickled) == _comparable(slow)
    assert [len(ids) for _, ids, _, _, _, _ in trickled] == [10] * 3
    system.close()


def test_error_replies_raise_redis_py_exceptions_and_the_connection_goes_on(
    redis_server: RedisServer,
) -> None:
    import redis

    system = RedisSystem("redis", redis_server.url)
    system.client.set("plain", "not a stream")
    conn = _conn(system)
    conn.send_command("XREAD", "COUNT", 10, "STREAMS", "plain", "0-0")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        conn.read_xread(_resp.STR, None)
    conn.send_command("EVALSHA", "0" * 40, 0)
    with pytest.raises(redis.exceptions.NoScriptError):
        conn.read_response()
    conn.send_command("XREAD", "COUNT", 10, "BLOCK", 10, "STREAMS", "nothing", "0-0")
    assert conn.read_xread(_resp.STR, None) is None  # timed out: nil reply
    conn.send_command("SET", "k", b"v\r\n with CRLF")
    assert conn.read_response() == b"OK"
    conn.send_command("MGET", "k", "missing", "k")
    assert conn.read_response() == [b"v\r\n with CRLF", None, b"v\r\n with CRLF"]
    conn.send_command("INCRBY", "n", -5)
    assert conn.read_response() == -5
    conn.disconnect()
    system.close()


def test_a_killed_connection_raises_connection_error_and_the_next_command_reconnects(
    redis_server: RedisServer,
) -> None:
    import redis

    system = RedisSystem("redis", redis_server.url)
    conn = _conn(system)
    conn.send_command("CLIENT", "SETNAME", "victim")
    assert conn.read_response() == b"OK"
    victim = [c["id"] for c in system.client.client_list() if c["name"] == "victim"]
    assert len(victim) == 1 and system.client.client_kill_filter(_id=victim[0]) == 1
    with pytest.raises(redis.exceptions.ConnectionError):  # on writing or on reading
        conn.send_command("PING")
        conn.read_response()
    assert conn._sock is None  # dropped: a half-read reply is never read as the next one
    conn.send_command("PING")  # a new socket
    assert conn.read_response() == b"PONG"
    conn.disconnect()
    system.close()


def test_auth_and_db_of_the_url_apply_to_the_fast_path(tmp_path: Path) -> None:
    import redis

    server = RedisServer(tmp_path / "auth").start()
    try:
        with server.client() as c:
            c.config_set("requirepass", "s3cret")
        url = f"unix://{server.sock}?db=3&password=s3cret"
        system = RedisSystem("redis", url, codec="str", output_partitions=2, batch=10)
        assert RespConnection.usable_for(system.client) is not None
        producer = system.producer()
        producer.partitions("out")
        for i in range(25):
            producer.send("out", i % 2, f"k{i}" if i % 3 else None, f"m{i}")
        producer.flush()
        with redis.Redis(unix_socket_path=server.sock, password="s3cret", db=3) as c:
            assert c.xlen(system.keys.stream("out", 0)) == 13  # written to db 3
        system.end_stream("out")
        reader = system.reader(SystemStreamPartition("redis", "out", 1))
        woken = threading.Event()
        reader.start(None, woken.set)
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while not reader.at_end() and time.monotonic() < deadline:
            got += reader.poll(100)
            woken.wait(0.05)
            woken.clear()
        reader.close()
        assert [(e.key, e.message) for e in got] == [
            (f"k{i}" if i % 3 else None, f"m{i}") for i in range(1, 25, 2)
        ]
        producer.close()
        system.close()
        params = RespConnection.usable_for(redis.Redis.from_url(url.replace("s3cret", "wrong")))
        assert params is not None
        bad = RespConnection(params)
        with pytest.raises(redis.exceptions.AuthenticationError):
            bad.connect()
        assert bad._sock is None
    finally:
        server.kill()


def test_a_fetcher_whose_connection_is_killed_mid_run_loses_and_repeats_nothing(
    redis_server: RedisServer,
) -> None:
    system = RedisSystem("redis", redis_server.url, codec="str", batch=50, buffer=100)
    system.create_stream("in", 2)
    pipe = system.client.pipeline(transaction=False)
    for p in range(2):
        for i in range(2000):
            pipe.xadd(system.keys.stream("in", p), {"m": f"{p}:{i}"})
    pipe.execute()
    system.end_stream("in")
    woken = threading.Event()
    readers = [system.reader(SystemStreamPartition("redis", "in", p)) for p in range(2)]
    for r in readers:
        r.start(None, woken.set)
    got: dict[int, list[str]] = {0: [], 1: []}
    kills = 0
    deadline = time.monotonic() + 30
    while not all(r.at_end() for r in readers) and time.monotonic() < deadline:
        for p, r in enumerate(readers):
            got[p] += [e.message for e in r.poll(30)]
        if kills < 5 and len(got[0]) > 300 * (kills + 1):
            for c in system.client.client_list():
                if c["cmd"] == "xread":
                    kills += system.client.client_kill_filter(_id=c["id"])
        woken.wait(0.01)
        woken.clear()
    for r in readers:
        r.close()
    assert kills >= 1
    for p in range(2):
        assert got[p] == [f"{p}:{i}" for i in range(2000)]  # in order, nothing lost or repeated
    system.close()


def test_batch_encodes_every_codec_and_a_value_it_cannot_encode_changes_nothing(
    redis_server: RedisServer,
) -> None:
    system = RedisSystem("redis", redis_server.url, codec="json", output_partitions=1)
    producer = system.producer()
    producer.partitions("out")
    producer.send("out", 0, ("tuple", "key"), {"a": [1, 2.5, None, "é"]})
    with pytest.raises(TypeError):
        producer.send("out", 0, None, object())  # not JSON: raised, nothing appended
    with pytest.raises(TypeError):
        producer.send("out", 0, object(), "fine message, bad key")
    producer.send("out", 0, None, "last")
    producer.flush()
    assert [(k, m) for _, k, m in system.read_all("out", 0)] == [
        (["tuple", "key"], {"a": [1, 2.5, None, "é"]}),
        (None, "last"),
    ]
    producer.close()
    system.close()
    for codec, values, expected in (
        ("str", ["s", b"b", 5, 1.5, "\u00e9"], ["s", "b", "5", "1.5", "\u00e9"]),
        ("bytes", [b"\xff\x00", "s", 5], [b"\xff\x00", b"s", b"5"]),
    ):
        system = RedisSystem("redis", redis_server.url, codec=codec, output_partitions=1)
        system.client.delete(system.keys.stream(codec, 0))
        producer = system.producer()
        for v in values:
            producer.send(codec, 0, v, v)
        producer.close()
        assert [(k, m) for _, k, m in system.read_all(codec, 0)] == list(zip(expected, expected))
        system.close()


def test_replies_reject_bytes_that_are_not_resp() -> None:
    class Bytes:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def recv_into(self, view: Any) -> int:
            n = min(len(view), len(self.data))
            view[:n] = self.data[:n]
            self.data = self.data[n:]
            return n

    for bad in (b"?what\r\n", b"$abc\r\nxyz\r\n", b"$3\r\nabcde\r\n", b"*1\r\n!x\r\n"):
        replies = _resp.Replies()
        replies.feed(Bytes(bad))
        with pytest.raises(_resp.ProtocolError):
            replies.ready()
    replies = _resp.Replies()
    source = Bytes(b"*2\r\n:1\r\n")
    replies.feed(source)
    assert not replies.ready()  # half a reply: wait for more
    source.data = b"$2\r\nhi\r\n+OK\r\n"
    replies.feed(source)
    assert replies.ready() and replies.reply() == [1, b"hi"]
    assert replies.ready() and replies.reply() == b"OK" and replies.buffered == 0
    # an entry with an odd field count (no real server sends one) is a bad entry, and
    # the rest of the reply still decodes in step
    odd = b"*2\r\n$3\r\n1-1\r\n*3\r\n$1\r\nm\r\n$1\r\nx\r\n$1\r\nk\r\n"
    ok = b"*2\r\n$3\r\n2-1\r\n*2\r\n$1\r\nm\r\n$1\r\ny\r\n"
    replies.feed(Bytes(b"*2\r\n*2\r\n$1\r\na\r\n*1\r\n" + odd + b"*2\r\n$1\r\nb\r\n*1\r\n" + ok))
    assert replies.ready()
    (a, a_ids, _, a_messages, _, a_bad), (b, b_ids, _, b_messages, _, b_bad) = replies.xread(_resp.STR) or []
    assert a == b"a" and a_ids == ["1-1"] and a_bad == [(0, "m")]
    assert isinstance(a_messages[0], BadInput) and isinstance(a_messages[0].error, KeyError)
    assert (b, b_ids, b_messages, b_bad) == (b"b", ["2-1"], ["y"], None)
    with pytest.raises(TypeError):
        _resp.pack(["SET", object()])
    packed = b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$1\r\n7\r\n$3\r\n1.5\r\n"
    assert _resp.pack(["SET", "k", b"v", 7, 1.5]) == packed


def test_tls_and_cluster_clients_keep_the_redis_py_path(redis_server: RedisServer) -> None:
    import redis

    assert RespConnection.usable_for(redis.Redis.from_url("rediss://127.0.0.1:1/0")) is None
    assert RespConnection.usable_for(redis.Redis.from_url("redis://127.0.0.1:1/0")) is not None
    assert RespConnection.usable_for(object()) is None  # no connection pool (a cluster client)


def test_the_fast_path_over_tcp_writes_and_reads_what_redis_py_sees(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "tcp", port=free_port()).start()
    try:
        system = RedisSystem("redis", server.url, codec="str", output_partitions=3, batch=7)
        params = RespConnection.usable_for(system.client)
        assert params is not None and params["port"] == server.port
        producer = system.producer()
        producer.partitions("out")
        for i in range(50):
            producer.send("out", i % 3, None, f"m{i}")
        producer.close()
        keys = {system.keys.stream("out", p): "0-0" for p in range(3)}
        fast, slow = _xread_both(system, keys, 100)
        assert fast is not None and _comparable(fast) == _comparable(slow)
        assert [messages for _, _, _, messages, _, _ in fast] == [
            [f"m{i}" for i in range(p, 50, 3)] for p in range(3)
        ]
        system.close()
    finally:
        server.kill()


def test_a_standalone_client_redis_py_must_serve_takes_the_redis_py_path_with_the_same_results(
    tmp_path: Path,
) -> None:
    # a credential provider (like TLS) keeps the fetcher and the producer on redis-py's
    # connections; the batch encoding, the decoding and the results are the same
    import redis

    server = RedisServer(tmp_path / "cred").start()
    try:
        with server.client() as c:
            c.config_set("requirepass", "s3cret")
        provider = redis.UsernamePasswordCredentialProvider(password="s3cret")
        client = redis.Redis(unix_socket_path=server.sock, credential_provider=provider)
        system = RedisSystem("redis", server.url, codec="json", output_partitions=2, batch=5, client=client)
        assert RespConnection.usable_for(client) is None
        system.create_stream("in", 2)
        producer = system.producer()
        for i in range(12):
            producer.send("in", i % 2, None if i % 3 else f"k{i}", {"i": i})
        producer.close()
        assert producer.sent == 12
        system.end_stream("in")
        readers = [system.reader(SystemStreamPartition("redis", "in", p)) for p in range(2)]
        woken = threading.Event()
        for r in readers:
            r.start(None, woken.set)
        got: dict[int, list[Any]] = {0: [], 1: []}
        deadline = time.monotonic() + 10
        while not all(r.at_end() for r in readers) and time.monotonic() < deadline:
            for p, r in enumerate(readers):
                got[p] += r.poll(100)
            woken.wait(0.05)
            woken.clear()
        for r in readers:
            r.close()
        for p in range(2):
            assert [(e.key, e.message) for e in got[p]] == [
                (None if i % 3 else f"k{i}", {"i": i}) for i in range(p, 12, 2)
            ]
        system.close()
        client.close()
    finally:
        server.kill()
