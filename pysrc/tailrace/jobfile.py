"""Job files: a TOML file (or a Python file defining ``job``) describing one job.

Layout (paths are relative to the job file)::

    [job]
    name = "wordcount"                  # required; checkpoints are kept per job name
    task = "wordcount.py:WordCount"     # required: "file.py:Class" or "package.module:Class"
    inputs = ["files.lines"]            # required: "system.stream" names
    engine = "c"                        # optional: "c" (default) or "python"
    default_output = "files"            # optional: system of bare stream names in collector.send

    [config]                            # SEMANTICS keys (tailrace --help lists them)
    "task.window.ms" = 1000

    [systems.files]                     # one table per system; the table name is the system name
    type = "file"                       # "file", "memory", "redis" or "kafka"; other keys are its options
    path = "data"

    [stores.counts]                     # optional: a key-value store of every task (docs/state.md)
    "value.serde" = "int"               # key.serde / value.serde (default json), cache.size;
                                        # an empty table is a store with the defaults

    [checkpoints]                       # optional; default: sqlite at state/checkpoints.db
    type = "sqlite"                     # "sqlite", "memory" or "redis"
    path = "state/checkpoints.db"

A Python job file defines ``job``, a dict of the same shape (``job["job"]["task"]``
may then be the class itself).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .api import check_task_class
from .config import KEYS, Config, check_options, did_you_mean, parse_config
from .container import ENGINES, Container, EngineName, load_engine
from .errors import ConfigError
from .interfaces import CheckpointStore, System
from .types import SystemStreamPartition

JOB_FILE = "job.toml"
DEFAULT_CHECKPOINTS = "state/checkpoints.db"

_TOP = ("job", "config", "systems", "stores", "checkpoints")
_JOB_KEYS = ("name", "task", "inputs", "engine", "default_output")
_CONFIG_NAMES = {k.name for k in KEYS} | {k.name.replace(".", "_") for k in KEYS}
_PATH_OPTIONS = ("path", "output_path")  # options resolved relative to the job file


def _file_system(name: str, options: dict[str, Any]) -> System:
    from .files import FileSystem

    return FileSystem(name, **options)


def _memory_system(name: str, options: dict[str, Any]) -> System:
    from .memory import MemorySystem

    return MemorySystem(name, **options)


def _import_target(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _redis_system(name: str, options: dict[str, Any]) -> System:
    return _import_target("tailrace.redis:RedisSystem")(name, **options)


def _kafka_system(name: str, options: dict[str, Any]) -> System:
    return _import_target("tailrace.kafka:KafkaSystem")(name, **options)


SYSTEM_TYPES: dict[str, Callable[[str, dict[str, Any]], System]] = {
    "file": _file_system,
    "memory": _memory_system,
    "redis": _redis_system,
    "kafka": _kafka_system,
}


def _sqlite_store(options: dict[str, Any]) -> CheckpointStore:
    from .sqlite import SqliteCheckpointStore

    return SqliteCheckpointStore(**options)


def _memory_store(options: dict[str, Any]) -> CheckpointStore:
    from .memory import MemoryCheckpointStore

    return MemoryCheckpointStore(**options)


def _redis_store(options: dict[str, Any]) -> CheckpointStore:
    return _import_target("tailrace.redis:RedisCheckpointStore")(**options)


STORE_TYPES: dict[str, Callable[[dict[str, Any]], CheckpointStore]] = {
    "sqlite": _sqlite_store,
    "memory": _memory_store,
    "redis": _redis_store,
}

# the class behind each type: its keyword arguments are the table's options
_TARGETS = {
    "systems.file": "tailrace.files:FileSystem",
    "systems.memory": "tailrace.memory:MemorySystem",
    "systems.redis": "tailrace.redis:RedisSystem",
    "systems.kafka": "tailrace.kafka:KafkaSystem",
    "checkpoints.sqlite": "tailrace.sqlite:SqliteCheckpointStore",
    "checkpoints.memory": "tailrace.memory:MemoryCheckpointStore",
    "checkpoints.redis": "tailrace.redis:RedisCheckpointStore",
}


def _check_options(target: str, options: Mapping[str, Any], where: str, source: Path) -> None:
    """Refuse an option the table's class does not take, naming it and the options it does."""
    try:
        cls = _import_target(target)
    except (ImportError, AttributeError):
        return  # (the factory itself reports what is missing)
    check_options(cls, options, where=where, also=("type",), skip=("name",), source=str(source))


