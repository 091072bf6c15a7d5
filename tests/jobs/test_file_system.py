"""The file system: partition files, byte offsets, seeking restarts, bad input, fsynced outputs."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tailrace.errors import ConfigError, InputError
from tailrace.files import FileReader, FileSystem, read_stream, write_stream
from tailrace.types import BadInput, SystemStreamPartition

SSP0 = SystemStreamPartition("files", "s", 0)


def bad_line(got: list[Any]) -> InputError:
    """The error of the one unreadable line among ``got`` (rule 39: the reader yields it in
    its place, as an envelope whose message is a BadInput, and reads on)."""
    bad = [e for e in got if isinstance(e.message, BadInput)]
    assert len(bad) == 1, got
    error = bad[0].message.error
    assert isinstance(error, InputError)
    return error


def drain(reader: FileReader, after: Any = None, batch: int = 7) -> list[Any]:
    """Start a reader and poll it to the end like an engine would (an empty poll before
    the end waits for wakeup, rule 6)."""
    woken = threading.Event()
    reader.start(after, woken.set)
    out = []
    try:
        while not reader.at_end():
            got = reader.poll(batch)
            assert len(got) <= batch
            if not got:
                assert woken.wait(10), "reader never called wakeup after an empty poll"
                woken.clear()
            out.extend(got)
    finally:
        reader.close()
    return out


def make(tmp_path: Path, partitions: list[list[Any]], fmt: str = "jsonl", **kw: Any) -> FileSystem:
    write_stream(tmp_path / "in" / "s", partitions, fmt)
    return FileSystem("files", tmp_path / "in", output_path=tmp_path / "out", **kw)


def test_offsets_are_line_start_bytes_and_order_is_kept(tmp_path: Path) -> None:
    msgs = [{"seq": i, "pad": "x" * (i % 13)} for i in range(5000)]
    fs = make(tmp_path, [msgs, msgs[:3]])
    offsets = write_stream(tmp_path / "in" / "s", [msgs, msgs[:3]])
    assert fs.partitions("s") == 2
    got = drain(fs.reader(SSP0))  # type: ignore[arg-type]
    assert [e.message for e in got] == msgs
    assert [e.offset for e in got] == offsets[0]
    raw = (tmp_path / "in" / "s" / "partition-0.jsonl").read_bytes()
    for e in got[:50]:
        line = raw[e.offset :].split(b"\n", 1)[0]
        assert json.loads(line) == e.message
    assert {e.ssp for e in got} == {SSP0}


def test_restart_seeks_after_committed_offset(tmp_path: Path) -> None:
    msgs = [f"line {i}" for i in range(100)]
    fs = make(tmp_path, [msgs], fmt="text")
    offsets = write_stream(tmp_path / "in" / "s", [msgs], "text")
    for k in (0, 1, 50, 98, 99):
        got = drain(fs.reader(SSP0), after=offsets[0][k])  # type: ignore[arg-type]
        assert [e.message for e in got] == msgs[k + 1 :]
        assert [e.offset for e in got] == offsets[0][k + 1 :]


def test_committed_offset_that_is_not_a_line_start_is_refused(tmp_path: Path) -> None:
    fs = make(tmp_path, [["abc", "def"]], fmt="text")
    r = fs.reader(SSP0)
    with pytest.raises(InputError, match=r"partition-0.txt: committed offset 2 is not the start of a line"):
        r.start(2, lambda: None)
    with pytest.raises(InputError, match="beyond the end of the file"):
        fs.reader(SSP0).start(100, lambda: None)
    with pytest.raises(InputError, match="not a file offset"):
        fs.reader(SSP0).start("1-0", lambda: None)


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    (d / "partition-0.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": oops}\n{"a": 4}\n')
    fs = FileSystem("files", tmp_path / "in")
    got = drain(fs.reader(SSP0))
    error = bad_line(got)
    assert re.search(r"partition-0.jsonl:3: line is not valid JSON", str(error)), error
    assert error.line == 3
    assert [e.offset for e in got] == [0, 9, 18, 30]  # in its place; the line after it is read
    assert got[2].message.raw == b'{"a": oops}'
    # resumed after line 2 (line numbers still exact, counted on the error path)
    assert "partition-0.jsonl:3:" in str(bad_line(drain(fs.reader(SSP0), after=len('{"a": 1}\n'))))


def test_skip_bad_lines_counts_and_continues(tmp_path: Path) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    (d / "partition-0.jsonl").write_bytes(b'{"a": 1}\nnot json\n{"a": 3}\n\xff\xfe\n{"a": 5}')
    fs = FileSystem("files", tmp_path / "in", skip_bad_lines=True)
    r = fs.reader(SSP0)
    got = drain(r)  # type: ignore[arg-type]
    assert [e.message for e in got] == [{"a": 1}, {"a": 3}, {"a": 5}]  # last line has no newline
    assert r.skipped() == 2


def test_text_lines_with_bad_utf8_fail_clearly(tmp_path: Path) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    (d / "partition-0.txt").write_bytes(b"ok\r\nbad \xff\n")
    fs = FileSystem("files", tmp_path / "in")
    assert "partition-0.txt:2: line is not valid UTF-8" in str(bad_line(drain(fs.reader(SSP0))))


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (["partition-0.jsonl", "partition-2.jsonl"], "partition gap: partition-1.jsonl missing"),
        (["partition-0.jsonl", "partition-1.txt"], "mixes .jsonl and .txt"),
        (["partition-0.jsonl", "notes.md"], "unexpected file 'notes.md'"),
        (["partition-01.jsonl"], "unexpected file 'partition-01.jsonl'"),
        ([], "no partition files"),
    ],
)
def test_stream_layout_errors(tmp_path: Path, files: list[str], error: str) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    for f in files:
        (d / f).write_text("1\n")
    with pytest.raises(InputError, match=error):
        FileSystem("files", tmp_path / "in").partitions("s")


def test_missing_directory_and_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"does not exist"):
        FileSystem("files", tmp_path / "nope").partitions("s")
    fs = make(tmp_path, [[1, 2]])
    with pytest.raises(InputError, match=r"in/t: stream directory does not exist"):
        fs.partitions("t")
    r = fs.reader(SSP0)
    (tmp_path / "in" / "s" / "partition-0.jsonl").unlink()
    with pytest.raises(InputError, match=r"partition-0.jsonl: partition file does not exist"):
        r.start(None, lambda: None)


def test_read_ahead_bounds_each_poll(tmp_path: Path) -> None:
    # rule 6: the reader decodes only what a poll asks for (at most read_ahead messages)
    fs = make(tmp_path, [list(range(1000))], read_ahead=10)
    r = fs.reader(SSP0)
    r.start(None, lambda: None)
    try:
        seen: list[int] = []
        while not r.at_end():
            got = r.poll(1000)
            assert 0 < len(got) <= 10, "a poll returned nothing before the end, or more than read_ahead"
            seen.extend(e.message for e in got)
        assert seen == list(range(1000))
        assert r.poll(10) == []
    finally:
        r.close()


def test_reader_runs_on_the_callers_thread_and_holds_one_chunk(tmp_path: Path) -> None:
    # no thread per partition (issue 18): reading happens inside poll, on the engine's
    # loop thread, and an unpolled reader holds at most one chunk of raw bytes
    msgs = [{"seq": i, "pad": "y" * 100} for i in range(20000)]  # ~2.4 MB
    fs = make(tmp_path, [msgs], read_ahead=100)
    r = fs.reader(SSP0)
    before = threading.active_count()
    r.start(None, lambda: None)
    try:
        assert threading.active_count() == before
        assert len(r.poll(5)) == 5
        assert threading.active_count() == before
        held = len(r._data) + len(r._tail)  # the chunk (its tail included) and the tail
        assert held <= 2 * (1 << 16)
        assert [e.message for e in r.poll(100)] == msgs[5:105]
    finally:
        r.close()
    assert r.at_end() and r.poll(5) == []  # closed: no more reads


def test_lines_longer_than_a_chunk_crlf_and_no_final_newline(tmp_path: Path) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    big = "z" * 200_000  # spans several read chunks
    raw = (json.dumps({"a": big}) + "\r\n" + json.dumps({"b": 1}) + "\n\n" + '"last"').encode()
    (d / "partition-0.jsonl").write_bytes(raw.replace(b"\n\n", b"\n"))
    fs = FileSystem("files", tmp_path / "in")
    got = drain(fs.reader(SSP0), batch=1)
    assert [e.message for e in got] == [{"a": big}, {"b": 1}, "last"]
    data = (d / "partition-0.jsonl").read_bytes()
    assert [e.offset for e in got] == [0, data.index(b'{"b"'), data.index(b'"last"')]


def test_bad_line_number_is_exact_across_chunks_and_after_a_resume(tmp_path: Path) -> None:
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    lines = [json.dumps({"seq": i, "pad": "p" * 50}) for i in range(9000)]
    lines[7000] = "{broken"  # line 7001, far past the first 64 KiB chunk
    (d / "partition-0.jsonl").write_text("\n".join(lines) + "\n")
    fs = FileSystem("files", tmp_path / "in")
    error = bad_line(drain(fs.reader(SSP0), batch=333))
    assert "partition-0.jsonl:7001: line is not valid JSON" in str(error)
    assert error.line == 7001
    after = sum(len(x) + 1 for x in lines[:4000])  # resumed after line 4001
    assert "partition-0.jsonl:7001:" in str(bad_line(drain(fs.reader(SSP0), after=after, batch=333)))


def test_producer_writes_json_lines_and_flush_makes_them_visible(tmp_path: Path) -> None:
    fs = FileSystem("files", tmp_path, output_partitions={"a": 3, "*": 2})
    p = fs.producer()
    assert p.partitions("a") == 3 and p.partitions("b") == 2
    p.send("a", 2, "k", {"x": 1, "text": "é"})
    p.send("a", 2, None, [1, 2])
    p.send("b", 0, None, "plain")
    p.flush()
    assert (tmp_path / "a" / "partition-2.jsonl").read_text(encoding="utf-8") == '{"x":1,"text":"é"}\n[1,2]\n'
    p.send("b", 0, None, 5)
    p.close()
    assert (tmp_path / "b" / "partition-0.jsonl").read_text() == '"plain"\n5\n'
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        fs.producer().send("a", 0, None, object())


def test_producer_cuts_partial_line_left_by_a_hard_kill(tmp_path: Path) -> None:
    d = tmp_path / "out"
    d.mkdir()
    (d / "partition-0.jsonl").write_bytes(b'{"seq":0}\n{"seq":1}\n{"se')
    p = FileSystem("files", tmp_path).producer()
    p.send("out", 0, None, {"seq": 2})
    p.close()
    assert read_stream(d) == [[{"seq": 0}, {"seq": 1}, {"seq": 2}]]


def test_existing_output_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    write_stream(tmp_path / "out", [[1], [2], [3]])
    fs = FileSystem("files", tmp_path, output_partitions=2)
    with pytest.raises(ConfigError, match=r"systems.files.output_partitions.*already has partition 2 in"):
        fs.producer().partitions("out")
    assert FileSystem("files", tmp_path, output_partitions=3).producer().partitions("out") == 3
    (tmp_path / "out" / "partition-2.jsonl").unlink()  # not yet written (e.g. killed early): fine
    assert FileSystem("files", tmp_path, output_partitions=3).producer().partitions("out") == 3


def test_producer_writes_a_full_buffer_at_once_and_the_rest_on_flush(tmp_path: Path) -> None:
    from tailrace.files import FileProducer

    p = FileProducer(tmp_path, lambda stream: 1, buffer_bytes=100)
    f = tmp_path / "o" / "partition-0.jsonl"
    p.send("o", 0, None, {"seq": 0})
    assert f.read_bytes() == b""  # buffered: nothing written per message
    for i in range(1, 12):
        p.send("o", 0, None, {"seq": i})
    written = f.read_bytes()
    assert written and written.endswith(b"\n") and len(written) >= 100  # one buffer, whole lines
    p.flush()  # the Producer.flush contract: everything sent is on disk before a checkpoint
    assert [json.loads(x) for x in f.read_bytes().splitlines()] == [{"seq": i} for i in range(12)]
    p.close()


def test_producer_keeps_every_senders_order_across_threads_and_buffer_writes(tmp_path: Path) -> None:
    # the compiled send appends without a lock (the GIL serialises it) and a full buffer is
    # swapped out and written under the producer's lock: with many writers and a tiny
    # buffer, no line is lost, torn or reordered within a sender, in either partition
    from tailrace.files import FileProducer

    p = FileProducer(tmp_path, lambda stream: 2, buffer_bytes=64)
    n, senders = 3000, 4

    def sender(t: int) -> None:
        for i in range(n):
            p.send("o", i % 2, None, {"t": t, "i": i, "pad": "x" * (i % 7)})

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(senders)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    p.close()
    seen: dict[tuple[int, int], list[int]] = {}
    for part in (0, 1):
        for line in (tmp_path / "o" / f"partition-{part}.jsonl").read_bytes().splitlines():
            m = json.loads(line)
            seen.setdefault((part, m["t"]), []).append(m["i"])
    for t in range(senders):
        for part in (0, 1):
            assert seen[(part, t)] == list(range(part, n, 2))
    with pytest.raises(ValueError, match="closed"):
        p.send("o", 0, None, {"late": True})


def test_collector_sends_to_a_file_producer_through_its_compiled_path(tmp_path: Path) -> None:
    from tailrace.collector import Collector, key_partition

    p = FileSystem("files", tmp_path, output_partitions=3).producer()
    c = Collector({"files": p}, default_system="files")
    for i in range(50):
        c.send("out", {"i": i}, key=f"k{i % 5}")
    with pytest.raises(ValueError, match=r"file output out\[\d\]: message is not JSON-serialisable"):
        c.send("out", {"bad": object()}, key="k0")
    p.close()
    got = read_stream(tmp_path / "out")
    for i in range(50):
        assert {"i": i} in got[key_partition(f"k{i % 5}", 3)]
    assert sum(len(x) for x in got) == 50 and c.sent == 50
    # the route keeps the stream's open files: after close, it finds none and is refused too
    with pytest.raises(ValueError, match="closed"):
        c.send("out", {"late": True}, key="k0")


def test_records_larger_than_the_buffer_and_custom_encoders_arrive_whole(tmp_path: Path) -> None:
    # a buffer is made with room for its limit and a quarter more, and doubles for a record
    # larger than that; two buffers take turns (one written while the other fills)
    from tailrace.files import FileProducer

    p = FileProducer(tmp_path, lambda stream: 1, buffer_bytes=64)
    sent = [{"i": i, "pad": "y" * (1000 * (i % 4))} for i in range(40)]
    for m in sent:
        p.send("o", 0, None, m)
    p.close()
    assert read_stream(tmp_path / "o")[0] == sent
    # an encoder that returns a bytearray (not bytes) goes through the same buffers
    from tailrace._core import FileOutput, FileSink

    class Owner:
        def __init__(self, out: FileOutput) -> None:
            self.out, self.written = out, bytearray()

        def _output(self, stream: str, partition: int) -> FileOutput:
            return self.out

        def _write_full(self, out: FileOutput) -> None:
            taken = out.take()
            assert taken is not None
            data, n = taken
            self.written += data[:n]
            out.give_back(data)

    owner = Owner(FileOutput(-1))
    sink = FileSink(owner, lambda m: bytearray(m, "ascii"), b";", 10, "text")
    for i in range(30):
        sink.send("s", 0, None, f"m{i}")
    rest = owner.out.take()
    assert rest is not None and owner.out.used == 0 and owner.out.take() is None
    assert (bytes(owner.written) + bytes(rest[0][: rest[1]])).decode() == "".join(f"m{i};" for i in range(30))


needs_msgpack = pytest.mark.skipif(
    importlib.util.find_spec("msgpack") is None, reason="msgpack files need tailrace[fast]"
)


@needs_msgpack
def test_msgpack_stream_round_trips_with_byte_offsets_and_restart(tmp_path: Path) -> None:
    msgs = [{"seq": i, "blob": bytes([i % 256]) * (i % 7), "nested": [i, {"x": None}]} for i in range(3000)]
    offsets = write_stream(tmp_path / "in" / "s", [msgs], "msgpack")
    fs = FileSystem("files", tmp_path / "in", output_path=tmp_path / "out", key_field="seq")
    assert fs.partitions("s") == 1
    got = drain(fs.reader(SSP0), batch=101)
    assert [e.message for e in got] == msgs
    assert [e.offset for e in got] == offsets[0]
    assert [e.key for e in got] == list(range(3000))
    for k in (0, 1500, 2998, 2999):  # rule 13: resume right after the committed value
        again = drain(fs.reader(SSP0), after=offsets[0][k], batch=64)
        assert [e.message for e in again] == msgs[k + 1 :]
    with pytest.raises(InputError, match="beyond the end of the file"):
        fs.reader(SSP0).start(10**9, lambda: None)


@needs_msgpack
def test_msgpack_bad_or_truncated_data_names_file_and_byte_offset(tmp_path: Path) -> None:
    import msgpack

    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    good = msgpack.packb({"a": 1}) + msgpack.packb("two")
    (d / "partition-0.msgpack").write_bytes(good + msgpack.packb([1, 2, 3])[:-1])  # cut short
    fs = FileSystem("files", tmp_path / "in")
    with pytest.raises(
        InputError, match=rf"partition-0.msgpack: truncated msgpack value at byte offset {len(good)}"
    ):
        drain(fs.reader(SSP0))
    (d / "partition-0.msgpack").write_bytes(good + b"\xc1")  # 0xc1: never used in msgpack
    with pytest.raises(InputError, match=rf"bad msgpack data at byte offset {len(good)}"):
        drain(fs.reader(SSP0))


@pytest.mark.parametrize("fmt", [pytest.param("msgpack", marks=needs_msgpack)])
def test_the_values_before_bad_data_are_polled_before_its_error(tmp_path: Path, fmt: str) -> None:
    # a poll that meets bad data after good values returns the good ones; the next poll
    # raises (naming partition and offset), and the partition is not at its end meanwhile:
    # the engine processes and commits everything before the bad data (rule 18)
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    if fmt == "jsonl":
        good = b'{"a": 1}\n"two"\n'
        (d / "partition-0.jsonl").write_bytes(good + b"{oops\n[3]\n")
    else:
        import msgpack

        good = msgpack.packb({"a": 1}) + msgpack.packb("two")
        (d / "partition-0.msgpack").write_bytes(good + b"\xc1" + msgpack.packb([3]))
    reader = FileSystem("files", tmp_path / "in").reader(SSP0)
    reader.start(None, lambda: None)
    try:
        got = reader.poll(10)
        assert [e.message for e in got] == [{"a": 1}, "two"]
        assert not reader.at_end()
        with pytest.raises(InputError, match=rf"partition files.s\[0\], offset {len(good)}"):
            reader.poll(10)
    finally:
        reader.close()


def test_a_bad_json_line_is_polled_in_its_place_between_the_good_ones(tmp_path: Path) -> None:
    # rules 39, 40: a line that does not decode is an envelope in its place (a BadInput naming
    # partition and offset), and the reader reads on: the engine decides what it does, after
    # everything before it (the partition is not at its end meanwhile)
    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    good = b'{"a": 1}\n"two"\n'
    (d / "partition-0.jsonl").write_bytes(good + b"{oops\n[3]\n")
    reader = FileSystem("files", tmp_path / "in").reader(SSP0)
    reader.start(None, lambda: None)
    try:
        got = reader.poll(10)
        assert [e.offset for e in got] == [0, 9, len(good), len(good) + 6]
        assert [e.message for e in got[:2]] == [{"a": 1}, "two"] and got[3].message == [3]
        assert f"partition files.s[0], offset {len(good)}" in str(bad_line(got))
        assert reader.raw(9) == b'"two"' and reader.raw(len(good)) == b"{oops"
    finally:
        reader.close()


def test_a_key_field_the_first_message_lacks_stops_the_job_naming_its_fields(tmp_path: Path) -> None:
    # issue 36 item 5: key_field = "user_id" when the messages have "user" made every key None
    write_stream(tmp_path / "in" / "s", [[{"user": "u1", "amount": 3}]])
    reader = FileSystem("files", tmp_path / "in", key_field="user_id").reader(SSP0)
    reader.start(None, lambda: None)
    try:
        with pytest.raises(InputError, match=r"key_field 'user_id' is not a field of the first") as info:
            reader.poll(10)
        assert "its fields: user, amount" in str(info.value) and "offset 0" in str(info.value)
    finally:
        reader.close()
    ok = FileSystem("files", tmp_path / "in", key_field="user").reader(SSP0)
    assert [e.key for e in drain(ok)] == ["u1"]


@needs_msgpack
def test_msgpack_output_format_writes_values_and_cuts_a_partial_one(tmp_path: Path) -> None:
    import msgpack

    fs = FileSystem("files", tmp_path, output_partitions=2, output_format="msgpack")
    p = fs.producer()
    for i in range(10):
        p.send("o", i % 2, None, {"i": i, "b": b"\x00\xff"})
    p.close()
    assert read_stream(tmp_path / "o") == [
        [{"i": i, "b": b"\x00\xff"} for i in range(j, 10, 2)] for j in (0, 1)
    ]
    f = tmp_path / "o" / "partition-0.msgpack"
    f.write_bytes(f.read_bytes() + msgpack.packb({"partial": "x" * 50})[:20])  # as after a hard kill
    p = FileSystem("files", tmp_path, output_partitions=2, output_format="msgpack").producer()
    p.send("o", 0, None, "after")
    p.close()
    assert read_stream(tmp_path / "o")[0] == [{"i": i, "b": b"\x00\xff"} for i in range(0, 10, 2)] + ["after"]
    with pytest.raises(ValueError, match="not msgpack-serialisable"):
        fs.producer().send("o", 0, None, object())
    with pytest.raises(ConfigError, match=r"systems.files.output_format"):
        FileSystem("files", tmp_path, output_format="csv")


def test_a_partial_line_of_a_writer_killed_inside_its_write_is_cut_by_the_next_writer(tmp_path: Path) -> None:
    # tailrace run --containers N: processes append to one file; one killed inside its write
    # leaves a partial line while the others keep the file open
    from tailrace.files import FileProducer

    p = FileProducer(tmp_path, lambda stream: 1, buffer_bytes=1 << 20)
    p.send("o", 0, None, {"seq": 0})
    p.flush()
    f = tmp_path / "o" / "partition-0.jsonl"
    with open(f, "ab") as other:  # the other process's whole line, then the start of one
        other.write(b'{"other":1}\n{"oth')
    p.send("o", 0, None, {"seq": 1})
    p.flush()
    assert f.read_bytes() == b'{"seq":0}\n{"other":1}\n{"seq":1}\n'
    p.close()


def test_appends_wait_for_the_files_lock(tmp_path: Path) -> None:
    # a buffer (whole lines) is written under an exclusive flock of the file, so another
    # process's record never lands inside it, even when a write is short
    import fcntl

    from tailrace.files import FileProducer

    p = FileProducer(tmp_path, lambda stream: 1, buffer_bytes=1 << 20)
    p.send("o", 0, None, {"seq": 0})
    p.flush()
    f = tmp_path / "o" / "partition-0.jsonl"
    with open(f, "ab") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        other.write(b'{"other":')
        other.flush()
        p.send("o", 0, None, {"seq": 1})
        t = threading.Thread(target=p.flush)
        t.start()
        t.join(0.3)
        assert t.is_alive() and f.read_bytes() == b'{"seq":0}\n{"other":'  # waiting for the lock
        other.write(b"1}\n")
        other.flush()
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
    t.join(10)
    assert f.read_bytes() == b'{"seq":0}\n{"other":1}\n{"seq":1}\n'
    p.close()


def test_two_processes_append_to_one_output_without_tearing_a_line(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tailrace.files import FileProducer\n"
        "w = int(sys.argv[1])\n"
        "p = FileProducer(Path(sys.argv[2]), lambda s: 1, buffer_bytes=1000)\n"
        "for i in range(20000):\n"
        "    p.send('o', 0, None, {'w': w, 'i': i, 'pad': 'x' * (i % 97)})\n"
        "p.close()\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w), str(tmp_path)]) for w in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    seen: dict[int, list[int]] = {0: [], 1: []}
    for line in (tmp_path / "o" / "partition-0.jsonl").read_bytes().splitlines():
        m = json.loads(line)
        seen[m["w"]].append(m["i"])
    assert seen == {0: list(range(20000)), 1: list(range(20000))}


# -- envelopes and the cycle collector -------------------------------------------------
class _Seen:
    tracked: list[bool] = []
    offsets: list[Any] = []
    refs: list[Any] = []


class _CycleMaker:
    """Records each envelope's GC state and ties the envelope into a cycle through its
    message (message -> envelope -> message), watched through a weak reference."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        import gc
        import weakref

        _Seen.tracked.append(gc.is_tracked(envelope))
        _Seen.offsets.append(envelope.offset)
        if isinstance(envelope.message, dict):
            marker = _Marker()
            envelope.message["cycle"] = envelope
            envelope.message["marker"] = marker
            _Seen.refs.append(weakref.ref(marker))


