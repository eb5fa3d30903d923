"""A role's status counters as Prometheus gauges, served over HTTP on loopback.

Every long-lived role (a parameter server, a data server, a replica, a job's driver) answers a
status request with a JSON object of counters. :func:`serve_metrics` also serves that object to
Prometheus (``prometheus-client``, the ``cluster`` extra): each scrape asks the role for its status
at that moment; numbers become gauges named ``hogwild_<kind>_<key>`` with a ``role`` label
(``"ps 0"``, ``"replica 1"``; a data server's is its address), and a dictionary of numbers (a
histogram) one gauge with a ``key`` label. The endpoint always binds 127.0.0.1: it has no
authentication, so beyond loopback it is reached from the node itself (a Prometheus agent there,
or a tunnel), never from the network. Which port each role of a cluster job takes is decided
by the cluster.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from hogwild.errors import ConfigError

_NAME = re.compile(r"[^a-zA-Z0-9_]")


def gauges(kind: str, role: str, status: dict) -> list:
    """The gauge families of one status object (numbers, and dictionaries of numbers)."""
    from prometheus_client.core import GaugeMetricFamily

    families = []
    for key, value in sorted(status.items()):
        name = f"hogwild_{kind}_{_NAME.sub('_', str(key))}"
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float) and math.isfinite(value):
            family = GaugeMetricFamily(name, f"{kind} status: {key}", labels=["role"])
            family.add_metric([role], float(value))
            families.append(family)
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.values())
        ):
            family = GaugeMetricFamily(name, f"{kind} status: {key}", labels=["role", "key"])
            for sub, number in sorted(value.items()):
                family.add_metric([role, str(sub)], float(number))
            families.append(family)
    return families


class MetricsEndpoint:
    """An HTTP endpoint serving ``status()`` as gauges until :meth:`close`.

    Args:
        kind: ``driver``, ``ps``, ``data`` or ``replica`` (the metric names' prefix).
        role: The role's name (the ``role`` label), e.g. ``"ps 1"``.
        port: TCP port to listen on.
        status: Returns the role's status object; called on every scrape (from the endpoint's
            thread: it must be safe to call from there).

    Raises:
        ConfigError: prometheus-client is not installed, or the port cannot be bound.
    """

    def __init__(self, kind: str, role: str, port: int, status: Callable[[], dict]) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigError(
                "cluster.metrics_port needs prometheus-client: pip install -e '.[cluster]'"
            ) from None

        class Collector:
            def collect(self):
                try:
                    found = status()
                except Exception:  # a role stopping: an empty scrape, never a failed thread
                    return []
                return gauges(kind, role, found if isinstance(found, dict) else {})

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector())
        try:
            self.server, self.thread = start_http_server(port, "127.0.0.1", self.registry)
        except OSError as exc:
            raise ConfigError(
                f"{role}: cannot serve metrics on 127.0.0.1:{port} ({exc}); choose another "
                "cluster.metrics_port"
            ) from None
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_metrics(kind: str, role: str, port: int, status) -> MetricsEndpoint | None:
    """A :class:`MetricsEndpoint`, or None when ``port`` is 0 (metrics off)."""
    return MetricsEndpoint(kind, role, port, status) if port else None