@dataclass
class JobSpec:
    """A loaded, validated job file. ``container()`` builds the Container to run it."""

    source: Path
    name: str
    task: Any  # "file.py:Class" / "module:Class" or a class/factory
    inputs: list[str]
    engine: EngineName
    config: Config
    tree: dict[str, Any]
    default_output: str | None = None
    systems: dict[str, System] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)  # the --config pairs applied over the file

    @property
    def base(self) -> Path:
        return self.source.parent

    def attributed(self, e: ConfigError) -> ConfigError:
        """``e`` said to come from ``--config KEY=VALUE`` when KEY was given there (a value the
        job file does not hold), else ``e`` itself."""
        if e.source not in (None, str(self.source)):
            return e
        return _attributed(e, self.overrides, str(self.source))

    def checkpoint_store(self) -> CheckpointStore:
        """A new (unopened) store as configured in ``[checkpoints]``."""
        table = dict(self.tree.get("checkpoints") or {"type": "sqlite", "path": DEFAULT_CHECKPOINTS})
        kind = table.pop("type", None)
        make = STORE_TYPES.get(kind) if isinstance(kind, str) else None
        if make is None:
            raise ConfigError(
                f"unknown checkpoint store type {kind!r}",
                key="checkpoints.type",
                allowed=", ".join(STORE_TYPES),
                source=str(self.source),
            )
        _check_options(_TARGETS[f"checkpoints.{kind}"], table, "checkpoints", self.source)
        if kind == "sqlite" and not isinstance(table.get("path"), str):
            raise ConfigError("a sqlite store needs a path", key="checkpoints.path", source=str(self.source))
        for opt in _PATH_OPTIONS:
            if isinstance(table.get(opt), str):
                table[opt] = str(self.base / table[opt])
        return _construct(make, (table,), "checkpoints", self.source)

    def load_task(self) -> Any:
        """The task class (or factory) named by ``job.task``."""
        try:
            return load_task(self.task, self.base, self.source)
        except ConfigError as e:
            attributed = self.attributed(e)
            if attributed is e:
                raise
            raise attributed from e

    def container(
        self,
        *,
        inputs: Sequence[SystemStreamPartition] | None = None,
        checkpoints: CheckpointStore | None = None,
    ) -> Container:
        """A Container for this job (loads the task and engine; ConfigError on failure);
        ``inputs`` and ``checkpoints`` replace the job's (one container of several: its
        partitions, and its store opened as that container)."""
        task = self.load_task()
        try:
            load_engine(self.engine)
        except ImportError as e:
            raise ConfigError(
                f"engine {self.engine!r} is not available in this installation ({e})",
                key="job.engine",
                allowed=", ".join(ENGINES),
                source=str(self.source),
            ) from e
        return Container(
            task,
            inputs=list(inputs) if inputs is not None else self.inputs,
            systems=self.systems,
            config=self.config,
            checkpoints=checkpoints if checkpoints is not None else self.checkpoint_store(),
            engine=self.engine,
            default_output_system=self.default_output,
        )


def resolve_job_path(job: str | Path) -> Path:
    """A job file path: the file itself, or ``<dir>/job.toml``; ConfigError if missing."""
    p = Path(job)
    if p.is_dir():
        p = p / JOB_FILE
        if not p.is_file():
            raise ConfigError(f"directory has no {JOB_FILE}", source=str(p.parent))
    elif not p.is_file():
        raise ConfigError("job file does not exist", source=str(p))
    return p.resolve()


def load_job(
    job: str | Path, overrides: Mapping[str, Any] | None = None, engine: EngineName | None = None
) -> JobSpec:
    """Read and validate a job file; ``overrides`` are ``--config`` pairs, ``engine`` wins over the file.

    A value refused that came from ``overrides`` is said to come from ``--config``."""
    try:
        return _load_job(job, overrides, engine)
    except ConfigError as e:
        attributed = _attributed(e, overrides or {}, e.source)
        if attributed is e:
            raise
        raise attributed from e


def _attributed(e: ConfigError, overrides: Mapping[str, Any], over: str | None) -> ConfigError:
    """``e`` with its source ``--config KEY=VALUE (over FILE)`` when its key was given with
    ``--config``, else ``e`` itself."""
    if e.key is None or e.key not in overrides:
        return e
    source = f"--config {e.key}={overrides[e.key]!r}" + (f" (over {over})" if over else "")
    return ConfigError(e.reason, key=e.key, allowed=e.allowed, source=source)


