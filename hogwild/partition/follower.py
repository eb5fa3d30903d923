"""A follower host of a partitioned replica: ``hogwild partition-host --bind HOST:PORT``.

Started on each host that ``model.partition_hosts`` names besides the leader's (partition 0's),
before the job. It binds the link's receiver (:mod:`hogwild.partition.link`) and waits for one
leader's SETUP: the job's config, this host's group and the model. It then owns, as the leader does
on its host, an arena (the in-flight slots' rows and counters, and the model, of which its
partitions read and update only their own rows) and its partition processes
(:mod:`hogwild.partition.process`), and serves until the leader says STOP: the examples arrive as
LOAD frames (no data is read here), the other hosts' slices as FORWARD and BACKWARD frames; at each
epoch's end it sends its rows back (ROWS), or, in a cluster job (the leader's SETUP names the
parameter servers), its partitions exchange their own rows with the servers in the leader's FLUSH
and FETCH rounds (in each FETCH, the first at the leader's start, it pulls only the shards its
partitions' rows lie in: :mod:`hogwild.partition.host_rows`; its stop line says how much). Under a
cluster job's roster it takes a SETUP only from its leader's role (``--leader-role``), and every
later message only from the role of the host it comes from (:mod:`hogwild.partition.link`). It beats
to the leader; a partition that dies is reported (FAILED) and ends the host, as a silent leader
does. It owns every resource it made and releases it on every exit path (STOP, an error, SIGTERM,
Ctrl-C); its partitions end with it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import psutil
import zmq

from hogwild.errors import ConfigError, HogwildError, PartitionDiedError
from hogwild.net.address import InsecureBindError
from hogwild.partition import frames as fr
from hogwild.partition import process as proc
from hogwild.partition.hosts import LEADER, host_groups
from hogwild.partition.process import START_TIMEOUT_S
from hogwild.partition.runtime import arena_layout, stop_partitions, warm_kernels
from hogwild.training import zygote

WAIT_S = fr.WAIT_S


def serve_partition_host(
    bind: str, keys: str | None = None, wait_s: float = WAIT_S, say=print, leader_role: str = ""
) -> int:
    """Serve one job's partitions of this host; returns 0 once the leader stopped it.

    Raises:
        PartitionDiedError: A partition here died, or the leader fell silent or never came.
        ConfigError: The leader's setup is not a job this host can run.
    """
    from hogwild.partition.link import bind_receiver
    from hogwild.shm.sweeper import sweep_report
    from hogwild.signals import deferred_signals, terminate_as_interrupt

    for line in sweep_report():  # a host SIGKILLed here before left its segments, owners dead
        say(line)
    with terminate_as_interrupt():
        host = FollowerHost(bind, keys, say, leader_role)
        try:
            host.sock, host.security = bind_receiver(bind, keys)
            if host.security is not None and host.security.roles and not leader_role:
                raise ConfigError(
                    f"--keys {keys} holds the job's roster (a key pair per role): pass "
                    "--leader-role, the leader's role (e.g. 'replica 0'), whose SETUP it takes"
                )
            checked = leader_role if host.security is not None and host.security.roles else None
            job, params, velocity = _wait_setup(host.sock, wait_s, bind, checked)
            try:
                host.start(job, params, velocity)
            except Exception as exc:  # the leader is told at once rather than left waiting
                host.report(job, f"could not start: {exc}")
                raise
            host.serve()
            return 0
        finally:
            with deferred_signals():
                try:  # what it pulled, whichever way it ends (a closed pipe skips no cleanup)
                    if host.home is not None:
                        say(f"hogwild partition-host {bind}: {host.home.said()}")
                finally:
                    host.shutdown()


def _wait_setup(sock, wait_s: float, bind: str, leader_role: str | None = None):
    """The first well-formed SETUP (other messages before it are dropped); under the job's
    roster (``leader_role`` given), only one the leader's role sent."""
    from hogwild.net.auth import sender_role

    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PartitionDiedError(f"no leader sent this partition host ({bind}) a job in "
                                     f"{wait_s:g} s")  # fmt: skip
        if not sock.poll(min(left, 0.2) * 1000):
            continue
        frames = sock.recv_multipart(copy=False)
        if leader_role is not None and sender_role(frames[0]) != leader_role:
            continue  # another role of the job: it is no leader of this host
        parts = [f.bytes for f in frames]
        try:
            header = fr.decode(parts[0])
        except fr.FrameError:
            continue
        if header.kind != fr.SETUP or len(parts) != 4 or len(parts[1]) > fr.MAX_SETUP_BYTES:
            continue
        try:
            job = json.loads(parts[1].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(job, dict):
            continue
        return job, parts[2], parts[3]


class FollowerHost:
    """This host's arena, receiver, partitions and link to the leader."""

    def __init__(self, bind: str, keys: str | None, say, leader_role: str = ""):
        self.bind, self.keys, self.say = bind, keys, say
        self.leader_role = leader_role
        self.sock = self.security = None  # the receiving socket, until the receiver has it
        self.arena = self.receiver = self.outbox = None
        self.processes: list = []
        self.local: tuple[int, ...] = ()
        self.answered = 0
        self.home = None  # a cluster job's: its partitions' rows from the parameter servers
        self.flushing = self.flushed = self.fetched = 0  # the leader's rounds carried out

    def start(self, job: dict, params: bytes, velocity: bytes) -> None:
        from hogwild.config import config_from_dict
        from hogwild.model.network import build_network
        from hogwild.numa.claims import pinned_by_other_jobs, placement_lock
        from hogwild.partition.link import Receiver
        from hogwild.partition.plan import plan_partitions
        from hogwild.partition.sending import Outbox
        from hogwild.shm.arena import Arena
        from hogwild.store.registry import store_class
        from hogwild.training.placement import worker_placements

        config = config_from_dict(job.get("config"), origin="<the leader's setup>")
        n_classes, group = job.get("n_classes"), job.get("group")
        if not isinstance(n_classes, int) or not 2 <= n_classes <= 1 << 20:
            raise ConfigError(f"the leader's setup: n_classes {n_classes!r}")
        network = build_network(config.model, n_classes)
        plan = plan_partitions(network, config.model.partitions)
        groups = host_groups(config, plan)
        if groups is None or not isinstance(group, int) or not 1 <= group < groups.n_groups:
            raise ConfigError(f"the leader's setup: group {group!r} of model.partition_hosts")
        if len(params) != 4 * network.n_params or len(velocity) != 4 * network.n_params:
            raise ConfigError(
                f"the leader's setup: a model of {len(params)} bytes, expected "
                f"{4 * network.n_params} ({network.n_params:,} float32 parameters)"
            )
        self.local = groups.members(group)
        roles = _roles(job.get("roles", []), groups.n_groups)
        senders = _roles(job.get("senders", []), groups.n_groups, "senders")
        if self.leader_role and senders[:1] != (self.leader_role,):
            raise ConfigError(
                f"the leader's setup: senders {senders!r} (the leader is {self.leader_role!r})"
            )
        home = job.get("home")
        if home is not None:  # its servers reached with this host's keys (its own paths)
            config = config.override({"ps.keys": self.keys or "", "cluster.keys": self.keys or ""})
            home = self._home(home, config, network)
        n_slots = config.train.in_flight
        warm_kernels(plan, n_slots)
        words = 0 if home is None else store_class(home["store"]).version_words(network.n_params)
        layout = arena_layout(network, plan, n_slots, (1, network.input_size), home is not None,
                              words)  # fmt: skip
        self.arena = arena = Arena.create(config.ps.job or "partition", layout)
        arena.array("params")[:] = np.frombuffer(params, dtype=np.float32)
        arena.array("velocity")[:] = np.frombuffer(velocity, dtype=np.float32)
        if home is not None:
            self._open_home(home, network, plan, config)
        mean, std = config.data.mean, config.data.std
        self.receiver = Receiver(
            self.sock, self.security, plan, groups, group, arena, n_slots, mean, std, self.keys,
            roles, senders,
        )  # fmt: skip
        self.sock = self.security = None  # the receiver owns them now
        self.outbox = Outbox(groups.addresses, [LEADER], self.keys, roles)
        self.plan, self.groups, self.group = plan, groups, group
        self.silence_s = config.model.partition_silence_s  # the leader's setting, as it loses us
        me = psutil.Process()
        setup = {
            "arena": arena.name,
            "layout": layout.to_json(),
            "config": config.to_dict(),
            "n_classes": n_classes,
            "mean": mean,
            "std": std,
            "parent_pid": os.getpid(),
            "parent_started": me.create_time(),
            "home": home,
            "link": {
                "addresses": list(groups.addresses),
                "group_of": list(groups.group_of),
                "keys": self.keys or "",
                "roles": list(roles),
            },
        }
        with placement_lock(), zygote.starting(config.train.start_method) as context:
            placements = worker_placements(
                len(self.local), config.train.placement, avoid=pinned_by_other_jobs()
            )
            for i, p in enumerate(self.local):
                child = context.Process(
                    target=proc.partition_main,
                    args=({**setup, "partition": p, "placement": placements[i]},),
                    name=f"hogwild-partition-{p}",
                    daemon=True,
                )
                child.start()
                self.processes.append(child)
            self._wait_all(proc.PINNED, "pinning themselves")
        self._wait_all(proc.READY, "loading their kernels")
        self.outbox.send(LEADER, fr.encode(fr.READY, group, a=group))
        self.say(
            f"hogwild partition-host {self.bind}: partitions "
            f"{', '.join(map(str, self.local))} of {plan.k} running for the leader at "
            f"{groups.addresses[LEADER]}"
        )

    def _home(self, home, config, network) -> dict:
        """Where this host's partitions exchange their own rows (a cluster job's parameter
        servers): the leader names only the store; how to reach it (servers, job, token, etcd,
        this host's keys) is rebuilt here from the job's config, checked as it was read,
        rather than taken from the network."""
        from hogwild.store.registry import store_class

        name = home.get("store") if isinstance(home, dict) else None
        if set(home if isinstance(home, dict) else ()) != {"store"} or not isinstance(name, str):
            raise ConfigError(f"the leader's setup: home {home!r}, expected {{'store': NAME}}")
        try:
            kind = store_class(name)
        except ConfigError as exc:
            raise ConfigError(f"the leader's setup: home store {name!r}: {exc}") from None
        if getattr(kind, "home_is_local", True):
            raise ConfigError(f"the leader's setup: home store {name!r} has no servers")
        store = kind(config, network, ())
        n_push, n_fetch = store.n_push, store.n_fetch
        return {"store": name, "values": store.home_spec(0), "n_push": n_push, "n_fetch": n_fetch}

    def _open_home(self, home: dict, network, plan, config) -> None:
        """This host's own client of the servers (its partitions have theirs), over its
        partitions' rows. It takes nothing yet: the leader's SETUP carries no model (the
        leader asks the servers itself), and the leader's start always asks FETCH round 1
        once every host is ready, before any example (LOAD) can come; until then nothing
        here reads ``params`` or ``base`` (the partitions wait for examples, their exchangers
        for the first push or pull). So round 1 is this host's first take, and it takes the
        model as often as the leader does."""
        from hogwild.partition.host_rows import HostRows

        self.home = HostRows.open(
            home["store"], home["values"], self.arena, network, config, plan, self.local
        )

    def _take_the_servers_model(self) -> None:
        """``params`` and ``base`` := the servers' model over the rows of the partitions here
        (every partition here idle): only the shards they lie in are pulled."""
        self.home.take(self.arena.array("params"), self.arena.array("base"))

    def _rounds(self) -> None:
        """A cluster replica's flush and fetch rounds, asked by the leader, carried out here.
        A flush is answered once every partition here pushed; a fetch (the leader's start, or
        a new epoch: every partition idle and flushed, which the receiver checks before it
        takes one) at once."""
        from hogwild.shm.atomics import atomic_load, atomic_store

        receiver, control = self.receiver, self.arena.array("control")
        asked = receiver.round(fr.FLUSH, LEADER)
        if asked > self.flushing:  # the partitions here push what they trained
            self.flushing = asked
            atomic_store(control, proc.FLUSH, asked)
        if self.flushing > self.flushed and all(
            atomic_load(control, proc.FLUSHED + 8 * p) == self.flushing for p in self.local
        ):
            self.flushed = self.flushing
            receiver.flushed_round = self.flushed  # before the leader can ask a FETCH
            self.outbox.send(LEADER, fr.encode(fr.FLUSHED, self.group, a=self.flushed))
        asked = receiver.round(fr.FETCH, LEADER)  # taken only when idle and flushed (the link)
        if asked > self.fetched:
            self._take_the_servers_model()
            self.fetched = asked
            self.outbox.send(LEADER, fr.encode(fr.FETCHED, self.group, a=asked))

    def report(self, job: dict, text: str) -> None:
        """Tell the leader named in ``job`` that this host failed (FAILED), if it can be told."""
        from hogwild.net.address import AddressError, parse_address
        from hogwild.partition.sending import Outbox

        leader, group = job.get("leader"), job.get("group")
        if not isinstance(leader, str) or not isinstance(group, int) or not 0 < group < 1 << 16:
            return
        try:
            parse_address(leader)
            # under a roster the leader's link is found by its role (its address is not listed)
            roles = job.get("roles")
            first = roles[0] if isinstance(roles, list) and roles else ""
            outbox = Outbox((leader,), [LEADER], self.keys, _roles([first], 1))
        except (AddressError, HogwildError, zmq.ZMQError):
            return
        try:
            outbox.send(LEADER, fr.encode(fr.FAILED, group), text.encode()[: fr.MAX_TEXT_BYTES])
        finally:
            outbox.close()

    def _wait_all(self, word: int, doing: str) -> None:
        control = self.arena.array("control")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(control[word + 8 * p] for p in self.local):
            self._check_alive(doing)
            if time.monotonic() > deadline:
                raise PartitionDiedError(f"the partitions were not done {doing} in time")
            time.sleep(0.01)

    def _check_alive(self, doing: str) -> None:
        for p, child in zip(self.local, self.processes, strict=False):
            code = child.exitcode
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                text = f"partition {p} (pid {child.pid}) died while {doing} ({how})"
                self.outbox.send(LEADER, fr.encode(fr.FAILED, self.group), text.encode())
                raise PartitionDiedError(text)

    def serve(self) -> None:
        from hogwild.partition.link import gather_rows, rows_of

        receiver = self.receiver
        rows = rows_of(self.plan, self.local)
        params, velocity = self.arena.array("params"), self.arena.array("velocity")
        while not receiver.stop:
            self._check_alive("training")
            if receiver.broken:
                raise PartitionDiedError(receiver.broken)
            if receiver.silent(LEADER) > self.silence_s:
                raise PartitionDiedError(
                    f"the leader at {self.groups.addresses[LEADER]} was silent for "
                    f"{self.silence_s:g} s (model.partition_silence_s); this partition host "
                    "stops its partitions"
                )
            if self.home is not None:
                self._rounds()
            asked = receiver.asked
            if asked > self.answered:  # every example handed out is complete: rows are still
                header = fr.encode(fr.ROWS, self.group, a=asked)
                p_rows, v_rows = gather_rows(params, rows), gather_rows(velocity, rows)
                self.outbox.send(LEADER, header, p_rows, v_rows)
                self.answered = asked
            time.sleep(0.005)

    def shutdown(self) -> None:
        stop_partitions(self.arena, self.processes)
        self.processes = []
        if self.home is not None:
            self.home.close()
            self.home = None
        if self.outbox is not None:
            self.outbox.close()
            self.outbox = None
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
        if self.security is not None:
            self.security.close()
            self.security = None
        if self.arena is not None:
            self.arena.close()
            self.arena.unlink()
            self.arena = None


def _roles(roles, n_groups: int, what: str = "roles") -> tuple[str, ...]:
    """The leader's per-group roles (``roles``: :class:`~hogwild.partition.sending.Outbox`;
    ``senders``: :class:`~hogwild.partition.link.Receiver`), checked."""
    from hogwild.net.auth import ROLE_NAME

    if not isinstance(roles, list) or len(roles) not in (0, n_groups):
        raise ConfigError(f"the leader's setup: {what} {roles!r}")
    for role in roles:
        if not isinstance(role, str) or (role and not ROLE_NAME.fullmatch(role)):
            raise ConfigError(f"the leader's setup: {what} entry {role!r}")
    return tuple(roles)


def run_cli(args) -> int:
    if not args.wait_s > 0:
        raise ConfigError(f"--wait-s must be > 0 seconds, got {args.wait_s}")
    from hogwild.net.auth import ROLE_NAME

    if args.leader_role and not ROLE_NAME.fullmatch(args.leader_role):
        raise ConfigError(f"--leader-role must be a role of the job's roster such as "
                          f"'replica 0', got {args.leader_role!r}")  # fmt: skip
    try:
        return serve_partition_host(
            args.bind,
            args.keys,
            args.wait_s,
            say=lambda line: print(line, file=sys.stderr, flush=True),
            leader_role=args.leader_role,
        )
    except zmq.ZMQError as exc:
        raise ConfigError(f"--bind {args.bind}: {exc}") from None
    except InsecureBindError:
        raise ConfigError(
            f"--bind {args.bind} is reachable from other machines: the partitions' activations "
            "and errors need CURVE keys there; pass --keys DIR, the job's cluster.keys (made by "
            "`hogwild ps keys DIR` and copied to every host), or bind 127.0.0.1"
        ) from None
