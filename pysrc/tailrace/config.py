"""The one config parser.

Accepts Samza's keys as-is (``task.max.concurrency``) and their snake_case
keyword equivalents (``task_max_concurrency``). Every key is checked at start-up:
an unknown key, a value of the wrong type or out of range raises ConfigError
naming the key and the allowed values. Nothing starts with a half-valid config.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec

from .errors import ConfigError


def _int(key: str, value: Any, minimum: int, maximum: int, note: str = "") -> int:
    """``value`` (an int, or its decimal text) checked to lie in ``minimum..maximum``; every
    error states both bounds (and ``note``, what some values mean)."""
    allowed = f"an integer from {minimum} to {maximum}{note}"
    if isinstance(value, bool):
        raise ConfigError(f"expected an integer, got {value!r}", key=key, allowed=allowed)
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ConfigError(f"expected an integer, got {value!r}", key=key, allowed=allowed) from None
    if not isinstance(value, int):
        raise ConfigError(
            f"expected an integer, got {type(value).__name__} {value!r}", key=key, allowed=allowed
        )
    if not minimum <= value <= maximum:
        raise ConfigError(f"{value} is out of range", key=key, allowed=allowed)
    return value


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"expected a boolean, got {value!r}", key=key, allowed="true, false")


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"expected a non-empty string, got {value!r}", key=key)
    return value.strip()


def _names(key: str, value: Any) -> tuple[str, ...]:
    allowed = "a comma-separated list of exception class names, or *"
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise ConfigError(f"expected a list of names, got {value!r}", key=key, allowed=allowed)
    items = [v for v in items if v]
    for item in items:
        if item != "*" and not all(part.isidentifier() for part in item.split(".")):
            raise ConfigError(f"{item!r} is not an exception class name", key=key, allowed=allowed)
    return tuple(items)


# a period in ms is a 32-bit int (the engines hold it in ns, an int64: this always fits)
_MINI = -(2**31)
_MAXI = 2**31 - 1

ORDERINGS = ("partition", "key")
ERROR_POLICIES = ("fail", "skip", "dead-letter")
GUARANTEES = ("at-least-once", "exactly-once")


def _one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        allowed = ", ".join(choices)
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise ConfigError(f"expected one of {allowed}, got {value!r}", key=key, allowed=allowed)

    return parse


_ordering = _one_of(ORDERINGS)


def _error_policy(key: str, value: Any) -> str:
    allowed = ", ".join(ERROR_POLICIES)
    if isinstance(value, str):
        v = value.strip().lower().replace("_", "-")
        if v in ERROR_POLICIES:
            return v
        if v == "deadletter":
            return "dead-letter"
    raise ConfigError(f"expected one of {allowed}, got {value!r}", key=key, allowed=allowed)


TIMESTAMP_UNITS = ("ms", "s", "us", "ns", "iso8601")


def _timestamp_unit(key: str, value: Any) -> str:
    allowed = ", ".join(TIMESTAMP_UNITS)
    if isinstance(value, str):
        v = value.strip().lower().replace("-", "")
        if v in TIMESTAMP_UNITS:
            return v
    raise ConfigError(f"expected one of {allowed}, got {value!r}", key=key, allowed=allowed)


def _timestamp_field(key: str, value: Any) -> str:
    allowed = 'the name of a field of the messages (JSON objects), or "" for none'
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise ConfigError(f"expected a field name, got {value!r}", key=key, allowed=allowed)


def _error_stream(key: str, value: Any) -> str:
    allowed = '"system.stream" (a system of the job and a stream in it), or "" for none'
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        system, dot, stream = value.strip().partition(".")
        if dot and system and stream:
            return f"{system}.{stream}"
    raise ConfigError(f"expected system.stream, got {value!r}", key=key, allowed=allowed)


class _Key:
    """One config key (a plain class: a dataclass would cost every run ~1 ms of import)."""

    __slots__ = ("attr", "default", "doc", "name", "parse")

    def __init__(
        self, name: str, attr: str, default: Any, parse: Callable[[str, Any], Any], doc: str
    ) -> None:
        self.name = name
        self.attr = attr
        self.default = default
        self.parse = parse
        self.doc = doc

    def __repr__(self) -> str:
        return f"_Key({self.name!r})"


def _ranged(minimum: int, maximum: int, note: str = "") -> Callable[[str, Any], int]:
    return lambda key, value: _int(key, value, minimum, maximum, note)


KEYS: tuple[_Key, ...] = (
    _Key("job.name", "job_name", "tailrace-job", _str, "job name (checkpoints are kept per job)"),
    _Key(
        "task.max.concurrency",
        "max_concurrency",
        1,
        _ranged(1, 1 << 20),
        "max outstanding callbacks per task",
    ),
    _Key(
        "job.container.thread.pool.size",
        "thread_pool_size",
        0,
        _ranged(0, 1024),
        "threads running sync process (0 = the loop thread)",
    ),
    _Key(
        "job.container.count",
        "container_count",
        1,
        _ranged(1, 1024),
        "processes `tailrace run` starts for the job; task N runs in container N mod count",
    ),
    _Key("task.window.ms", "window_ms", -1, _ranged(_MINI, _MAXI, "; <= 0 disables"), "window period"),
    _Key(
        "task.commit.ms",
        "commit_ms",
        60000,
        _ranged(_MINI, _MAXI, "; <= 0 disables timer commits"),
        "commit period",
    ),
    _Key(
        "task.ordering",
        "ordering",
        "partition",
        _ordering,
        "order kept per partition, or per key inside a partition (rules 30, 31)",
    ),
    _Key("task.async.commit", "async_commit", False, _bool, "allow commit while callbacks are outstanding"),
    _Key(
        "task.output.guarantee",
        "output_guarantee",
        "at-least-once",
        _one_of(GUARANTEES),
        "outputs at-least-once, or exactly-once: held until the commit that passes their messages (rule 41)",
    ),
    _Key(
        "task.callback.timeout.ms",
        "callback_timeout_ms",
        -1,
        _ranged(_MINI, _MAXI, "; <= 0 disables"),
        "per-callback deadline",
    ),
    _Key(
        "task.max.idle.ms",
        "max_idle_ms",
        10,
        _ranged(0, _MAXI),
        "longest idle wait before re-polling inputs",
    ),
    _Key(
        "task.shutdown.ms",
        "shutdown_ms",
        30000,
        _ranged(0, _MAXI),
        "graceful-shutdown wait for outstanding callbacks",
    ),
    _Key(
        "task.ignored.exceptions",
        "ignored_exceptions",
        (),
        _names,
        "exception class names (or *) counted and skipped in sync process/window",
    ),
    _Key(
        "task.error.policy",
        "error_policy",
        "fail",
        _error_policy,
        "what a bad message does: fail (stop), skip (count), dead-letter (send to task.error.stream)",
    ),
    _Key(
        "task.error.stream",
        "error_stream",
        "",
        _error_stream,
        "system.stream receiving dead letters (task.error.policy = dead-letter)",
    ),
    _Key(
        "task.error.retries",
        "error_retries",
        0,
        _ranged(0, 100),
        "attempts of a failing process before task.error.policy applies",
    ),
    _Key(
        "task.error.retry.backoff.ms",
        "error_retry_backoff_ms",
        100,
        _ranged(0, 600_000),
        "wait before the first retry; doubled for each further one",
    ),
    _Key(
        "task.timestamp.field",
        "timestamp_field",
        "",
        _timestamp_field,
        "message field holding the event time (rule 32); empty: the task's timestamp method, "
        "the system's record time or ingestion time",
    ),
    _Key(
        "task.timestamp.unit",
        "timestamp_unit",
        "ms",
        _timestamp_unit,
        "unit of task.timestamp.field: ms, s, us, ns (numbers since the epoch) or iso8601 (a string)",
    ),
    _Key(
        "task.watermark.lag.ms",
        "watermark_lag_ms",
        0,
        _ranged(0, _MAXI),
        "bounded out-of-orderness: subtracted from a partition's largest timestamp (rule 33)",
    ),
    _Key(
        "task.watermark.idle.ms",
        "watermark_idle_ms",
        60000,
        _ranged(_MINI, _MAXI, "; <= 0: a partition is never idle"),
        "wall time after which a partition with nothing to read stops holding the event-time "
        "watermark (rule 33)",
    ),
    _Key(
        "task.input.buffer.size",
        "input_buffer_size",
        1024,
        _ranged(1, 1 << 24),
        "messages buffered ahead of dispatch per partition (backpressure beyond)",
    ),
)

_BY_NAME = {k.name: k for k in KEYS}
_BY_SNAKE = {k.name.replace(".", "_"): k for k in KEYS}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the known name closest to a misspelled ``name``
    (difflib, as a misspelled hook's warning), or ``""`` when none is close: the end of an
    "unknown key" reason, before the list of allowed names."""
    import difflib  # here: only an error pays the import

    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f"; did you mean {match[0]!r}?" if match else ""