def _load_job(job: str | Path, overrides: Mapping[str, Any] | None, engine: EngineName | None) -> JobSpec:
    path = resolve_job_path(job)
    src = str(path)
    file_tree = _read_tree(path)
    tree = _apply_overrides(file_tree, dict(overrides or {}), src)
    checkpoints_t = tree.get("checkpoints")
    if isinstance(checkpoints_t, dict) and checkpoints_t and "type" not in checkpoints_t:
        # [checkpoints] path = ... alone (or --config checkpoints.path=...): sqlite, the default type
        tree["checkpoints"] = {"type": "sqlite", **checkpoints_t}
    for top in tree:
        if top not in _TOP:
            raise ConfigError("unknown table", key=top, allowed=", ".join(_TOP), source=src)
    job_t = _table(tree, "job", src, required=True)
    for k in job_t:
        if k not in _JOB_KEYS:
            raise ConfigError(
                f"unknown key{did_you_mean(k, _JOB_KEYS)}",
                key=f"job.{k}",
                allowed=", ".join(_JOB_KEYS),
                source=src,
            )
    name = job_t.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("required: the job's name (a non-empty string)", key="job.name", source=src)
    task = job_t.get("task")
    if task is None or (isinstance(task, str) and ":" not in task):
        raise ConfigError(
            f"required: the task as 'file.py:Class' or 'module:Class', got {task!r}",
            key="job.task",
            source=src,
        )
    inputs = job_t.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise ConfigError(
            f"required: a non-empty list of 'system.stream' names, got {inputs!r}",
            key="job.inputs",
            source=src,
        )
    for eng in (
        job_t.get("engine", "c"),
        engine or "c",
    ):  # the file's engine must be valid even when overridden
        if eng not in ENGINES:
            raise ConfigError(
                f"unknown engine {eng!r}", key="job.engine", allowed=", ".join(ENGINES), source=src
            )
    eng = engine or job_t.get("engine", "c")
    default_output = job_t.get("default_output")
    if default_output is not None and not isinstance(default_output, str):
        raise ConfigError(
            f"expected a system name, got {default_output!r}", key="job.default_output", source=src
        )

    config_t = dict(_table(tree, "config", src))
    _refuse_unquoted_keys(config_t, src)
    if "job.name" in config_t or "job_name" in config_t:
        raise ConfigError("set the job name in [job] name, not in [config]", key="job.name", source=src)
    config_t["job.name"] = name
    stores_t = tree.get("stores")
    if stores_t is not None:
        if not isinstance(stores_t, dict):
            raise ConfigError("expected a table of [stores.NAME] tables", key="stores", source=src)
        config_t["stores"] = stores_t
    config = parse_config(config_t, source=src, unlisted=("job.name",))

    systems: dict[str, System] = {}
    for sname, stable in _table(tree, "systems", src, required=True).items():
        if not isinstance(stable, dict):
            raise ConfigError("expected a table", key=f"systems.{sname}", source=src)
        options = dict(stable)
        kind = options.pop("type", None)
        make = SYSTEM_TYPES.get(kind) if isinstance(kind, str) else None
        file_systems = file_tree.get("systems")
        if kind is None and not (isinstance(file_systems, dict) and sname in file_systems):
            # a table made by --config systems.NAME.OPTION alone: most likely a misspelt system
            given = next(k for k in overrides or {} if f"{k}.".startswith(f"systems.{sname}."))
            known = sorted(file_systems) if isinstance(file_systems, dict) else []
            raise ConfigError(
                f"the job file has no [systems.{sname}] table (its systems: {', '.join(known) or 'none'}); "
                f"a new system needs its type too: --config systems.{sname}.type=TYPE",
                key=given,
                allowed=", ".join(SYSTEM_TYPES),
                source=src,
            )
        if make is None:
            raise ConfigError(
                f"unknown system type {kind!r}",
                key=f"systems.{sname}.type",
                allowed=", ".join(SYSTEM_TYPES),
                source=src,
            )
        _check_options(_TARGETS[f"systems.{kind}"], options, f"systems.{sname}", path)
        for opt in _PATH_OPTIONS:
            if kind == "file" and isinstance(options.get(opt), str):
                options[opt] = str(path.parent / options[opt])
        if kind == "file" and "path" not in options:
            raise ConfigError("a file system needs a path", key=f"systems.{sname}.path", source=src)
        try:
            systems[sname] = _construct(make, (sname, options), f"systems.{sname}", path)
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(str(e), key=f"systems.{sname}", source=src) from e
    for spec in inputs:
        system = spec.partition(".")[0]
        if system not in systems:
            raise ConfigError(
                f"input {spec!r} names unknown system {system!r}",
                key="job.inputs",
                allowed=", ".join(sorted(systems)),
                source=src,
            )
    if default_output is not None and default_output not in systems:
        raise ConfigError(
            f"default_output names unknown system {default_output!r}",
            key="job.default_output",
            allowed=", ".join(sorted(systems)),
            source=src,
        )
    spec = JobSpec(
        path, name, task, list(inputs), eng, config, tree, default_output, systems, dict(overrides or {})
    )
    spec.checkpoint_store()  # validate [checkpoints] now, before anything runs
    return spec


