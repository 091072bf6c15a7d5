"""Per-key ordering (``task.ordering = key``, SEMANTICS rules 30-31): the key identity.

Both engines decide "same key" from the envelope key: the C engine from a 64-bit
hash the binding puts on each ring item (equal hashes are serialised, never
reordered), the reference engine from the key itself. Messages without a key
(``None``) are one key. ``set_key_hash_override`` is a test hook: it forces the
hash (e.g. two keys that collide) in both engines.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

_override: Callable[[Any], int] | None = None


def set_key_hash_override(fn: Callable[[Any], int] | None) -> None:
    """Tests only: hash keys with ``fn(key) -> int`` in both engines (None: the default)."""
    global _override
    _override = fn
    from . import _core

    _core._set_key_hash_override(fn)


def key_identity(key: Any) -> Hashable:
    """What the reference engine treats as one key: the key, or its forced hash."""
    if _override is not None:
        return ("hash", _override(key) & 0xFFFFFFFFFFFFFFFF)
    try:
        hash(key)
    except TypeError:  # an unhashable key (a list, a dict): its repr stands for it
        return ("repr", repr(key))
    return ("key", key)


__all__ = ["key_identity", "set_key_hash_override"]