class _Marker:
    pass


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_engine_hands_out_tracked_envelopes_and_collects_cycles_through_them(
    tmp_path: Path, engine: str, fmt: str
) -> None:
    import gc

    from tailrace import Container, StreamTask

    class Task(_CycleMaker, StreamTask):
        pass

    msgs: list[Any] = [{"seq": i} for i in range(3000)] if fmt == "jsonl" else [f"l{i}" for i in range(3000)]
    offsets = write_stream(tmp_path / "in" / "s", [msgs, msgs[:500]], fmt)
    _Seen.tracked, _Seen.offsets, _Seen.refs = [], [], []
    result = Container(
        Task, inputs=["files.s"], systems=[FileSystem("files", tmp_path / "in")], engine=engine
    ).run()
    assert result.reason == "end_of_stream"
    assert sorted(_Seen.offsets) == sorted(offsets[0] + offsets[1])
    # a dict message keeps its envelope tracked (a cycle through it can form); a str one does not
    assert _Seen.tracked == [fmt == "jsonl"] * 3500
    del result
    gc.collect()
    assert len(_Seen.refs) == (3500 if fmt == "jsonl" else 0)
    assert not [r for r in _Seen.refs if r() is not None], "cycles through envelopes were not collected"
    _Seen.refs = []


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_poll_tracks_an_envelope_exactly_when_a_field_can_refer_back(tmp_path: Path, fmt: str) -> None:
    # every engine gets the reader's poll(): each envelope is settled once, when it is made
    # (a dict message can hold its envelope: tracked; a str one cannot: untracked)
    import gc

    msgs: list[Any] = [{"seq": i, "nested": [i]} for i in range(300)]
    if fmt == "text":
        msgs = [f"l{i}" for i in range(300)]
    fs = make(tmp_path, [msgs], fmt=fmt, read_ahead=100)
    r = fs.reader(SSP0)
    assert isinstance(r, FileReader)
    r.start(None, lambda: None)
    got = r.poll(100)
    assert [e.message for e in got] == msgs[:100]
    assert [gc.is_tracked(e) for e in got] == [fmt == "jsonl"] * 100
    r.close()


