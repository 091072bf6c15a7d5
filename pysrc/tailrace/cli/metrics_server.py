"""``--metrics-port``: the Prometheus endpoint of a container or a member."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ConfigError, SetupError

log = logging.getLogger("tailrace.cli")


def _serve_prometheus(source: Any, port: int, host: str, job: str) -> None:
    try:
        from prometheus_client import start_http_server
        from prometheus_client.core import CollectorRegistry
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'tailrace[prometheus]'", key="--metrics-port"
        ) from None
    from ..prometheus import ContainerCollector

    registry = CollectorRegistry()
    registry.register(ContainerCollector(source, job=job))
    try:
        started = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise SetupError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    # prometheus-client >= 0.20 returns (server, thread): for port 0, the port the server took
    server = started[0] if isinstance(started, tuple) else None
    log.info("Prometheus metrics on http://%s:%d/metrics", host, getattr(server, "server_port", port))