# -- state stores (rules 25-29): ``stores.NAME.<option>`` --------------------------------
DEFAULT_CACHE_SIZE = 100_000
_STORE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
STORE_OPTIONS: dict[str, str] = {
    "key.serde": "the serde of keys (range scans follow the order of the encoded keys)",
    "value.serde": "the serde of values",
    "cache.size": "entries cached per task; writes wait in memory to commit",
}


@dataclass(frozen=True)
class StoreSpec:
    """One declared key-value store: serde names and the per-task cache size (entries)."""

    key_serde: str = "json"
    value_serde: str = "json"
    cache_size: int = DEFAULT_CACHE_SIZE

    def as_options(self) -> dict[str, Any]:
        return {"key.serde": self.key_serde, "value.serde": self.value_serde, "cache.size": self.cache_size}


def _serde_name(key: str, value: Any) -> str:
    from .serdes import NAMES, SerdeError, serde

    if not isinstance(value, str) or value not in NAMES:
        raise ConfigError(f"unknown serde {value!r}", key=key, allowed=", ".join(NAMES))
    try:
        serde(value)
    except SerdeError as e:  # msgpack without msgpack installed
        raise ConfigError(str(e), key=key, allowed=", ".join(NAMES)) from None
    return value


def _store_name(key: str, name: Any) -> str:
    if not isinstance(name, str) or not _STORE_NAME.fullmatch(name):
        raise ConfigError(
            f"bad store name {name!r}",
            key=key,
            allowed="a name of letters, digits, '_' and '-', not starting with a digit or '-'",
        )
    return name


