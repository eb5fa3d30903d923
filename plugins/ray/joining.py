"""Joining the Ray cluster a job runs on, or starting one of the driver's own.

The driver joins the Ray cluster ``cluster.ray_address`` names, else the one ``RAY_ADDRESS``
names, else starts a Ray instance of its own on this host (with as many logical CPUs as the
job asks for, at least this host's cores), and leaves it when the job is over. Ray binds its
gRPC ports on every interface and will not put a node started by ``ray.init`` on loopback (it
swaps 127.0.0.1 for the host's address), so what guards the driver's own instance is Ray's
token authentication, which Ray turns on for a new local instance unless ``RAY_AUTH_MODE`` says
otherwise. Joining a cluster under token authentication needs no setting: when
``RAY_AUTH_MODE`` is unset, the driver asks the cluster's GCS once without a token and, refused,
turns token mode on with the token found here (:data:`TOKEN_PLACES`), or says that none is; an
address where nothing accepts a connection is refused at once (Ray would retry for a minute). A
job whose roles ask more CPUs than the cluster's live nodes have in all (or a replica more than
its largest node) is refused at once, with what it needs and what there is.

``cluster.ray_address`` is a Ray cluster's GCS address (``HOST:PORT``, what ``ray start
--head`` prints); Ray Client (``ray://``) addresses are not supported, as the driver must be on
a node of the cluster (it compares nodes with its own).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

import ray

from hogwild.errors import ConfigError

__all__ = ["check_room", "join_ray", "needed_cpus", "ray_address"]

REACH_S = 5.0  # a GCS that does not accept a connection within this is not there
TOKEN_PLACES = "~/.ray/auth_token, a file named by RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN"


def join_ray(cluster, per_replica: int, members: int = 0, spread: bool = False) -> None:
    """Join the Ray cluster :func:`ray_address` names, or start one of the driver's own on this
    host (with the job's CPUs, at least this host's cores), and check it has room for the job.

    Raises:
    ConfigError: A Ray Client address, an address where nothing answers, a token asked for
        and none here, Ray refusing to start or join, or too few CPUs (Ray is left then).
    """
    address = ray_address(cluster)
    if address.startswith("ray://"):
        raise ConfigError(
            f"cluster.ray_address = {address!r}: Ray Client addresses are not supported; "
            "run the driver on a node of the cluster and give the GCS address (HOST:PORT)"
        )
    options = {"log_to_driver": False, "logging_level": logging.WARNING}
    if not address:  # the driver's own Ray (token authentication on, as Ray's default)
        need = needed_cpus(cluster, per_replica, members)
        options.update(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False)
    elif address != "auto":  # "auto": the cluster on this node, found by Ray
        check_reachable(address)
        use_token_if_asked(address)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address or None, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"at {address}" if address else "on this host"
        raise ConfigError(
            f"cannot start or join the Ray cluster {where} (cluster.ray_address or "
            f"RAY_ADDRESS): {exc}"
        ) from None
    finally:
        if main:  # ray.init installs its own SIGTERM handler; the driver keeps its own
            signal.signal(signal.SIGTERM, sigterm)
    try:
        check_room(cluster, address or "on this host", per_replica, members, spread)
    except BaseException:
        ray.shutdown()
        raise


def ray_address(cluster) -> str:
    """The Ray cluster to join: ``cluster.ray_address``, else ``RAY_ADDRESS``, else ``""`` (a
    Ray of the driver's own)."""
    return cluster.ray_address or os.environ.get("RAY_ADDRESS", "").strip()


def needed_cpus(cluster, per_replica: int = 0, members: int = 0) -> int:
    """The CPUs the job's roles ask Ray for: one per parameter server (of every server group)
    and data server, ``per_replica`` for each replica (its processes: its workers, or its
    partitions; 0: ``cluster.workers_per_replica``), one per member of a synchronous group."""
    servers = cluster.ps * max(1, cluster.server_groups)
    return (
        servers
        + cluster.data_servers
        + cluster.replicas * (per_replica or cluster.workers_per_replica)
        + members
    )


def wants_token(address: str) -> bool:
    """Whether the Ray cluster at ``address`` refuses a client without an authentication token
    (one request to its GCS); ``False`` where it cannot be asked (``ray.init`` then says why)."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=address)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 -- unreachable or not a GCS: joining it will say so
        return False
    return False


def check_reachable(address: str, timeout_s: float = REACH_S) -> None:
    """Refuse at once a Ray address where nothing accepts connections (Ray itself would retry
    for a minute before saying so).

    Raises:
        ConfigError: Not ``HOST:PORT``, or nothing listens there.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"Ray address {address!r} (cluster.ray_address or RAY_ADDRESS): expected HOST:PORT, "
            "the GCS address `ray start --head` prints"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"no Ray cluster answers at {address} (cluster.ray_address or RAY_ADDRESS): {exc}"
        ) from None


