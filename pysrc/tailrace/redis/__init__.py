"""The Redis backend: Redis Streams as a system, checkpoints and leases in Redis,
and job membership (several containers sharing a job's partitions).

- ``system``: :class:`RedisSystem` (streams as partitioned inputs and outputs);
- ``checkpoint``: :class:`RedisCheckpointStore` (fenced by partition leases);
- ``membership``: :func:`run_member` / :class:`MemberSpec` (who runs which partitions);
- ``_io``: connections, the key layout and the Lua scripts they share;
- ``_resp``: the compiled RESP2 codec of the standalone fast path.

Needs the ``redis`` extra (``pip install 'tailrace[redis]'``).
"""

from __future__ import annotations

from .checkpoint import RedisCheckpointStore
from .membership import MemberResult, MemberSpec, run_member
from .system import RedisSystem

__all__ = ["MemberResult", "MemberSpec", "RedisCheckpointStore", "RedisSystem", "run_member"]