def _store_option(store: str, option: str, value: Any) -> tuple[str, Any]:
    key = f"stores.{store}.{option}"
    if option == "key.serde":
        return "key_serde", _serde_name(key, value)
    if option == "value.serde":
        return "value_serde", _serde_name(key, value)
    if option == "cache.size":
        return "cache_size", _int(key, value, 1, 1 << 40, " (entries)")
    allowed = [f"stores.{store}.{o}" for o in STORE_OPTIONS]
    raise ConfigError(
        f"unknown store option{did_you_mean(key, allowed)}", key=key, allowed=", ".join(allowed)
    )


def _store_tables(key: str, value: Any) -> dict[str, dict[str, Any]]:
    """The structured form ``stores = {NAME: {option: value}}`` (job files, Container(stores=...));
    a list of names declares stores with defaults."""
    if isinstance(value, (list, tuple)):
        return {_store_name(key, n): {} for n in value}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"expected a table of stores, got {value!r}", key=key, allowed="{NAME: {option: value}}"
        )
    out: dict[str, dict[str, Any]] = {}
    for name, options in value.items():
        _store_name(f"{key}.{name}", name)
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"expected a table of options, got {options!r}",
                key=f"{key}.{name}",
                allowed=", ".join(STORE_OPTIONS),
            )
        flat: dict[str, Any] = {}
        for opt, v in options.items():
            # TOML reads `key.serde = "str"` as a nested table {"key": {"serde": "str"}}
            if isinstance(v, Mapping):
                for sub, w in v.items():
                    flat[f"{opt}.{sub}"] = w
            else:
                flat[str(opt)] = v
        out[name] = flat
    return out


