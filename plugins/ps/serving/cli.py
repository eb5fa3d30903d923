"""``hogwild ps``: serve parameters, show a server's status, make CURVE keys.

Registered through the entry point ``hogwild.commands: ps`` (the engine's CLI calls
:func:`register` with its subparsers)::

    hogwild ps serve [--config JOB.toml] [--job NAME] [--bind HOST] [--port P]
                     [--servers H:P,H:P,...] [--index I] [--node N] [--threads T]
                     [--store DIR] [--rule sgd|momentum|adagrad|staleness] [--keys DIR]
                     [--recv auto|pool|inplace] [--ack applied|queued] [--section.key=value ...]
    hogwild ps status HOST:PORT --job NAME [--json] [--keys DIR] [--timeout S]
    hogwild ps keys DIR

``serve`` builds the job's network (``hogwild.model.network.model_network``) to know the
parameter count and the fully connected layers, initialises the parameters as the trainer does
(``model.init`` with ``train.seed``: a replica starting from the same config starts from the same
weights), recovers what ``--store`` holds, and serves until SIGTERM or Ctrl-C, which stop it after
a final flush (exit 143 or 0). Once it accepts requests it prints one line to stderr,
``hogwild ps: serving JOB (...) on HOST:PORT``, for launchers and tests to wait for.
"""

from __future__ import annotations

import json
import signal
import sys

from hogwild.errors import HogwildError
from hogwild.logs import role_logger
from hogwild.signals import StopRequest

__all__ = ["register"]

DEFAULT_PORT = 5570
SERVER_FLAGS = ("threads", "node", "store", "recv", "ack")
"""Flags of ``serve`` for settings of the server alone (not in the job config)."""
SWITCH_INTERVAL_S = 2e-4
"""The server's network and update threads share one GIL and hand it back and forth for every
message; Python's default 5 ms switch interval lets a thread that wants it wait that long."""


