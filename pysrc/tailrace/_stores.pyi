from collections.abc import Callable, Iterable, Mapping
from typing import Any

class StoreLock:
    def __enter__(self) -> StoreLock: ...
    def __exit__(self, *exc: object) -> None: ...

class Encoded:
    @property
    def data(self) -> bytes: ...  # read-only at run time
    def __init__(self, data: bytes) -> None: ...

ABSENT: object
MISSING: object

class StoreCore:
    _entries: dict[Any, Any]
    _dirty: dict[Any, None]
    _trusted: frozenset[type]
    _int_bits: bool
    _lock: StoreLock
    _complete: bool
    _str_keys: bool
    _evict_at: int
    _lru_at: int
    misses: int
    def get(self, key: Any, default: Any = None) -> Any: ...
    def __getitem__(self, key: Any) -> Any: ...
    def __contains__(self, key: object) -> bool: ...
    def put(self, key: Any, value: Any) -> None: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def _journal_note(self, key: Any) -> None: ...

class Journal:
    def __len__(self) -> int: ...
    def push(self, store: Any, key: Any, entry: Any) -> None: ...
    def clear(self) -> None: ...
    def take(self, mark: int) -> list[tuple[Any, Any, Any]]: ...

def journal_bind(journal: Journal | None) -> None: ...
def journal_current() -> Journal | None: ...
def encode_changes(
    entries: dict[Any, Any],
    dirty: dict[Any, Any],
    kenc: Callable[[Any], bytes],
    venc: Callable[[Any], bytes],
    key_serde: str,
    value_serde: str,
    yield_gil: bool = False,
) -> dict[bytes, bytes | None]: ...
def evict_clean(
    entries: dict[Any, Any], dirty: dict[Any, Any], committing: dict[Any, Any], excess: int
) -> int: ...
def encode_rows(
    entries: dict[Any, Any],
    dirty: dict[Any, Any],
    kenc: Callable[[Any], bytes],
    venc: Callable[[Any], bytes],
    key_serde: str,
    value_serde: str,
    yield_gil: bool = False,
) -> tuple[list[bytearray], list[bytearray]]: ...
def own_methods(cls: type, names: Iterable[str]) -> None: ...
def split_changes(
    changes: Mapping[bytes, bytes | None], yield_gil: bool = False
) -> tuple[list[bytearray], list[bytearray]]: ...
def scan_overlay(
    entries: dict[Any, Any],
    keys: Iterable[Any],
    encode_key: Callable[[Any], bytes],
    str_keys: bool,
    lo: bytes | None,
    hi: bytes | None,
) -> list[tuple[bytes, Any, Any]]: ...
