"""The hosts tier: several hosts on one machine as network namespaces (:mod:`tests.hosts.harness`).

``from tests.hosts import Hosts`` is the harness's API for tests and benchmarks alike.
"""

from tests.hosts.harness import Hosts, HostsError, sweep_stale, unavailable

__all__ = ["Hosts", "HostsError", "sweep_stale", "unavailable"]