def register(subparsers) -> None:
    """Add ``hogwild ps`` and its subcommands."""
    ps = subparsers.add_parser("ps", help="Adam's parameter server: serve, status, keys")
    sub = ps.add_subparsers(dest="ps_command", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve a job's parameters",
        description="Serve a job's parameters (Adam section 3.3) until SIGTERM or Ctrl-C.",
    )
    serve.add_argument("--config", help="the job's TOML config (default: the bundled one)")
    serve.add_argument("--job", help="the job's name (default: the config file's stem)")
    serve.add_argument("--bind", default=None, help="host to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--servers", help="every server of the job, H:P,H:P (default ps.servers)")
    serve.add_argument("--index", type=int, help="this server's position in --servers")
    serve.add_argument("--node", type=int, help="NUMA node: pin update threads, place shards")
    serve.add_argument("--threads", type=int, help="update threads (default 0: one per CPU)")
    serve.add_argument("--store", help="LMDB directory for delayed persistence")
    serve.add_argument("--rule", choices=["sgd", "momentum", "adagrad", "staleness"])
    serve.add_argument("--keys", help="CURVE key directory (required beyond loopback)")
    serve.add_argument(
        "--recv",
        choices=["auto", "pool", "inplace"],  # server.RECV_MODES (not imported: a light CLI)
        help="receive pushes into pool blocks or in place (default auto: pool blocks with one "
        "copy on two CPUs or more)",
    )
    serve.add_argument(
        "--ack", choices=["queued", "applied"], help="acknowledge a push (default: queued)"
    )
    serve.add_argument(
        "--copies", type=int, default=None, help="copies per bucket (cluster.copies)"
    )
    serve.add_argument("--etcd", default=None, help="HOST:PORT of the job's etcd (copies > 1)")
    serve.add_argument("--lease-s", type=int, default=None, help="etcd lease TTL (ps.lease_s)")
    serve.set_defaults(run=_serve, overrides_ok=True)

    status = sub.add_parser("status", help="a server's shards, versions, rates and windows")
    status.add_argument("address", metavar="HOST:PORT")
    status.add_argument(
        "--job", required=True, help="the job's name (a server tells its status to no one else)"
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--keys", help="CURVE key directory")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    status.set_defaults(run=_status)

    keys = sub.add_parser("keys", help="make CURVE keys for servers and clients")
    keys.add_argument("directory", metavar="DIR")
    keys.set_defaults(run=_keys)


# ---------------------------------------------------------------------- serve


def _serve(args) -> int:
    import numpy as np
    from hogwild_plugins.ps.layout import ModelGeometry
    from hogwild_plugins.ps.replication.start_asks import StartStopped
    from hogwild_plugins.ps.serving.server import ParameterServer

    from hogwild.config import load_config
    from hogwild.model.init import initialise
    from hogwild.model.network import model_network
    from hogwild.net.metrics import serve_metrics

    config = load_config(args.config, getattr(args, "overrides", None) or None)
    network = model_network(config.model)
    initial = np.empty(network.n_params, np.float32)
    initialise(network, initial, config.model.init, config.model.init_scale, config.train.seed)
    options = serve_options(args, config)
    cpus = _node_cpus(args.node)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = ParameterServer(ModelGeometry.from_network(network), options, initial)
    with StopRequest() as stop:
        endpoint = None
        try:
            try:
                address = server.start(cpus, stopping=lambda: bool(stop.received))
            except StartStopped as stopped:  # a SIGTERM while etcd did not answer: 143
                role_logger("ps").info("stopped before serving (%s)", stopped)
                return 143 if signal.SIGTERM in stop.received else 0  # (after the finally)
            endpoint = serve_metrics(
                "ps", f"ps {options.index}", config.cluster.metrics_port, server.status
            )
            layout = server.layout
            store = f", store {options.store}" if options.store else ""
            print(
                f"hogwild ps: serving {options.job} ({layout.n_params:,} parameters, "
                f"{len(server.shards)} of {layout.n_shards} shards in "
                f"{len(set(map(layout.bucket_of, (s.index for s in server.shards))))} of "
                f"{layout.n_buckets} buckets, rule {options.rule}, "
                f"{server.engine.n_threads} update thread(s){store}) on {address}",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(0.5):
                if not server.router.alive:
                    raise HogwildError(f"the network thread stopped: {server.router.failure!r}")
                if not server.engine.alive:
                    failures = "; ".join(server.engine.failures) or "no reason recorded"
                    raise HogwildError(f"an update thread stopped: {failures}")
                if server.replication is not None and server.replication.failure:
                    raise HogwildError(f"replication stopped: {server.replication.failure}")
        finally:
            if endpoint is not None:
                endpoint.close()
            flushed = server.stop()
    how = "final flush written" if options.store and flushed else "no store"
    if options.store and not flushed:
        how = "FINAL FLUSH FAILED"
    role_logger("ps").info("stopped (%s)", how)
    if options.store and not flushed:
        return 1
    return 143 if signal.SIGTERM in stop.received else 0


def serve_options(args, config):
    """The :class:`~hogwild_plugins.ps.serving.options.ServerOptions` of ``hogwild ps serve``:
    the job config's (``[ps]``, ``cluster.copies``, ``cluster.etcd``,
    ``cluster.etcd_election_ms``), with the flags given in
    place of the config keys they stand for, this server's place in the job, and the flags of
    settings the config does not hold (:data:`SERVER_FLAGS`; those not given keep the options'
    defaults)."""
    from hogwild_plugins.ps.layout import job_name
    from hogwild_plugins.ps.serving.options import ServerOptions

    servers, index, bind = _placement(args, tuple(config.ps.servers))
    return ServerOptions.from_config(
        config,
        job=job_name(config.origin, args.job),
        servers=servers,
        index=index,
        bind=bind,
        rule=args.rule,
        keys=args.keys,
        copies=args.copies,
        etcd=args.etcd,
        lease_s=args.lease_s,
        **{key: getattr(args, key) for key in SERVER_FLAGS if getattr(args, key) is not None},
    )


def _placement(args, configured: tuple[str, ...]) -> tuple[tuple[str, ...], int, str]:
    """The job's server list, this server's index in it, and the address to bind."""
    from hogwild.net.address import LOOPBACK, host_port, parse_address

    listed = tuple(s.strip() for s in args.servers.split(",") if s.strip()) if args.servers else ()
    servers = listed or configured
    host = args.bind or LOOPBACK
    if not servers:
        port = DEFAULT_PORT if args.port is None else args.port
        address = parse_address(host_port(host, port))
        return (str(address),), 0, str(address)
    index = args.index
    if index is None:
        if args.port is None:
            raise HogwildError(
                f"{len(servers)} servers are listed ({', '.join(servers)}): say which one this "
                "is with --index I (or --port P matching one of them)"
            )
        ports = [parse_address(s).port for s in servers]
        if ports.count(args.port) != 1:
            raise HogwildError(
                f"--port {args.port} matches {ports.count(args.port)} of the listed servers "
                f"({', '.join(servers)}); give --index I"
            )
        index = ports.index(args.port)
    if not 0 <= index < len(servers):
        raise HogwildError(f"--index {index}: there are {len(servers)} servers")
    port = parse_address(servers[index]).port if args.port is None else args.port
    bind = host_port(host, port)
    return servers, index, bind


def _node_cpus(node: int | None) -> set[int] | None:
    if node is None:
        return None
    from hogwild.numa.topology import read_topology

    topology = read_topology()
    for n in topology.nodes:
        if n.node == node and n.cpus:
            return set(n.cpus)
    known = ", ".join(str(n.node) for n in topology.nodes if n.cpus)
    raise HogwildError(f"--node {node}: no such NUMA node with CPUs here (nodes: {known})")


# ---------------------------------------------------------------------- status, keys


def _status(args) -> int:
    from hogwild.net.channel import Peers
    from hogwild.net.wire import Header, MsgType, job_id

    with Peers(
        [args.address], sender=0, timeout_s=args.timeout, retries=1, keys=args.keys
    ) as peers:
        header, frames = peers.request(0, Header(MsgType.STATUS, job=job_id(args.job)))
    text = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
    if header.type == MsgType.ERROR:
        raise HogwildError(f"parameter server {args.address}: {text}")
    if header.type != MsgType.JSON:
        raise HogwildError(f"parameter server {args.address}: no status in its reply")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HogwildError(f"parameter server {args.address}: bad status JSON ({exc})") from exc
    print(json.dumps(data) if args.json else format_status(data))
    return 0


def format_status(s: dict) -> str:
    """A server's status as a few readable lines."""
    shards = s.get("shards", [])
    group = f", server group {s['server_group']}" if s.get("server_group") is not None else ""
    lines = [
        f"server {s.get('server')} of {len(s.get('servers', []))} (job {s.get('job')}{group}) at "
        f"{s.get('address')}: rule {s.get('rule')} (lr {s.get('lr')}), "
        f"{s.get('n_params', 0):,} parameters in {s.get('n_shards')} shards, "
        f"{s.get('n_buckets')} buckets; up {s.get('uptime_s')} s",
        f"  buckets held: {' '.join(map(str, s.get('buckets', [])))} "
        f"(map version {s.get('map_version')})",
        f"  update threads: {s.get('threads')}, queue depths {s.get('queue_depths')}; "
        f"{s.get('requests_per_s', 0):,.0f} requests/s, {s.get('updates_per_s', 0):,.0f} "
        f"updates/s ({s.get('applied_requests', 0):,} requests, {s.get('batches', 0):,} batches)",
    ]
    for sh in shards[:16]:
        flushed = "-" if sh.get("flushed") is None else sh.get("flushed")
        lines.append(
            f"  shard {sh.get('shard')} (bucket {sh.get('bucket')}): version {sh.get('version')},"
            f" applied {sh.get('applied')}, flushed {flushed}"
        )
    if len(shards) > 16:
        lines.append(f"  ... and {len(shards) - 16} more shards")
    hist = ", ".join(f"{k}: {v}" for k, v in s.get("staleness_histogram", {}).items()) or "none"
    lines.append(
        f"  staleness: {hist}; refused {s.get('refused_stale')}, basis ahead {s.get('basis_ahead')}"
    )
    window = s.get("loss_window")
    if window:
        lines.append(
            f"  loss window: {window.get('seconds')} s, {window.get('updates')} updates since the "
            f"last flush ({window.get('flushes')} flushes"
            f"{'; ERROR ' + window['error'] if window.get('error') else ''})"
        )
        if window.get("failing_s"):
            lines.append(
                f"  FLUSHES FAILING for {window['failing_s']} s ({window.get('failures')} "
                "failed rounds): the loss window grows until one succeeds"
            )
    else:
        lines.append("  loss window: no store (everything since the start)")
    for bucket, reason in (s.get("stopped_buckets") or {}).items():
        lines.append(f"  BUCKET {bucket} STOPPED (its requests are refused): {reason}")
    errors = ", ".join(f"{k} {v}" for k, v in s.get("errors", {}).items()) or "none"
    lines.append(
        f"  requests received {s.get('received')}, duplicates {s.get('duplicates')}, "
        f"errors: {errors}"
    )
    return "\n".join(lines)


def _keys(args) -> int:
    from hogwild.net.auth import make_keys

    root = make_keys(args.directory)
    print(
        f"hogwild ps: CURVE keys in {root}: server.key(_secret), client.key(_secret), "
        f"authorized/client.key. Copy the directory to every machine of the job and pass "
        f"--keys {root} (or set ps.keys)"
    )
    return 0
