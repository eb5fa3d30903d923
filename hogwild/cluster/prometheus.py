"""Which port each role of a cluster job serves its Prometheus metrics on.

With ``cluster.metrics_port`` set, each role serves its status counters to Prometheus
(:mod:`hogwild.net.metrics`): the driver on ``metrics_port``, then the parameter servers, data
servers and replicas on the ports after it, in that order (:func:`role_ports`).
"""

from __future__ import annotations


def role_ports(first: int, ps: int, data: int, replicas: int) -> dict[str, int]:
    """Role name -> its metrics port: the driver on ``first``, then servers and replicas."""
    names = ["driver", *(f"ps {i}" for i in range(ps)), *(f"data {i}" for i in range(data))]
    names += [f"replica {i}" for i in range(replicas)]
    return {name: first + k for k, name in enumerate(names)}
