"""Per-key ordering (``task.ordering = key``, SEMANTICS rules 30-31): the key identity.

Both engines decide "same key" from the envelope key: the C engine from a 64-bit
hash the binding puts on each ring item (equal hashes are serialised, never
reordered), the reference engine from the key itself. Messages without a key
(``None``) are one key. A hashable key is itself (``==`` and ``hash``); an
unhashable one (a dict or list, as a JSON ``key_field`` gives) stands for its
canonical JSON text (:func:`unhashable_key_text`: object fields sorted), so two
dicts with the same fields in another order are one key, as they are to the
stores. ``set_key_hash_override`` is a test hook: it forces the hash (e.g. two
keys that collide) in both engines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

_override: Callable[[Any], int] | None = None


def set_key_hash_override(fn: Callable[[Any], int] | None) -> None:
    """Tests only: hash keys with ``fn(key) -> int`` in both engines (None: the default)."""
    global _override
    _override = fn
    from . import _core

    _core._set_key_hash_override(fn)


def unhashable_key_text(key: Any) -> str:
    """What stands for an unhashable key in both engines: its canonical JSON text (object
    fields sorted, no spaces), or its ``repr`` when it has none (fields of mixed types,
    values JSON cannot hold). Keys equal as JSON values are one key; over-serialising
    two keys that only look alike costs concurrency, never order."""
    try:
        return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(key)


def key_identity(key: Any) -> Hashable:
    """What the reference engine treats as one key: the key, or its forced hash."""
    if _override is not None:
        return ("hash", _override(key) & 0xFFFFFFFFFFFFFFFF)
    try:
        hash(key)
    except TypeError:
        return ("text", unhashable_key_text(key))
    return ("key", key)


__all__ = ["key_identity", "set_key_hash_override", "unhashable_key_text"]
