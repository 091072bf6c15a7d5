"""The job a command names: loaded with its ``--config`` overrides, what kind it is (file,
Redis, Kafka), where its checkpoints are, and whether their directory can be written.
"""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path

from ..errors import SetupError
from ..jobfile import JobSpec, load_job, parse_override


def _load_spec(args: argparse.Namespace) -> JobSpec:
    overrides = dict(parse_override(item) for item in getattr(args, "config", []))
    return load_job(args.job, overrides, engine=getattr(args, "engine", None))


def _load(args: argparse.Namespace) -> JobSpec:
    """The job of ``args``, kept as ``args.spec`` too (for describe_task_error, and to say
    which errors found after it was loaded a ``--config`` pair caused)."""
    spec = args.spec = _load_spec(args)
    return spec


def _is_distributed(spec: JobSpec) -> bool:
    table = spec.tree.get("checkpoints") or {}
    return isinstance(table, dict) and table.get("type") == "redis"


def _kafka_systems(spec: JobSpec) -> set[str]:
    """The names of the job's ``kafka`` systems (by their tables' type)."""
    systems = spec.tree.get("systems") or {}
    return {name for name, t in systems.items() if isinstance(t, dict) and t.get("type") == "kafka"}


def _is_kafka(spec: JobSpec) -> bool:
    """True when an input of the job is on a ``kafka`` system."""
    return bool(_kafka_systems(spec) & {name.partition(".")[0] for name in spec.inputs})


def _store_text(spec: JobSpec) -> str:
    t = spec.tree.get("checkpoints") or {"type": "sqlite"}
    path = getattr(spec.checkpoint_store(), "path", None)
    return f"{t.get('type')} {path}" if path is not None else str(t.get("type"))


def _check_state_dir(spec: JobSpec, *, create: bool = True) -> None:
    """One clear line (SetupError, exit 2) when the SQLite store's directory cannot be
    created or written, before SQLite reports it as something else. Changes nothing: a
    missing directory is made by the store when the run opens it, so a run refused
    before that leaves none behind (``create``: whether it could be made is checked;
    false: a missing one is fine, as read-only commands find it); never suggests
    deleting anything."""
    table = spec.tree.get("checkpoints") or {"type": "sqlite"}
    if not isinstance(table, dict) or table.get("type", "sqlite") != "sqlite":
        return
    path = getattr(spec.checkpoint_store(), "path", None)
    if path is None:
        return
    path = Path(path)
    where = "[checkpoints] path in " + str(spec.source)
    state = path.parent
    if not state.is_dir():
        if not create:
            return
        existing = state
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            problem: int | None = errno.EEXIST if existing == state else errno.ENOTDIR
        else:
            problem = None if os.access(existing, os.W_OK | os.X_OK) else errno.EACCES
        if problem is not None:
            raise SetupError(
                f"cannot create the state directory {state} ({os.strerror(problem)}); create it with "
                f"write permission for this user, or point {where} at a writable directory"
            )
        return  # nothing in it yet to check
    if not os.access(state, os.W_OK | os.X_OK):
        held = " (the checkpoints in it are intact)" if path.exists() else ""
        raise SetupError(
            f"state directory {state} is not writable by this user{held}: the checkpoint store "
            f"{path.name} needs to write its lock, -wal and -shm files there; make the directory "
            f"writable, run as its owner, or point {where} at a writable directory"
        )
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if f.exists() and not os.access(f, os.R_OK | os.W_OK):
            raise SetupError(
                f"checkpoint file {f} is not readable and writable by this user (the checkpoints in "
                "it are intact); fix its permissions or run as its owner"
            )