def _parse_stores(entries: list[tuple[str, str, str, Any]]) -> dict[str, StoreSpec]:
    """``(source key, store, option, value)`` tuples into validated specs (option "" declares)."""
    found: dict[str, dict[str, Any]] = {}
    seen: dict[tuple[str, str], str] = {}
    for raw, store, option, value in entries:
        fields = found.setdefault(store, {})
        if not option:
            continue
        if (store, option) in seen:
            raise ConfigError(
                f"given twice (as {seen[store, option]!r} and {raw!r})", key=f"stores.{store}.{option}"
            )
        seen[store, option] = raw
        attr, parsed = _store_option(store, option, value)
        fields[attr] = parsed
    return {name: StoreSpec(**fields) for name, fields in found.items()}


@dataclass(frozen=True)
class Config:
    """Validated run-loop configuration. Build it with :func:`parse_config`."""

    job_name: str = "tailrace-job"
    max_concurrency: int = 1
    thread_pool_size: int = 0
    container_count: int = 1
    window_ms: int = -1
    commit_ms: int = 60000
    async_commit: bool = False
    ordering: str = "partition"
    output_guarantee: str = "at-least-once"
    callback_timeout_ms: int = -1
    max_idle_ms: int = 10
    shutdown_ms: int = 30000
    ignored_exceptions: tuple[str, ...] = ()
    error_policy: str = "fail"
    error_stream: str = ""
    error_retries: int = 0
    error_retry_backoff_ms: int = 100
    input_buffer_size: int = 1024
    timestamp_field: str = ""
    timestamp_unit: str = "ms"
    watermark_lag_ms: int = 0
    watermark_idle_ms: int = 60000
    stores: Mapping[str, StoreSpec] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # not a config key: the part of task.shutdown.ms a graceful stop keeps for its final
    # commit (a member of a distributed job, whose whole stop task.shutdown.ms bounds)
    stop_reserve_ms: int = 0

    @property
    def exactly_once(self) -> bool:
        """task.output.guarantee = exactly-once (rule 41)."""
        return self.output_guarantee == "exactly-once"

    @property
    def drain_ms(self) -> int:
        """How long a graceful stop awaits outstanding callbacks (rule 19): task.shutdown.ms,
        less what a distributed job's member keeps for the final commit."""
        return max(0, self.shutdown_ms - self.stop_reserve_ms)

    def drain_text(self) -> str:
        """The drain's length as log lines say it."""
        if self.stop_reserve_ms <= 0:
            return f"task.shutdown.ms={self.shutdown_ms}"
        return (
            f"{self.drain_ms} ms (task.shutdown.ms={self.shutdown_ms}, less {self.stop_reserve_ms} ms "
            "kept for the final commit)"
        )

    def as_samza(self) -> dict[str, Any]:
        """The config as Samza-style ``key: value`` pairs."""
        out = {k.name: getattr(self, k.attr) for k in KEYS}
        for name, spec in self.stores.items():
            for option, value in spec.as_options().items():
                out[f"stores.{name}.{option}"] = value
        return out

    def ignores(self, exc: BaseException) -> bool:
        """True when ``exc`` is listed in ``task.ignored.exceptions`` (rule 16)."""
        names = self.ignored_exceptions
        if not names:
            return False
        if "*" in names:
            return True
        for cls in type(exc).__mro__:
            if cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names:
                return True
        return False


