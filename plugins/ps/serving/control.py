"""A parameter server's control path: who may say what besides the data, and what it answers.

Everything a :class:`~hogwild_plugins.ps.serving.server.ParameterServer` receives that is not a
data request (:data:`DATA_TYPES`: pushes, pulls, vector operations, assignments) is handled here,
on the network thread:

- ``PING`` (job 0: alive; the server's job: alive, with the map's version), ``STATUS`` (the
  counters and the update rule's parameters, :meth:`ServerControl.status`; needs the job's id)
  and ``HELLO`` (the layout and map, :meth:`ServerControl.hello`);
- ``CONTROL``: the driver's ``fence`` (``replica``, ``incarnation``): the server refuses that
  replica's older incarnations from now on (:class:`~hogwild.net.fencing.FenceTable`, which the
  data path checks every replica's request against);
- the replication messages between copies (``PREPARE``, ``COMMIT``, ``SNAPSHOT``), handed to
  :mod:`~hogwild_plugins.ps.replication` with ``copies > 1``.

Under a job's roster (a key pair per role, :mod:`hogwild.net.auth`) every message comes with its
sender's role: replication messages are taken from parameter servers only and ``CONTROL`` from
the driver only; another role's is refused (``UNEXPECTED``) and counted by sender in ``forged``,
so a replica holding its own key can neither speak as a copy nor fence another replica.
"""

from __future__ import annotations

import time
from collections import Counter

from hogwild.net.control import ControlRefused, field, read_control
from hogwild.net.fencing import MAX_INCARNATION, MAX_REPLICA, FenceTable
from hogwild.net.rates import RateMeter
from hogwild.net.router import Incoming, Reply, error_reply, json_reply
from hogwild.net.wire import ErrorCode, MsgType, WireError

__all__ = ["DATA_TYPES", "PEER_TYPES", "ServerControl", "is_server_role"]

DATA_TYPES = frozenset(
    {MsgType.PUSH_DELTAS, MsgType.PUSH_VECTORS, MsgType.PULL, MsgType.VECTOR_OP, MsgType.ASSIGN}
)
PEER_TYPES = frozenset({MsgType.PREPARE, MsgType.COMMIT, MsgType.SNAPSHOT})  # replication
RATE_EVERY_S = 1.0  # how often the request and update rates in ``status`` are measured anew


def is_server_role(role: str) -> bool:
    """Whether a sender's role (its key's name in the job's roster) is a parameter server's:
    the only roles whose replication messages a server takes."""
    return role.startswith("ps ")