@pytest.mark.parametrize("skip", [False, True])
def test_c_engine_reports_or_skips_bad_lines_with_file_and_line(tmp_path: Path, skip: bool) -> None:
    from tailrace import Container, StreamTask
    from tailrace.errors import TailraceError

    class Task(_CycleMaker, StreamTask):
        pass

    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    lines = [json.dumps({"seq": i}) for i in range(6000)]
    lines[4321] = '{"seq": oops}'
    (d / "partition-0.jsonl").write_text("\n".join(lines) + "\n")
    _Seen.tracked, _Seen.offsets, _Seen.refs = [], [], []
    c = Container(
        Task,
        inputs=["files.s"],
        systems=[FileSystem("files", tmp_path / "in", skip_bad_lines=skip)],
        engine="c",
    )
    if not skip:
        with pytest.raises(TailraceError, match=r"partition-0.jsonl:4322: line is not valid JSON"):
            c.run()
        bad_at = sum(len(x) + 1 for x in lines[:4321])
        assert len(_Seen.offsets) <= 4321 and all(o < bad_at for o in _Seen.offsets)  # none after it
        return
    result = c.run()
    assert result.reason == "end_of_stream"
    assert len(_Seen.offsets) == 5999


@pytest.mark.parametrize("engine", ["c", "python"])
def test_shutdown_with_envelopes_still_buffered_then_restart_by_offset(tmp_path: Path, engine: str) -> None:
    # rules 1, 9, 19: a stop leaves polled envelopes in the input rings (held, untracked,
    # on the C engine); they are dropped, and the restart reads on after the committed
    # offset: every line exactly once across both runs
    import gc

    from tailrace import Container, MemoryCheckpointStore, Scope, StreamTask

    seen: list[tuple[int, int]] = []

    class StopEarly(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append((envelope.partition, envelope.message["seq"]))
            if len(seen) == 777:
                coordinator.commit(Scope.ALL_TASKS_IN_CONTAINER)
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    msgs = [[{"seq": i, "p": p} for i in range(3000)] for p in range(2)]
    write_stream(tmp_path / "in" / "s", msgs)
    store = MemoryCheckpointStore()

    def run() -> Any:
        fs = FileSystem("files", tmp_path / "in", read_ahead=500)
        return Container(StopEarly, inputs=["files.s"], systems=[fs], checkpoints=store, engine=engine).run()

    first = run()
    assert first.reason == "shutdown", (first.reason, len(seen))
    assert 777 <= len(seen) < 6000
    gc.collect()
    second = run()
    assert second.reason == "end_of_stream"
    assert sorted(seen) == sorted((p, i) for p in range(2) for i in range(3000))


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_line_nested_too_deep_to_read_is_a_bad_line_with_file_and_line(
    tmp_path: Path, engine: str, skip: bool
) -> None:
    # a JSON line nested 100,000 deep: the standard library refuses it with RecursionError (on
    # every Python: 3.12 and later read deeper than 3.11), which crashed the job instead of
    # naming the file and line (and skip_bad_lines did not apply)
    from tailrace import Container, StreamTask
    from tailrace.errors import InputError

    seen: list[Any] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.message)

    d = tmp_path / "in" / "s"
    d.mkdir(parents=True)
    deep = "[" * 100_000 + "]" * 100_000
    (d / "partition-0.jsonl").write_text(f'{{"a": 1}}\n{deep}\n{{"b": 2}}\n')
    c = Container(
        Task,
        inputs=["files.s"],
        systems=[FileSystem("files", tmp_path / "in", skip_bad_lines=skip)],
        engine=engine,
    )
    if not skip:
        bad = r"partition-0.jsonl:2: line is not valid JSON \(maximum recursion"
        with pytest.raises(InputError, match=bad):
            c.run()
        assert seen == [{"a": 1}]
        return
    assert c.run().reason == "end_of_stream"
    assert seen == [{"a": 1}, {"b": 2}]
    assert sum(c.skipped().values()) == 1
