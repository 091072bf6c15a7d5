"""Per-key ordering (``task.ordering = key``, SEMANTICS rules 30-31): the key identity.

Both engines decide "same key" from the envelope key: the C engine from a 64-bit
hash the binding puts on each ring item (equal hashes are serialised, never
reordered), the reference engine from the key itself. Messages without a key
(``None``) are one key. A hashable key is itself (``==`` and ``hash``); an
unhashable one (a dict or list, as a JSON ``key_field`` gives) stands for its
canonical JSON text (:func:`unhashable_key_text`: object fields sorted), so two
dicts with the same fields in another order are one key, as they are to the
stores. A key that is neither (a set, a dict whose field names mix types, an
object with ``__eq__`` and no ``__hash__``), or whose ``__hash__`` raises, has no
identity that keeps equal keys one key: both engines stop when they read its
message, with :func:`key_error` naming the task, partition, offset and the key's
type. ``set_key_hash_override`` is a test hook: it forces the hash (e.g. two
keys that collide) in both engines.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Hashable
from typing import Any

from .errors import TaskError

_override: Callable[[Any], int] | None = None


def set_key_hash_override(fn: Callable[[Any], int] | None) -> None:
    """Tests only: hash keys with ``fn(key) -> int`` in both engines (None: the default)."""
    global _override
    _override = fn
    from . import _core

    _core._set_key_hash_override(fn)


def unhashable_key_text(key: Any) -> str:
    """What stands for an unhashable key in both engines: its canonical JSON text (object
    fields sorted, no spaces). Keys equal as JSON values are one key. Raises json's
    TypeError or ValueError for a key without one (a set, field names of mixed types):
    its ``repr`` would not do, as two equal sets or dicts may print differently."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def key_identity(key: Any) -> Hashable:
    """What the reference engine treats as one key: the key, or its forced hash. Raises
    what ``hash`` or :func:`unhashable_key_text` raises for a key without one."""
    if _override is not None:
        return ("hash", _override(key) & 0xFFFFFFFFFFFFFFFF)
    try:
        hash(key)
    except TypeError:
        return ("text", unhashable_key_text(key))
    return ("key", key)


def key_error(task: str, ssp: Any, offset: Any, key: Any, error: BaseException) -> TaskError:
    """The error that stops a container (rule 16, both engines) when the key of the message
    at ``offset`` of ``ssp`` has no identity under ``task.ordering = key``: ``error`` is what
    ``hash`` or :func:`unhashable_key_text` raised for it."""
    kind = type(key)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    why = "its hash failed"
    try:
        hash(key)
    except TypeError:
        why = "neither hashable nor JSON"
    except Exception:  # noqa: BLE001 - its hash failed again: said above
        pass
    detail = (
        f"its key, a {name} ({reprlib.repr(key)}), is no key under task.ordering = key: {why} "
        f"({type(error).__name__}: {error}); a key must be hashable, or a dict or list that JSON "
        f"encodes with its fields sorted (docs/ordering.md)"
    )
    return TaskError(task, ssp, offset, error, phase="key ordering", detail=detail)


__all__ = ["key_error", "key_identity", "set_key_hash_override", "unhashable_key_text"]