def parse_config(
    config: Mapping[str, Any] | Config | None = None,
    /,
    *,
    source: str | None = None,
    allow_prefixes: tuple[str, ...] = (),
    unlisted: tuple[str, ...] = (),
    **kwargs: Any,
) -> Config:
    """Validate Samza-style keys and snake_case keywords into a :class:`Config`.

    ``allow_prefixes`` lets keys under those prefixes (e.g. ``"systems."``) pass
    into ``Config.extra`` untouched for their owners to validate. ``unlisted`` keys
    are still parsed but left out of the keys an unknown key's error offers (a job
    file's ``[config]`` does not take ``job.name``). Raises
    ConfigError for an unknown key, a duplicate (both spellings given), a wrong
    type or an out-of-range value.
    """
    if isinstance(config, Config):
        if not kwargs:
            return config
        base: dict[str, Any] = config.as_samza()
        base.update(config.extra)
    else:
        base = dict(config or {})
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    seen: dict[str, str] = {}
    store_entries: list[tuple[str, str, str, Any]] = []
    items = list(base.items()) + list(kwargs.items())
    for raw_key, value in items:
        if not isinstance(raw_key, str):
            raise ConfigError(f"config keys must be strings, got {raw_key!r}", source=source)
        if raw_key == "stores" or raw_key.startswith("stores."):
            try:
                store_entries.extend(_store_keys(raw_key, value))
            except ConfigError as e:
                if source and not e.source:
                    raise ConfigError(e.reason, key=e.key, allowed=e.allowed, source=source) from None
                raise
            continue
        key = _BY_NAME.get(raw_key) or _BY_SNAKE.get(raw_key)
        if key is None:
            if any(raw_key.startswith(p) for p in allow_prefixes):
                extra[raw_key] = value
                continue
            offered = [k.name for k in KEYS if k.name not in unlisted]
            snake = [k.name.replace(".", "_") for k in KEYS if k.name not in unlisted]
            raise ConfigError(
                f"unknown key{did_you_mean(raw_key, offered + snake)}",
                key=raw_key,
                allowed=", ".join(offered + [f"stores.NAME.{o}" for o in STORE_OPTIONS]),
                source=source,
            )
        if key.name in seen and seen[key.name] != raw_key:
            raise ConfigError(
                f"given twice (as {seen[key.name]!r} and {raw_key!r})", key=key.name, source=source
            )
        seen[key.name] = raw_key
        try:
            values[key.attr] = key.parse(key.name, value)
        except ConfigError as e:
            if source and not e.source:
                raise ConfigError(e.reason, key=e.key, allowed=e.allowed, source=source) from None
            raise
    try:
        stores = _parse_stores(store_entries)
    except ConfigError as e:
        if source and not e.source:
            raise ConfigError(e.reason, key=e.key, allowed=e.allowed, source=source) from None
        raise
    if stores and values.get("async_commit"):  # rule 27: the project refuses the combination
        raise ConfigError(
            f"task.async.commit=true cannot be combined with state stores ({', '.join(sorted(stores))}): "
            "a store commit must not include the effect of a message above the low watermark",
            key="task.async.commit",
            allowed="false while stores.* are declared (or declare no stores.NAME.*)",
            source=source,
        )
    if values.get("timestamp_unit", "ms") != "ms" and not values.get("timestamp_field"):
        raise ConfigError(
            f"task.timestamp.unit is {values['timestamp_unit']!r} but task.timestamp.field is not set: "
            "the unit applies to that field only",
            key="task.timestamp.unit",
            allowed="ms (the default) unless task.timestamp.field names a field",
            source=source,
        )
    policy = values.get("error_policy", "fail")
    if policy == "dead-letter" and not values.get("error_stream"):
        raise ConfigError(
            "task.error.policy = dead-letter needs the stream that receives the dead letters",
            key="task.error.stream",
            allowed='"system.stream", e.g. "files.dead-letters"',
            source=source,
        )
    if values.get("error_stream") and policy != "dead-letter":
        raise ConfigError(
            f"task.error.stream is set but task.error.policy is {policy!r}: nothing would be sent there",
            key="task.error.policy",
            allowed="dead-letter (with task.error.stream), or leave task.error.stream unset",
            source=source,
        )
    if values.get("output_guarantee") == "exactly-once" and values.get("async_commit"):
        # rule 41 as rule 27: a commit while callbacks are outstanding would publish the outputs
        # of messages it does not pass
        raise ConfigError(
            "task.async.commit=true cannot be combined with task.output.guarantee=exactly-once: "
            "a commit must not publish the outputs of a message above the low watermark",
            key="task.output.guarantee",
            allowed="at-least-once while task.async.commit=true (or task.async.commit=false)",
            source=source,
        )
    return dataclasses.replace(Config(), extra=extra, stores=stores, **values)


