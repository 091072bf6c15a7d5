"""SHA-256 and BLAKE2b without importing hashlib.

``import hashlib`` loads OpenSSL (its ``_hashlib`` module links libcrypto): about 5 ms of
CPU at every start of ``tailrace run``, paid for a few digests of a few bytes (file
fingerprints, SQLite lock bytes). CPython's own implementations of the two digests,
which hashlib itself falls back to, give the same digests for none of that; hashlib is
used only where an interpreter lacks them.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter built without _blake2
    from hashlib import blake2b

try:
    from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # Python 3.12+
except ImportError:  # pragma: no cover - depends on the Python version
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # Python 3.11
    except ImportError:  # pragma: no cover - an interpreter built without them
        from hashlib import sha256  # type: ignore[assignment,unused-ignore]

__all__ = ["blake2b", "sha256"]
