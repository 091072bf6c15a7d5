"""File system: partitioned streams as directories of line files.

Layout (input and output alike)::

    <path>/<stream>/partition-0.jsonl     JSON Lines: one JSON value per line
    <path>/<stream>/partition-1.jsonl
    <path>/<stream>/partition-0.txt       plain text: one message (a str) per line
    <path>/<stream>/partition-0.msgpack   msgpack values back to back (tailrace[fast])

A stream is every ``partition-N.jsonl`` (or ``.txt``, or ``.msgpack``) file in
its directory, N = 0, 1, ... without gaps; one stream uses one format. The
**offset** of a message is the byte offset of the start of its line, so a
restart after committed offset X seeks to X, skips that one line and reads on:
nothing before it is read again (msgpack: the byte offset where the value starts;
see MsgpackReader).

A file replaced under a checkpoint is refused, even with lines of the same
shape: after a checkpoint (at most once a second per partition) the reader
records a **fingerprint** of the committed line (the SHA-256 of the up to 4 KiB
of the file that end with that line) in
``<path>/.tailrace-fingerprints/<stream>/partition-N.jsonl``, and a restart
verifies it before seeking (see :func:`verify_fingerprint`).

Inputs are bounded: a partition ends at the end of its file, which also ends a last
line without a newline; such a line's fingerprint is recorded as soon as it is
committed, ending where it ended, so that bytes appended to it later (a different
line at that offset) are refused at restart, not skipped. A reader has no
thread: the engine's ``poll`` (on its loop thread) reads the next chunk, splits it
into lines and decodes at most ``read_ahead`` messages, so an input never holds
more than one chunk of bytes, and a slow task simply polls less (rule 6).

Outputs are written as JSON Lines to ``<output_path>/<stream>/partition-N.jsonl``
(``output_path`` defaults to ``path``), one line per message (the message
only; the key places it in a partition), encoded by ``tailrace.serdes`` (byte for
byte the standard library's output; a plain record is encoded straight into the
partition's buffer). ``flush`` (called
before every checkpoint) writes and fsyncs them. ``output_format = "msgpack"`` writes
``partition-N.msgpack`` files instead. A partial last line (or value) left by a hard kill
is cut off when the file is reopened (it was never covered by a checkpoint). Several
processes may append to one output file (``tailrace run --containers N``): every write
and every repair happens under an exclusive ``flock`` of the file, and a JSON Lines writer
first cuts a partial last line left by a writer killed inside its write.

Bad input is never silent: a missing directory or file, a partition gap, a line
that is not valid JSON (or UTF-8) raises InputError naming the file and line;
with ``skip_bad_lines=True`` bad lines are skipped, logged and counted instead
(``PartitionReader.skipped()``).

The modules, each a concern:

- ``system``: :class:`FileSystem` (the options, which file each partition reads or writes);
- ``streams``: stream directories (finding a stream's partition files and format), and
  :func:`write_stream` / :func:`read_stream` for tests and tools;
- ``reader``: :class:`FileReader` (JSON Lines, text) and :class:`MsgpackReader`;
- ``producer``: :class:`FileProducer` (buffered appends, flushed and fsynced before a checkpoint);
- ``fingerprints``: recording and checking the fingerprint of a committed line.
"""

from __future__ import annotations

from .fingerprints import (
    FINGERPRINT_BYTES,
    FINGERPRINT_INTERVAL_S,
    fingerprint_path,
    record_fingerprint,
    verify_fingerprint,
)
from .producer import FileProducer
from .reader import READ_AHEAD, FileReader, MsgpackReader
from .streams import FORMATS, partition_file, read_stream, scan_stream, write_stream
from .system import FileSystem

__all__ = [
    "FINGERPRINT_BYTES",
    "FINGERPRINT_INTERVAL_S",
    "FORMATS",
    "READ_AHEAD",
    "FileProducer",
    "FileReader",
    "FileSystem",
    "MsgpackReader",
    "fingerprint_path",
    "partition_file",
    "read_stream",
    "record_fingerprint",
    "scan_stream",
    "verify_fingerprint",
    "write_stream",
]