class ServerControl:
    """The control path of ``server`` (see the module docstring), on its network thread.

    Args:
        server: The :class:`~hogwild_plugins.ps.serving.server.ParameterServer` it answers for
            (its layout, options, engine, router and replication, read when asked).
    """

    def __init__(self, server) -> None:
        self.server = server
        self.fences = FenceTable()  # the replicas' incarnations the driver replaced
        self.forged: Counter[str] = Counter()  # replication messages refused, by sender role
        self.started_at = time.monotonic()
        self.rates = RateMeter(2, self.started_at, RATE_EVERY_S)  # requests applied, updates

    def handle(self, request: Incoming) -> Reply | None:
        """Pings, status, hello and (with copies) the replication messages between servers."""
        server = self.server
        header = request.header
        if header.type == MsgType.PING and header.job == 0:  # alive, and nothing more
            return Reply(header.reply(MsgType.ACK))
        if header.type == MsgType.STATUS and header.job == 0:  # the job's name and config: no
            raise WireError(
                "STATUS needs this server's job id (hogwild ps status ADDRESS --job NAME)",
                ErrorCode.WRONG_JOB,
            )
        if header.type in (MsgType.PING, MsgType.STATUS) and header.job == server.job:
            if header.type == MsgType.PING:
                return Reply(header.reply(MsgType.ACK, version=server.layout.map.version))
            return json_reply(header, self.status())
        if header.type == MsgType.HELLO and header.job == server.job:
            return json_reply(header, self.hello())
        role = request.role
        if header.type in PEER_TYPES and role is not None and not is_server_role(role):
            self.forged[role] += 1  # roster roles only: a bounded table
            raise WireError(
                f"{header.type.name} from {role or 'a key of no role'}: only the job's "
                "parameter servers send replication messages",
                ErrorCode.UNEXPECTED,
            )
        if header.type == MsgType.CONTROL and role is not None and role != "driver":
            self.forged[role] += 1  # a role's own key fencing another replica: refused
            raise WireError(
                f"CONTROL from {role or 'a key of no role'}: only the job's driver fences",
                ErrorCode.UNEXPECTED,
            )
        if header.type == MsgType.CONTROL and header.job == server.job:
            return self.fence(request)
        if header.type in PEER_TYPES and server.options.copies > 1:
            if server.replication is None or server.replication.stopped:
                raise WireError("replication is starting or stopping; retry", ErrorCode.BUSY)
            return server.replication.handle_peer(request)
        if header.job not in (0, server.job):
            server.admission.check(header)  # raises WRONG_JOB
        if header.type == MsgType.HELLO:
            raise WireError("HELLO needs this server's job id", ErrorCode.WRONG_JOB)
        raise WireError(f"a server does not take {header.type.name} messages", ErrorCode.UNEXPECTED)

    def fence(self, request: Incoming) -> Reply:
        """The driver's ``fence`` (``replica``, ``incarnation``): refuse that replica's older
        incarnations from now on; the answer is the fence in force."""
        op, body = read_control(request)
        try:
            if op != "fence":
                raise ControlRefused("a parameter server takes the control op 'fence' only")
            replica = field(body, "replica", int, minimum=0, maximum=MAX_REPLICA)
            incarnation = field(body, "incarnation", int, minimum=0, maximum=MAX_INCARNATION)
        except ControlRefused as exc:
            return error_reply(request.header, ErrorCode.BAD_VALUE, f"{op}: {exc}")
        return json_reply(request.header, {"fence": self.fences.fence(replica, incarnation)})

    def tick(self, now: float) -> None:
        """Measure the request and update rates anew, every :data:`RATE_EVERY_S`."""
        engine = self.server.engine
        if engine is not None:
            self.rates.tick(now, lambda: (sum(engine.applied), sum(engine.updated)))

    def hello(self) -> dict:
        server = self.server
        return {
            "job": server.options.job,
            "job_id": server.job,
            "server": server.options.index,
            "rule": server.options.rule,
            "layout": server.layout.describe(),
        }

    def status(self) -> dict:
        """Counters for ``hogwild ps status`` (plain data)."""
        server = self.server
        engine, router = server.engine, server.router
        applied = sum(engine.applied) if engine else 0
        requests_per_s, updates_per_s = self.rates.rates
        versions = server.book.versions()
        flushed = server.flusher.flushed_versions if server.flusher else {}
        held_buckets = sorted({server.layout.bucket_of(s.index) for s in server.shards})
        return {
            "job": server.options.job,
            "server": server.options.index,
            "address": str(server.address),
            "servers": list(server.options.servers),
            "server_group": server.options.etcd_group,  # None: the job has one server group
            "rule": server.options.rule,
            "lr": server.options.lr,
            "momentum": server.options.momentum,
            "staleness_decay": server.options.staleness_decay,
            "max_staleness": server.options.max_staleness,
            "adagrad_eps": server.options.adagrad_eps,
            "n_params": server.layout.n_params,
            "shard_floats": server.layout.shard_floats,
            "n_shards": server.layout.n_shards,
            "n_buckets": server.layout.n_buckets,
            "map_version": server.layout.map.version,
            "buckets": held_buckets,
            "shards": [
                {
                    "shard": s.index,
                    "bucket": server.layout.bucket_of(s.index),
                    "version": versions[s.index],
                    "applied": s.applied,
                    "flushed": flushed.get(s.index),
                    "vectors": len(s.vectors),
                }
                for s in server.shards
            ],
            "threads": engine.n_threads if engine else 0,
            "queue_depths": engine.depths() if engine else [],
            "requests_per_s": round(requests_per_s, 1),
            "updates_per_s": round(updates_per_s, 1),
            "applied_requests": applied,
            "updates": sum(engine.updated) if engine else 0,
            "batches": sum(engine.batches) if engine else 0,
            "pulls_at_once": engine.pulls_at_once if engine else 0,
            "pushes_at_once": engine.pushes_at_once if engine else 0,
            "staleness_histogram": server.book.histogram_labels(),
            "refused_stale": server.book.refused,
            "basis_ahead": server.book.ahead,
            "received": router.received if router else 0,
            "duplicates": router.window.duplicates if router else 0,
            "errors": dict(router.errors) if router else {},
            "forged": dict(self.forged),
            "max_vectors": server.max_vectors,
            "nonfinite": {
                "refused": server.admission.nonfinite_refused
                + sum(s.nonfinite_refused for s in server.shards),
                "applied": server.admission.nonfinite_applied,
            },
            "loss_window": server.flusher.window(applied) if server.flusher else None,
            "flush_failures": server.flusher.failures if server.flusher else 0,
            "flush_failing_s": server.flusher.failing_s() if server.flusher else 0.0,
            "failures": (engine.failures if engine else [])[-5:],
            "failed_after_ack": engine.failed_after_ack if engine else 0,
            **server.stops.status(),
            "recv": server.recv,
            "pool_misses": server.receive_pool.misses if server.receive_pool else 0,
            "ack": server.options.ack,
            "node": server.options.node,
            "replication": server.replication.status() if server.replication else None,
            **self.fences.status(),
            "uptime_s": round(time.monotonic() - self.started_at, 1),
        }
