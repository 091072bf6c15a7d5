"""The generation marker, ``<db>.generation``: the highest generation of a store known
durable, so that a database that lost writes never looks empty or older (see
``tailrace.sqlite``)."""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from pathlib import Path

from ..errors import CheckpointError


def marker_path(db: Path) -> Path:
    """The generation marker of store ``db`` (see ``tailrace.sqlite``)."""
    return db.with_name(f"{db.name}.generation")


# -- the generation marker ------------------------------------------------------
# Two 32-byte slots, at offsets 0 and 4096 (different pages, so a torn write of one
# never touches the other); generation g is written to slot g % 2. A slot is:
# magic, the store id (16 bytes), the generation, and a CRC-32 of those.
_MARKER = struct.Struct("<4s16sQI")
_MARKER_MAGIC = b"TRgn"
_MARKER_SLOTS = (0, 4096)


class GenerationMarker:
    """The ``<db>.generation`` file of one store: the store id and the highest
    generation known durable (a lower bound of the database's own)."""

    def __init__(self, path: Path, store_id: bytes, generation: int) -> None:
        self.path = path
        self.store_id = store_id
        self.generation = generation

    @classmethod
    def read(cls, path: Path) -> GenerationMarker | None:
        """The marker at ``path``; None when there is none; CheckpointError when it is damaged."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint marker {path}: {e}") from None
        best: GenerationMarker | None = None
        for at in _MARKER_SLOTS:
            raw = data[at : at + _MARKER.size]
            if len(raw) < _MARKER.size:
                continue
            magic, store_id, gen, crc = _MARKER.unpack(raw)
            if magic != _MARKER_MAGIC or crc != zlib.crc32(raw[:-4]):
                continue
            if best is not None and store_id != best.store_id:
                raise CheckpointError(f"checkpoint marker {path} names two different stores")
            if best is None or gen > best.generation:
                best = cls(path, store_id, gen)
        if best is None:
            raise CheckpointError(
                f"checkpoint marker {path} is damaged (no valid slot); it guards {path.name[:-11]} "
                "against silent restarts: delete it only if that database is known to be intact"
            )
        return best

    @staticmethod
    def _slot(store_id: bytes, generation: int) -> bytes:
        head = _MARKER.pack(_MARKER_MAGIC, store_id, generation, 0)[:-4]
        return head + struct.pack("<I", zlib.crc32(head))

    @classmethod
    def create(cls, path: Path, store_id: bytes, generation: int) -> GenerationMarker:
        """Write a new marker atomically (temporary file, fsync, rename, fsync of the directory)."""
        data = bytearray(_MARKER_SLOTS[1] + _MARKER.size)
        for at in _MARKER_SLOTS:
            data[at : at + _MARKER.size] = cls._slot(store_id, generation)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, bytes(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return cls(path, store_id, generation)

    def record(self, generation: int) -> None:
        """Record a generation the database has made durable (slot ``generation % 2``)."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # containers of other jobs may share the store
            os.pwrite(fd, self._slot(self.store_id, generation), _MARKER_SLOTS[generation % 2])
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self.generation = max(self.generation, generation)
