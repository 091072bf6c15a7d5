"""Shared Redis plumbing: connections, key layout, Lua scripts, retries.

Key layout (``P`` is the prefix, default ``tr``). Everything about one partition
carries the hash tag ``{stream:p}``, so on a Redis Cluster a partition's stream,
its checkpoint, its lease and its fencing counter live in one slot and one Lua
script can check the lease and write the checkpoint atomically::

    P:{stream:p}:s              the partition's stream (XADD / XREAD)
    P:{stream:p}:ckpt:JOB       committed entry id of JOB
    P:{stream:p}:lease:JOB      "member|token" while a container owns it (PX ttl)
    P:{stream:p}:fence:JOB      fencing counter (INCR on every acquisition)
    P:{stream:p}:done:JOB       set once JOB processed the partition to its end
    P:{a}:tckpt:JOB:TASK        hash "stream:p" -> id: committed ids of a task's
                                partitions outside its anchor's slot (cluster only);
                                field "~outputs": the number of the task's last
                                exactly-once output batch (OUTPUT_COMMIT)
    P:{a}:state:JOB:TASK:STORE:k  sorted set (score 0) of a store's encoded keys
    P:{a}:state:JOB:TASK:STORE:v  hash: encoded key -> encoded value
    P:{job:JOB}:anchors         hash TASK -> "stream:p", the anchor its state was written under
    P:meta:stream:partitions    partition count of a stream
    P:{job:JOB}:members         sorted set of live members (score: expiry, ms)

``{a}`` is the tag ``{stream:p}`` of the task's *anchor*, its first input
partition (sorted as the container sorts them): a task's state and its whole
checkpoint live in one slot, so one fenced script (or one MULTI/EXEC of them)
writes both (see ``tailrace.redis.checkpoint`` and docs/redis.md).

A job name may contain ``:``, so ``state:JOB:*`` also matches the keys of a job
named ``JOB:more``; a key's job is told apart by what follows it. TASK is
``Partition N`` and STORE a declared store name (letters, digits, ``_``, ``-``):
neither holds a ``:``, so after ``state:JOB:`` exactly ``TASK:STORE:k|v`` (two
``:``) and after ``tckpt:JOB:`` exactly ``TASK`` (none) remain
(:meth:`Keys.is_job_data`).

Redis is imported lazily so that tailrace works without the ``redis`` extra.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ConfigError

log = logging.getLogger("tailrace.redis")

T = TypeVar("T")

DEFAULT_URL = "redis://127.0.0.1:6379/0"
ENTRY_ID = re.compile(r"^(\d+)-(\d+)$")


def _redis() -> Any:
    try:
        import redis
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError("the redis system needs redis-py: pip install 'tailrace[redis]'", key="type") from e
    return redis


def connection_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "Redis is (temporarily) unreachable"."""
    r = _redis()
    errs: list[type[BaseException]] = [r.exceptions.ConnectionError, r.exceptions.TimeoutError]
    for name in ("ClusterDownError", "TryAgainError", "MasterDownError", "BusyLoadingError"):
        cls = getattr(r.exceptions, name, None)
        if cls is not None:
            errs.append(cls)
    return tuple(errs)


def connect(url: str, *, cluster: bool = False, socket_timeout: float = 10.0) -> Any:
    """A redis-py client (``redis.Redis`` or ``redis.cluster.RedisCluster``) for ``url``.

    ``url``: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/sock?db=0``.
    Nothing is sent yet; :func:`check` verifies the server answers.
    """
    r = _redis()
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"{url!r} is not a Redis URL", key="url", allowed="redis://host:port/db or unix:///path?db=N"
        )
    kw: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": 5.0}
    if cluster:
        if url.startswith("unix://"):
            raise ConfigError("a Redis Cluster is reached over TCP, not a unix socket", key="url")
        # Our own retry loops handle outages; keep redis-py's own attempts short.
        return r.cluster.RedisCluster.from_url(url, **kw)
    # No attempts of redis-py's own (its default retries a command 3 times, each up to
    # socket_timeout, with backoff): retrying() is the one retry loop, so that retry_s
    # and a stop's deadline (tailrace._stopping.StopDeadline) bound how long a call to a dead Redis waits.
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return r.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kw)