def _store_keys(raw_key: str, value: Any) -> list[tuple[str, str, str, Any]]:
    """``stores`` (structured), ``stores.NAME`` (a table) or ``stores.NAME.OPTION`` into entries."""
    if raw_key == "stores":
        tables = _store_tables("stores", value)
    else:
        rest = raw_key[len("stores.") :]
        name, dot, option = rest.partition(".")
        if not dot:
            tables = _store_tables("stores", {name: value})
        else:
            _store_name(raw_key, name)
            if option not in STORE_OPTIONS:
                _store_option(name, option, value)  # raises, naming the allowed options
            tables = {name: {option: value}}
    entries: list[tuple[str, str, str, Any]] = []
    for name, options in tables.items():
        entries.append((raw_key, name, "", None))
        for option, v in options.items():
            # where it was given, for a duplicate's error: the flat key, or the stores table
            where = (
                f"stores.{name}.{option}"
                if raw_key != "stores"
                else f"stores={{{name!r}: {{{option!r}: ...}}}}"
            )
            entries.append((where, name, option, v))
    return entries


def describe_keys(skip: tuple[str, ...] = ()) -> str:
    """A table of every key (but those in ``skip``), its default and meaning (for ``--help``)."""
    keys = [k for k in KEYS if k.name not in skip]
    width = max(len(k.name) for k in keys)
    lines = [f"  {k.name:<{width}}  default {k.default!r}: {k.doc}" for k in keys]
    defaults = StoreSpec().as_options()
    for option, doc in STORE_OPTIONS.items():
        lines.append(f"  {'stores.NAME.' + option:<{width}}  default {defaults[option]!r}: {doc}")
    return "\n".join(lines)


@functools.cache
def _keywords(target: Callable[..., Any]) -> tuple[str, ...] | None:
    """The names ``target`` takes by keyword, in order (None: any name, or not inspectable)."""
    try:
        params = inspect.signature(target).parameters
    except (ValueError, TypeError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n, p in params.items() if p.kind in named and n != "self")


def check_options(
    target: Callable[..., Any],
    options: Iterable[str],
    *,
    where: str | None = None,
    also: Sequence[str] = (),
    skip: Sequence[str] = (),
    source: str | None = None,
) -> None:
    """Refuse an option that ``target`` (a class, or its ``__init__``) does not take by
    keyword: ConfigError naming it (``where.option``, or the option alone) and listing the
    options it takes, ``also`` first and ``skip`` left out. The one check of a job file
    table's options and of the keywords of the classes behind them."""
    names = _keywords(target)
    if names is None:
        return
    allowed = [n for n in names if n not in skip]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            + did_you_mean(unknown[0], [*also, *allowed]),
            key=f"{where}.{unknown[0]}" if where else unknown[0],
            allowed=", ".join([*also, *allowed]),
            source=source,
        )


_P = ParamSpec("_P")


def options_checked(init: Callable[_P, None]) -> Callable[_P, None]:
    """Decorate the ``__init__`` of a class that a job file table configures (a system, a
    checkpoint store): an unknown keyword raises ConfigError naming it and listing the
    options (docs/python-jobs.md), as in a job file, instead of Python's TypeError."""

    @functools.wraps(init)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> None:
        if kwargs:
            check_options(init, kwargs)
        init(*args, **kwargs)

    return checked