def use_token_if_asked(address: str) -> None:
    """Turn on Ray's token authentication for this process when the cluster at ``address``
    asks for it and ``RAY_AUTH_MODE`` does not say otherwise (Ray never does so by itself for
    an explicit address: the head's ``ray start`` turns it on when a token exists, a joining
    job would fail until the user set ``RAY_AUTH_MODE=token``).

    Raises:
        ConfigError: The cluster asks for a token and none is to be found here.
    """
    if os.environ.get("RAY_AUTH_MODE") or not wants_token(address):
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        raise ConfigError(
            f"the Ray cluster at {address} (cluster.ray_address) uses token authentication and "
            f"no token was found here: give the head's token ({TOKEN_PLACES})"
        )
    os.environ["RAY_AUTH_MODE"] = "token"  # what ray.init and the roles' actors read
    Config.initialize("")  # the probe cached the mode it saw


def check_room(
    cluster, where: str, per_replica: int = 0, members: int = 0, spread: bool = False
) -> None:
    """Refuse at once a job whose roles need more CPUs than the Ray cluster has (placing them
    would wait ``cluster.start_timeout_s`` for room that never comes).

    Args:
        spread: A replica's ``per_replica`` partitions go each on a node of its own
            (``cluster.partition_placement = "spread"``) rather than all on one.

    Raises:
        ConfigError: Not enough CPUs in all, no node with a replica's CPUs, or, spread, fewer
            nodes than a replica's partitions.
    """
    per_replica = per_replica or cluster.workers_per_replica
    need = needed_cpus(cluster, per_replica, members)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = [float(n["Resources"].get("CPU", 0)) for n in nodes]
    have = sum(per_node)
    if need > have:
        raise ConfigError(
            f"the job's roles need {need} CPU(s) of the Ray cluster {where} ("
            f"{cluster.ps * max(1, cluster.server_groups)} parameter server(s), "
            f"{cluster.data_servers} data server(s), {cluster.replicas} replica(s) x "
            f"{per_replica} process(es)"
            + (f", {members} group member(s)" if members else "")
            + f"), and it has {have:g} on "
            f"{len(nodes)} node(s); add nodes, start them with more --num-cpus, or ask less"
        )
    if spread:
        with_cpu = sum(1 for cpus in per_node if cpus >= 1)
        if with_cpu < per_replica:
            raise ConfigError(
                f"cluster.partition_placement = 'spread' puts each of a replica's {per_replica} "
                f"partitions (model.partitions) on a node of its own, and the Ray cluster "
                f"{where} has {with_cpu} node(s) with a CPU; add nodes, lower model.partitions "
                "or set cluster.partition_placement = 'pack'"
            )
    elif per_node and per_replica > max(per_node):
        raise ConfigError(
            f"a replica's {per_replica} process(es) (its workers, or its partitions) share one "
            f"node, and the largest node of the Ray cluster {where} has {max(per_node):g} "
            "CPU(s); lower cluster.workers_per_replica (or model.partitions) or start a node "
            "with more --num-cpus"
        )