def abort_client(client: Any) -> None:
    """Shut down every socket of a redis-py client (blocked calls fail at once)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect(inuse_connections=True)
    else:  # a cluster: each node's pool
        for node in getattr(client, "get_nodes", lambda: [])():
            rc = getattr(node, "redis_connection", None)
            if rc is not None:
                rc.connection_pool.disconnect(inuse_connections=True)


_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def redact(url: str) -> str:
    """``url`` for messages and logs: a password in it (``redis://user:pw@host``, or the
    ``password`` query parameter) as ``***``; the rest as written."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url, count=1))


def auth_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "Redis refused the login": not an outage, never retried (redis-py
    makes AuthenticationError a ConnectionError)."""
    r = _redis()
    errs: list[type[BaseException]] = [r.exceptions.AuthenticationError]
    cls = getattr(r.exceptions, "AuthenticationWrongNumberOfArgsError", None)
    if cls is not None:
        errs.append(cls)
    return tuple(errs)


def _check_password_alone(client: Any) -> None:
    """A password without a user name (``redis://:PASSWORD@host``, ``?password=``) logs in the
    way tailrace's own connections (RespConnection: the readers and producers) send it,
    ``AUTH PASSWORD``. redis-py sends ``HELLO 3 AUTH default PASSWORD``, which a server with
    no password accepts whatever the password; ``AUTH PASSWORD`` it refuses. Sent here too,
    every connection of the job fails alike at start, not the first read."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    password = kwargs.get("password")
    if password is not None and not kwargs.get("username") and kwargs.get("credential_provider") is None:
        client.execute_command("AUTH", password)


def check(client: Any, url: str, error: Callable[[str], BaseException]) -> None:
    """PING the server; raise ``error(message naming the URL)`` when it does not answer."""
    try:
        client.ping()
        _check_password_alone(client)
    except auth_errors() as e:
        raise error(
            f"Redis at {redact(url)} refused the login (the user and password in the URL): {e}"
        ) from e
    except connection_errors() as e:
        raise error(f"Redis at {redact(url)} is unreachable: {e}") from e
    except _redis().exceptions.RedisError as e:
        raise error(f"Redis at {redact(url)} refused PING: {e}") from e


def retrying(
    fn: Callable[[], T],
    what: str,
    *,
    deadline_s: float = 60.0,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, backing off (10 ms doubling to 1 s) while Redis is
    unreachable, for at most ``deadline_s``; then re-raise the last connection error.
    Any other error is raised at once. ``stop()`` true aborts the wait early, and
    once it is true no attempt is started at all (a ConnectionError saying so)."""
    errors = connection_errors()
    refused = auth_errors()
    delay = 0.01
    give_up = time.monotonic() + deadline_s
    warned = False
    while True:
        if stop is not None and stop():
            raise _redis().exceptions.ConnectionError(f"{what}: gave up waiting for Redis (stopping)")
        try:
            return fn()
        except refused:
            raise  # a login Redis refuses stays refused: no outage to wait out
        except errors as e:
            if time.monotonic() + delay > give_up or (stop is not None and stop()):
                raise
            if not warned:
                log.warning("%s: Redis unreachable (%s), retrying", what, e)
                warned = True
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def entry_id(value: Any, where: str) -> tuple[int, int]:
    """Parse a stream entry id ``"ms-seq"`` (str or bytes); ValueError naming ``where``."""
    if isinstance(value, bytes):
        value = value.decode()
    m = ENTRY_ID.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{where}: {value!r} is not a Redis stream entry id ('ms-seq')")
    return int(m.group(1)), int(m.group(2))


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class Keys:
    """The key layout above, for one prefix."""

    def __init__(self, prefix: str = "tr") -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ConfigError(f"{prefix!r} is not a usable key prefix", key="prefix")
        self.prefix = prefix

    def _tag(self, stream: str, partition: int) -> str:
        return f"{self.prefix}:{{{stream}:{partition}}}"

    def stream(self, stream: str, partition: int) -> str:
        return f"{self._tag(stream, partition)}:s"

    def checkpoint(self, stream: str, partition: int, job: str) -> str:
        return f"{self._tag(stream, partition)}:ckpt:{job}"

    def lease(self, stream: str, partition: int, job: str) -> str:
        return f"{self._tag(stream, partition)}:lease:{job}"

    def fence(self, stream: str, partition: int, job: str) -> str:
        return f"{self._tag(stream, partition)}:fence:{job}"

    def done(self, stream: str, partition: int, job: str) -> str:
        return f"{self._tag(stream, partition)}:done:{job}"

    def partitions(self, stream: str) -> str:
        return f"{self.prefix}:meta:{stream}:partitions"

    def task_offsets(self, stream: str, partition: int, job: str, task: str) -> str:
        """Ids of a task's partitions outside its anchor's slot (anchor: stream, partition)."""
        return f"{self._tag(stream, partition)}:tckpt:{job}:{task}"

    def anchors(self, job: str) -> str:
        """Hash: task -> the anchor ("stream:p") its state lives under."""
        return f"{self.prefix}:{{job:{job}}}:anchors"

    def job_data(self, stream: str, partition: int, job: str) -> list[str]:
        """SCAN patterns of what ``job`` keeps in a partition's slot besides its checkpoint:
        the state of the tasks anchored there, and their other partitions' ids. They match
        the keys of jobs whose names start with ``job + ":"`` too: keep only the keys
        :meth:`is_job_data` accepts."""
        base = _glob_escape(self._tag(stream, partition))
        return [f"{base}:state:{_glob_escape(job)}:*", f"{base}:tckpt:{_glob_escape(job)}:*"]

    def is_job_data(self, key: str | bytes, stream: str, partition: int, job: str) -> bool:
        """Whether ``key`` is a state or ``tckpt`` key of ``job`` itself in a partition's slot
        (not one of a job named ``job:...``; see the module docstring)."""
        name = text(key)
        base = self._tag(stream, partition)
        head = f"{base}:state:{job}:"
        if name.startswith(head):
            rest = name[len(head) :]  # TASK:STORE:k or TASK:STORE:v
            return rest.count(":") == 2 and rest.endswith((":k", ":v"))
        head = f"{base}:tckpt:{job}:"
        return name.startswith(head) and ":" not in name[len(head) :]  # TASK

    def state(self, stream: str, partition: int, job: str, task: str, store: str) -> tuple[str, str]:
        """(sorted set of keys, hash of values) of one store of a task, in its anchor's slot."""
        base = f"{self._tag(stream, partition)}:state:{job}:{task}:{store}"
        return f"{base}:k", f"{base}:v"

    def members(self, job: str) -> str:
        return f"{self.prefix}:{{job:{job}}}:members"


# -- Lua ------------------------------------------------------------------------
# Entry ids compare as (ms, seq) pairs of integers; both parts fit a double for
# any realistic id (ms < 2^53, seq small), which is all Lua numbers offer.
_LUA_CMP = """
local function behind(new, old)
  if not old then return false end
  local nm, ns = string.match(new, '^(%d+)-(%d+)$')
  local om, os = string.match(old, '^(%d+)-(%d+)$')
  if not om then return false end
  nm, ns, om, os = tonumber(nm), tonumber(ns), tonumber(om), tonumber(os)
  return nm < om or (nm == om and ns < os)
end
"""

# KEYS: lease, fence.  ARGV: member, ttl_ms.  -> token, or false when held.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
"""

# KEYS: lease.  ARGV: value, ttl_ms.  -> 1 renewed, 0 lost.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease.  ARGV: value.  -> 1 released, 0 not ours.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: lease_1, ckpt_1, lease_2, ckpt_2, ...  ARGV: value_1, id_1, value_2, id_2, ...
# -> {0} written; {1, i} lease i not held with that token; {2, i, stored} id i behind.
# Every check runs before any write: all or nothing.
COMMIT = (
    _LUA_CMP
    + """
local n = #KEYS / 2
for i = 1, n do
  if redis.call('GET', KEYS[2*i-1]) ~= ARGV[2*i-1] then return {1, i} end
  local old = redis.call('GET', KEYS[2*i])
  if behind(ARGV[2*i], old) then return {2, i, old} end
end
for i = 1, n do redis.call('SET', KEYS[2*i], ARGV[2*i]) end
return {0}
"""
)

# One batch of a task's commit: offsets and (part of) its state, in the slot of
# the task's anchor.
# KEYS: lease_1..lease_L, ckpt_1..ckpt_C, tckpt, then (keys zset, values hash) per store.
# ARGV: L, C, R, S, E, lease value_1..L, id_1..C, R pairs (tckpt field, id), then per
#       store: nset, ndel, nset (key, value) pairs, ndel keys. E: the task's last appended
#       output batch (field '~outputs' of tckpt) this call expects, or -1 (none checked):
#       a commit that carries outputs writes its offsets and state only if its
#       OUTPUT_COMMIT call, earlier in the same MULTI/EXEC, appended them.
# -> {0} written; {1, i} lease i not held with that value; {2, j, stored} id j
#    (1..C: ckpt_j, C+1..C+R: the R-th pair) behind the stored one; {3, stored}: the
#    task's last appended batch is not E.
# Every check runs before any write. A large commit is several calls of this
# script in one MULTI/EXEC, each making the same checks (nothing runs between
# them, so they all pass or all refuse) and writing the same offsets.
_LUA_TASK_CHECKS = """
local L, C, R, S = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local E = tonumber(ARGV[5])
local a = 6
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= ARGV[a] then return {1, i} end
  a = a + 1
end
local ids = a
for j = 1, C do
  local old = redis.call('GET', KEYS[L + j])
  if behind(ARGV[a], old) then return {2, j, old} end
  a = a + 1
end
local tckpt = KEYS[L + C + 1]
local fields = a
for j = 1, R do
  local old = redis.call('HGET', tckpt, ARGV[a])
  if behind(ARGV[a + 1], old) then return {2, C + j, old} end
  a = a + 2
end
if E >= 0 then
  local last = tonumber(redis.call('HGET', tckpt, '~outputs') or '0')
  if last ~= E then return {3, last} end
end
"""

STATE_COMMIT = (
    _LUA_CMP
    + _LUA_TASK_CHECKS
    + """
local CHUNK = 1000
for s = 1, S do
  local zkey, hkey = KEYS[L + C + 2 * s], KEYS[L + C + 2 * s + 1]
  local nset, ndel = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local i = 0
  while i < nset do
    local n = math.min(CHUNK, nset - i)
    local first = a + 2 * i
    local z = {}
    for k = 0, n - 1 do
      z[2 * k + 1] = 0
      z[2 * k + 2] = ARGV[first + 2 * k]
    end
    redis.call('ZADD', zkey, unpack(z))
    redis.call('HSET', hkey, unpack(ARGV, first, first + 2 * n - 1))
    i = i + n
  end
  a = a + 2 * nset
  i = 0
  while i < ndel do
    local n = math.min(CHUNK, ndel - i)
    redis.call('ZREM', zkey, unpack(ARGV, a + i, a + i + n - 1))
    redis.call('HDEL', hkey, unpack(ARGV, a + i, a + i + n - 1))
    i = i + n
  end
  a = a + ndel
end
for j = 1, C do redis.call('SET', KEYS[L + j], ARGV[ids + j - 1]) end
for j = 1, R do
  local f = fields + 2 * (j - 1)
  redis.call('HSET', tckpt, ARGV[f], ARGV[f + 1])
end
return {0}
"""
)


def _lua_append(streams: str, stream: str) -> str:
    """Lua that appends, per stream ``s`` in ``1..streams`` (``stream``: its key), the entries
    ARGV holds from ``a`` on: n, then n (message, key) pairs, a key '-' (none) or '=' and the
    encoded key. One loop for a producer's batch (XADD_BATCH) and a commit's held outputs
    (OUTPUT_COMMIT)."""
    return f"""for s = 1, {streams} do
  local stream = {stream}
  local n = tonumber(ARGV[a])
  a = a + 1
  for i = 1, n do
    local k = ARGV[a + 1]
    if k == '-' then
      redis.call('XADD', stream, '*', 'm', ARGV[a])
    else
      redis.call('XADD', stream, '*', 'm', ARGV[a], 'k', string.sub(k, 2))
    end
    a = a + 2
  end
end
"""


# A commit's held outputs (exactly-once, rule 41), one batch, in the MULTI/EXEC of its
# commit before the STATE_COMMIT calls: the same KEYS and checks as STATE_COMMIT (E is -1),
# then the S output streams (a key may come more than once: one per held producer).
# ARGV after the checks' part: the batch's sequence number, then per stream: n, then n
# (message, key) pairs (key '-': none; '=' and the key's bytes).
# -> {0} appended; {0, 1} appended by an earlier call (a retry after a lost reply: the
# task's field '~outputs' of tckpt already holds this batch's number); {1, i} / {2, j,
# stored} as STATE_COMMIT; {3, stored}: the task's last batch is not the one before this
# (another owner appended since); {4, s, type}: output stream s holds a key of another type
# (checked before anything is written: an XADD that failed there would leave the entries
# before it). The STATE_COMMIT calls after it expect this batch (E), so a refused batch
# refuses the whole commit.
OUTPUT_COMMIT = (
    _LUA_CMP
    + _LUA_TASK_CHECKS
    + """
a = fields + 2 * R
local seq = tonumber(ARGV[a])
a = a + 1
local last = tonumber(redis.call('HGET', tckpt, '~outputs') or '0')
if last == seq then return {0, 1} end
if last ~= seq - 1 then return {3, last} end
for s = 1, S do
  local t = redis.call('TYPE', KEYS[L + C + 1 + s])['ok']
  if t ~= 'stream' and t ~= 'none' then return {4, s, t} end
end
"""
    + _lua_append("S", "KEYS[L + C + 1 + s]")
    + """redis.call('HSET', tckpt, '~outputs', seq)
return {0}
"""
)

# Reads of a task's committed state are fenced as its writes are (rule 28): a container
# that lost a lease (paused past it, say) must not read the state its successor has
# committed since, ahead of its own position, and act on it before it notices.
#
# KEYS: the task's leases (L of them), values hash.  ARGV: L, the L lease values, field.
# -> {0, value} (value nil when absent), or {1, i}: lease i is not held by its value.
STATE_GET = """
local L = tonumber(ARGV[1])
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= ARGV[1 + i] then return {1, i} end
end
return {0, redis.call('HGET', KEYS[L + 1], ARGV[L + 2])}
"""

# KEYS: the task's leases (L of them), keys zset, values hash.  ARGV: L, the L lease
# values, min, max (ZRANGEBYLEX syntax), limit (at most SCAN_LIMIT: ``unpack`` is bounded
# by Lua's C stack, 8000 slots).
# -> {0, keys, values}: the next ``limit`` keys in byte order and their values, read in
# one atomic step (so a batch never mixes two commits); or {1, i} as STATE_GET.
SCAN_LIMIT = 7000
STATE_SCAN = """
local L = tonumber(ARGV[1])
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= ARGV[1 + i] then return {1, i} end
end
local a = L + 2
local ks = redis.call('ZRANGEBYLEX', KEYS[L + 1], ARGV[a], ARGV[a + 1], 'LIMIT', 0, tonumber(ARGV[a + 2]))
if #ks == 0 then return {0, ks, ks} end
return {0, ks, redis.call('HMGET', KEYS[L + 2], unpack(ks))}
"""

# KEYS: lease, done.  ARGV: value.  -> 1 marked, 0 lease not held.
MARK_DONE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], '1')
return 1
"""

# KEYS: members.  ARGV: member, ttl_ms (0: leave).  -> live members after the update.
# Uses the server's clock, so members' clocks need not agree.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]) + 60000)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: members.  -> live members (read only: expired entries are left to HEARTBEAT).
MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""


# KEYS: stream_1, stream_2, ...  ARGV: n_1, message, key, ... (n_1 pairs), n_2, ...;
# a key is "-" (none) or "=" followed by the encoded key. Appends every entry in
# order, in one command: a producer's flush costs one round trip and one command
# parse for all its partitions (on a cluster, one per partition: one slot per call).
XADD_BATCH = (
    """
local a = 1
"""
    + _lua_append("#KEYS", "KEYS[s]")
    + """return (#ARGV - #KEYS) / 2
"""
)


class Scripts:
    """The Lua scripts registered on one client (EVALSHA with automatic reload)."""

    def __init__(self, client: Any) -> None:
        self.acquire = client.register_script(ACQUIRE)
        self.renew = client.register_script(RENEW)
        self.release = client.register_script(RELEASE)
        self.commit = client.register_script(COMMIT)
        self.mark_done = client.register_script(MARK_DONE)
        self.heartbeat = client.register_script(HEARTBEAT)
        self.members = client.register_script(MEMBERS)
        self.xadd_batch = client.register_script(XADD_BATCH)
        self.state_commit = client.register_script(STATE_COMMIT)
        self.output_commit = client.register_script(OUTPUT_COMMIT)
        self.state_get = client.register_script(STATE_GET)
        self.state_scan = client.register_script(STATE_SCAN)


def _error_reply(message: str) -> BaseException:
    """The redis-py exception for an error reply (NOSCRIPT -> NoScriptError, ...)."""
    try:
        from redis._parsers import BaseParser
    except ImportError:  # pragma: no cover - redis-py moved it
        return _redis().exceptions.ResponseError(message)
    return BaseParser.parse_error(message)


class RespConnection:
    """One plain socket (TCP or unix) to a standalone Redis, replies decoded by ``tailrace.redis._resp``.

    The fast path of the Redis system's fetcher and producer: the bytes of an
    ``XREAD`` reply go straight into the reader's lists and a producer's batch is
    encoded as it is sent. It speaks RESP2 (it never sends ``HELLO``) and sends
    ``AUTH`` and ``SELECT`` from the client's URL on connecting. The interface is
    the part of redis-py's ``Connection`` the system uses, with redis-py's
    exceptions: ``ConnectionError`` / ``TimeoutError`` when Redis is unreachable
    (the connection is then dropped and made again on the next use), an error
    reply as ``ResponseError`` (``NoScriptError``, ...).
    """

    def __init__(self, params: dict[str, Any]) -> None:
        from . import _resp

        self._resp = _resp
        self.path: str | None = params.get("path")
        self.host: str = params.get("host", "localhost")
        self.port: int = int(params.get("port", 6379))
        self.db = int(params.get("db") or 0)
        self.username: str | None = params.get("username")
        self.password: str | None = params.get("password")
        self.timeout: float | None = params.get("socket_timeout")
        self.connect_timeout: float | None = params.get("socket_connect_timeout") or self.timeout
        self._sock: socket.socket | None = None
        self._replies = _resp.Replies()

    @classmethod
    def usable_for(cls, client: Any) -> dict[str, Any] | None:
        """Connection parameters of a standalone redis-py client whose connections this
        class can replace (plain TCP or unix socket, password auth), else None."""
        r = _redis()
        pool = getattr(client, "connection_pool", None)
        plain = (r.connection.Connection, r.UnixDomainSocketConnection)
        if pool is None or pool.connection_class not in plain:
            return None
        params = dict(pool.connection_kwargs)
        if params.get("credential_provider") is not None:
            return None
        return params

    def where(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"

    def connect(self) -> None:
        if self._sock is not None:
            return
        r = _redis()
        try:
            if self.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(self.connect_timeout)
                    sock.connect(self.path)
                except BaseException:
                    sock.close()
                    raise
            else:  # every address of the host in turn, as redis-py does
                sock = socket.create_connection((self.host, self.port), self.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.timeout)
        except TimeoutError as e:
            raise r.exceptions.TimeoutError(f"Timeout connecting to {self.where()}") from e
        except OSError as e:
            raise r.exceptions.ConnectionError(f"Error connecting to {self.where()}: {e}") from e
        self._sock = sock
        self._replies.clear()
        try:
            if self.password is not None:
                auth = (self.username, self.password) if self.username else (self.password,)
                self.send_command("AUTH", *auth)
                self.read_response()
            if self.db:
                self.send_command("SELECT", self.db)
                self.read_response()
        except BaseException:
            self.disconnect()
            raise

    def disconnect(self) -> None:
        sock, self._sock = self._sock, None
        self._replies.clear()
        if sock is not None:
            try:
                sock.close()
            except OSError:  # pragma: no cover - closing never matters here
                pass

    def abort(self) -> None:
        """Shut the socket down from any thread: a call blocked on it fails at once (its
        thread then drops the connection)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def send_packed_command(self, data: bytes | list[bytes]) -> None:
        """Write encoded commands: bytes, or a list of bytes as redis-py's connections
        take them (connecting first if needed)."""
        self.connect()
        assert self._sock is not None
        try:
            for part in [data] if isinstance(data, (bytes, bytearray)) else data:
                self._sock.sendall(part)
        except TimeoutError as e:
            self.disconnect()
            raise _redis().exceptions.TimeoutError(f"Timeout writing to {self.where()}") from e
        except OSError as e:
            self.disconnect()
            raise _redis().exceptions.ConnectionError(f"Error writing to {self.where()}: {e}") from e

    def send_command(self, *args: Any) -> None:
        self.send_packed_command(self._resp.pack(args))

    def _wait(self) -> None:
        """Read until a whole reply is buffered."""
        replies = self._replies
        r = _redis()
        if self._sock is None:
            raise r.exceptions.ConnectionError(f"no connection to {self.where()} (reading a reply)")
        try:
            while not replies.ready():
                if replies.feed(self._sock) == 0:
                    raise r.exceptions.ConnectionError(f"Connection closed by server {self.where()}")
        except TimeoutError as e:
            self.disconnect()
            raise r.exceptions.TimeoutError(f"Timeout reading from {self.where()}") from e
        except OSError as e:
            self.disconnect()
            raise r.exceptions.ConnectionError(f"Error reading from {self.where()}: {e}") from e
        except self._resp.ProtocolError as e:
            self.disconnect()
            raise r.exceptions.InvalidResponse(f"{self.where()}: {e}") from e
        except BaseException:
            self.disconnect()
            raise

    def read_response(self) -> Any:
        """The next reply: bytes, int, None or a list; an error reply raises."""
        self._wait()
        try:
            return self._replies.reply()
        except self._resp.ReplyError as e:
            raise _error_reply(e.args[0]) from None

    def read_xread(self, kind: int, decode: Callable[[bytes], Any] | None) -> Any:
        """The next reply, an XREAD one, decoded by ``_resp.Replies.xread``."""
        self._wait()
        try:
            return self._replies.xread(kind, decode)
        except self._resp.ReplyError as e:
            raise _error_reply(e.args[0]) from None
        except self._resp.ProtocolError as e:
            self.disconnect()
            raise _redis().exceptions.InvalidResponse(f"{self.where()}: {e}") from e


def text(value: Any) -> str:
    """A reply (bytes or str) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)
