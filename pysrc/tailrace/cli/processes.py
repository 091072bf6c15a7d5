"""The container processes of ``--containers N``: how many, the metrics port of each, and the
processes themselves (forks of this one, or ``tailrace run`` processes) with their output
prefixed ``[container i]``.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from ..errors import ConfigError
from ..jobfile import JobSpec
from .signals import _SIGNALS

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger("tailrace.cli")


_MAX_PORT = 65535


def _container_count(args: argparse.Namespace, spec: JobSpec) -> int:
    """``--containers`` when given (it wins), else the job's ``job.container.count``;
    ConfigError when container i of them could not serve its metrics on ``--metrics-port`` + i."""
    n = args.containers
    if n is None:
        n = spec.config.container_count
    elif n < 1 or n > 1024:
        raise ConfigError(
            f"{n} is not a container count", key="--containers", allowed="an integer from 1 to 1024"
        )
    port = args.metrics_port
    if port and port + n - 1 > _MAX_PORT:
        raise ConfigError(
            f"{port} leaves no port for container {n - 1} of {n} ({_count_key(args)} {n}: "
            f"container i serves on PORT+i, up to {port + n - 1})",
            key="--metrics-port",
            allowed=f"0 (a free port each) or 1 to {_MAX_PORT - n + 1}",
        )
    return int(n)


def _count_key(args: argparse.Namespace) -> str:
    return "--containers" if args.containers is not None else "job.container.count"


def _container_port(port: int, i: int) -> int:
    """Container ``i``'s metrics port: PORT + i; with PORT 0, 0 for each (a free port each)."""
    return port + i if port else 0


def _metrics_argv(args: argparse.Namespace, i: int) -> list[str]:
    """``--metrics-port`` of container ``i``."""
    if args.metrics_port is None:
        return []
    return ["--metrics-port", str(_container_port(args.metrics_port, i)), "--metrics-host", args.metrics_host]


def _log_metrics_ports(args: argparse.Namespace, count: int) -> None:
    if args.metrics_port == 0:
        log.info("Prometheus metrics of each container on a free port (each container logs its own)")
    elif args.metrics_port is not None:
        log.info(
            "Prometheus metrics of container i on http://%s:%d+i/metrics (ports %d..%d)",
            args.metrics_host,
            args.metrics_port,
            args.metrics_port,
            args.metrics_port + count - 1,
        )


class _Forked:
    """A container forked from this process (``_ContainerProcesses.fork``): the part of
    ``subprocess.Popen`` that ``_ContainerProcesses`` uses. Reaping and signalling take
    one lock, so a signal never goes to a pid already reaped (and perhaps reused)."""

    def __init__(self, pid: int, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, flags)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        if self.returncode is None:
            try:  # wait for the end without reaping, outside the lock (a signal may come meanwhile)
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # reaped by another thread meanwhile
        code = self._reap(0)
        assert code is not None
        return code

    def send_signal(self, signum: int) -> None:
        with self._lock:
            if self.returncode is None:
                os.kill(self.pid, signum)


class _ContainerProcesses:
    """The container processes of ``--containers N``: forks of this process (a file job)
    or ``tailrace run`` processes (a Redis or Kafka job). Every line they print is
    prefixed ``[container i]`` and written whole, so containers never interleave
    mid-line. Each runs in its own process group: a terminal's Ctrl-C reaches the parent
    only, which forwards it once (a container that got it twice, from the terminal and
    from the parent, would force-stop)."""

    def __init__(self, count: int) -> None:
        self.procs: dict[int, subprocess.Popen[bytes] | _Forked] = {}
        self._width = len(str(count - 1))
        self._write_lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self._unpumped: list[int] = []
        self._parent_fds: list[int] = []  # what a later fork must close: the pipes of the earlier ones

    def start(
        self, i: int, argv: list[str], env: dict[str, str], pass_fds: Sequence[int] = ()
    ) -> subprocess.Popen[bytes]:
        import subprocess  # here: only containers of a distributed job are started this way

        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            pass_fds=tuple(pass_fds),
        )
        self.procs[i] = proc
        self._unpumped.append(i)
        self.start_pumps()
        return proc

    def fork(self, i: int, body: Callable[[], int], parent_fds: Sequence[int] = ()) -> _Forked:
        """Fork container ``i``, which runs ``body()`` and exits with its status; it closes
        ``parent_fds`` (this process's ends of its pipes) and those of the earlier forks.
        Call before this process starts any thread; then ``start_pumps``."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write what is buffered a second time
        pid = os.fork()
        if pid == 0:  # the container: never returns into the parent's frames
            code = 70  # EX_SOFTWARE: body() itself failed
            try:
                _SIGNALS.reset()
                os.setpgid(0, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (out_r, err_r, out_w, err_w, *self._parent_fds, *parent_fds):
                    os.close(fd)
                code = body()
            except BaseException:  # noqa: BLE001 - the child's last word
                traceback.print_exc()
            finally:
                try:
                    atexit._run_exitfuncs()  # as a process of its own would at exit (logging's flush)
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        try:
            os.setpgid(pid, pid)  # from both sides: whichever runs first (a shell does the same)
        except OSError:
            pass  # it already did, or already exited
        os.close(out_w)
        os.close(err_w)
        self._parent_fds += [out_r, err_r, *parent_fds]
        proc = _Forked(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
        self.procs[i] = proc
        self._unpumped.append(i)
        return proc

    def start_pumps(self) -> None:
        """Copy the output of the containers started since the last call, line by line."""
        for i in self._unpumped:
            proc = self.procs[i]
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=self._pump, args=(i, stream, out), daemon=True)
                t.start()
                self._pumps.append(t)
        self._unpumped.clear()

    def _pump(self, i: int, stream: Any, out: TextIO) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue  # a prefix alone says nothing
            with self._write_lock:
                out.write(f"[container {i:>{self._width}}] {line}\n")
                out.flush()

    def watch(self) -> threading.Event:
        """An event set each time a container ends (its ``returncode`` is set first)."""
        ended = threading.Event()

        def waiter(p: subprocess.Popen[bytes] | _Forked) -> None:
            p.wait()
            ended.set()

        for p in self.procs.values():
            threading.Thread(target=waiter, args=(p,), daemon=True).start()
        return ended

    def terminate(self) -> None:
        """SIGTERM to every container still running (a graceful stop; a second one forces)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def join_pumps(self) -> None:
        for t in self._pumps:
            t.join(timeout=5)