def _read_tree(path: Path) -> dict[str, Any]:
    if path.suffix == ".py":
        module = _load_module(path)
        job = getattr(module, "job", None)
        if not isinstance(job, dict):
            raise ConfigError(
                "a Python job file must define `job`, a dict shaped like job.toml", source=str(path)
            )
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in job.items()}
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read: {e}", source=str(path)) from None
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"not valid UTF-8 (TOML files must be): byte 0x{data[e.start]:02x} at line {line}, "
            f"column {column} (byte offset {e.start})",
            source=str(path),
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=str(path)) from None


def _refuse_unquoted_keys(config_t: Mapping[str, Any], src: str) -> None:
    """``task.window.ms = 1000`` unquoted is a nested table in TOML: say to quote the key."""
    for key, value in config_t.items():
        dotted, leaf = key, value
        while isinstance(leaf, dict) and len(leaf) == 1:
            ((part, leaf),) = leaf.items()
            dotted += f".{part}"
        if isinstance(value, dict):
            shown = "..." if isinstance(leaf, dict) else json.dumps(leaf)
            raise ConfigError(
                f'[config] keys contain dots, so they must be quoted: write "{dotted}" = {shown} '
                "(unquoted, TOML reads the dots as nested tables)",
                key=dotted,
                source=src,
            )


def _table(tree: Mapping[str, Any], name: str, src: str, required: bool = False) -> dict[str, Any]:
    t = tree.get(name)
    if t is None:
        if required:
            raise ConfigError(f"required table [{name}] is missing", key=name, source=src)
        return {}
    if not isinstance(t, dict):
        raise ConfigError("expected a table", key=name, source=src)
    return t


def parse_override(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from ``--config``: VALUE is read as a TOML value when it is one, else a string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--config expects KEY=VALUE, got {item!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def _apply_overrides(tree: dict[str, Any], overrides: dict[str, Any], src: str) -> dict[str, Any]:
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for key, value in overrides.items():
        if key in ("job.name", "job_name"):
            tree.setdefault("job", {})["name"] = value
        elif key in _CONFIG_NAMES:
            tree.setdefault("config", {})[key] = value
        elif key.startswith(("job.", "systems.", "checkpoints.", "stores.")):
            parts = key.split(".")
            node = tree
            for part in parts[:-1]:
                child = node.get(part)
                if not isinstance(child, dict):
                    child = {}
                node[part] = child = dict(child)
                node = child
            node[parts[-1]] = value
        else:
            raise ConfigError(
                "unknown key given with --config",
                key=key,
                allowed="a config key (see tailrace --help), or job.*, systems.<name>.*, stores.<name>.*, "
                "checkpoints.*",
            )
    return tree


def _construct(make: Callable[..., Any], args: tuple[Any, ...], where: str, source: Path) -> Any:
    try:
        return make(*args)
    except TypeError as e:
        raise ConfigError(f"bad options: {e}", key=where, source=str(source)) from e
    except ConfigError as e:
        if e.source:
            raise
        key = e.key or where
        if not key.startswith(where) and not key.startswith(tuple(f"{t}." for t in _TOP)):
            key = f"{where}.{key}"  # an option of this table, as the job file spells it
        raise ConfigError(e.reason, key=key, allowed=e.allowed, source=str(source)) from e


def _load_module(path: Path) -> Any:
    name = f"tailrace_job_{path.stem}_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("cannot load as a Python module", source=str(path))
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # let the task import its neighbours
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"cannot load: {type(e).__name__}: {e}", source=str(path)) from e
    return module


def load_task(task: Any, base: Path, source: Path) -> Any:
    """Resolve ``"file.py:Class"`` (relative to ``base``) or ``"module:Class"``; a class passes through."""
    if not isinstance(task, str):
        if callable(task):
            return task
        raise ConfigError(
            f"expected 'file.py:Class' or a class, got {task!r}", key="job.task", source=str(source)
        )
    target, _, attr = task.rpartition(":")
    if target.endswith(".py"):
        file = base / target
        if not file.is_file():
            raise ConfigError(f"task file {file} does not exist", key="job.task", source=str(source))
        module = _load_module(file)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(
                f"cannot import module {target!r}: {e}", key="job.task", source=str(source)
            ) from e
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(f"{target} defines no {attr!r}", key="job.task", source=str(source))
    if not callable(obj):
        raise ConfigError(f"{task} is not a class or factory", key="job.task", source=str(source))
    if inspect.isclass(obj):
        try:
            check_task_class(obj)  # refusals here, with the file; warnings when the container plans
        except ConfigError as e:
            raise ConfigError(e.reason, key="job.task", source=str(source)) from None
    return obj
