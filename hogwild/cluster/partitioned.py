"""A partitioned model replica of a cluster job: K partition processes, each exchanging its rows.

Adam section 3.2 and Fig. 11: a replica is several machines, each holding a vertical slice of
every layer, and each pushing and pulling its own slice's weights to and from the parameter
servers. Here a replica is :class:`~hogwild.partition.runtime.PartitionedTrainer`'s arena and K
partition processes (:mod:`hogwild.partition.process`) on one host, served to the driver as any
replica role is (:class:`~hogwild.cluster.serving.ReplicaServer`, its portions kept and reported
by :class:`~hogwild.cluster.replica_role.PortionRole`); each partition's exchange
thread pushes the progress of the parameter rows it owns, and pulls only the shards those rows
lie in, through the ``ps`` store's home (reached through the parameter-store registry: the core
never imports the plugin). The arena's ``base`` holds the values each row last exchanged.

- At start, and before every new epoch (every partition flushed), the replica takes the servers'
  model into its arena (``params`` and ``base``) over the rows of the partitions on its host,
  pulling only the shards they lie in (:mod:`hogwild.partition.host_rows`: every shard when all
  K are here, a follower host's own in a FETCH round): the driver gave the servers the initial
  or checkpointed model. ``describe`` (``pulled``) and the stop line say what those pulls moved.
- ``train`` (epoch, lr, seed, start, stop): ``order[start:stop]`` of the epoch's permutation is
  appended to the feeder's ring and handed out (its running total ``COUNT``); the portion is
  done once every example of it is completely processed by all K partitions (Adam's epoch rule)
  and every partition has pushed what it trained (``FLUSH``). Dropout masks come from each
  partition's own seed, not the portion's.
- ``close`` (epoch): the feeder feeds nothing more of the portion; the examples in flight
  complete.
- A partition that dies (killed, or its exchange failed) ends the replica with an error naming
  it: the driver restarts the replica (``cluster.restarts``), which trains the lost portions
  again, as it does for an unpartitioned replica.

Partitioned replicas train from MNIST idx data with ``train.batch = 1`` and Downpour's topology
(replicas on one server group, no coordinator); :func:`check_partitioned_job` refuses the rest.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from hogwild.cluster.replica_role import Portion, PortionRole, driver_silence_s
from hogwild.cluster.serving import POLL_S
from hogwild.errors import ConfigError, PartitionDiedError, WorkerStalledError
from hogwild.partition import process as proc
from hogwild.partition.runtime import PartitionedTrainer, warm_kernels
from hogwild.training.job import epoch_permutation
from hogwild.training.messages import Train

FLUSH_TIMEOUT_S = 300.0  # every partition pushed a portion's progress (a server may be slow)
STORE = "ps"  # the parameter-store entry point whose home the partitions exchange with


def check_partitioned_job(config, topology, data_servers: int) -> None:
    """Refuse a cluster job with ``model.partitions > 1`` that partitioned replicas cannot run,
    naming the setting."""
    if config.model.partitions <= 1:
        return
    if len(set(config.model.partition_hosts)) > 1:
        raise ConfigError(
            "model.partition_hosts: a cluster job places each replica's partitions itself "
            "(cluster.partition_placement = 'spread' with the Ray launcher puts them on "
            "different nodes; partitions on hosts you name are for `hogwild train` with "
            "`hogwild partition-host` on the others; docs/partitioning.md)"
        )
    if config.cluster.partition_placement == "spread":
        check_spread(config)
    if topology.coordinated or topology.server_groups > 1:
        raise ConfigError(
            f"model.partitions = {config.model.partitions}: partitioned replicas train with "
            f"Downpour (replicas on one server group); this job's topology is "
            f"{topology.describe()}"
        )
    if data_servers:
        raise ConfigError(
            f"model.partitions = {config.model.partitions}: partitioned replicas read MNIST idx "
            f"data themselves; set cluster.data_servers = 0, got {data_servers}"
        )
    if config.train.batch != 1:
        raise ConfigError(
            f"model.partitions = {config.model.partitions} trains one example at a time per slot: "
            f"set train.batch = 1, got {config.train.batch}"
        )


FOLLOWER = "follower"  # a spread replica's follower hosts' kind of role ("follower 3")
#: A follower's stop line (:func:`hogwild.partition.follower.serve`, :meth:`HostRows.said
#: <hogwild.partition.host_rows.HostRows.said>`): what its takes pulled, relayed by a launcher.
FOLLOWER_STOP_LINE = r"hogwild partition-host \S+: took the servers' model "


def follower_role(replica: int, k: int, g: int) -> str:
    """The roster role of replica ``replica``'s follower host ``g`` (of ``k`` partitions, one
    a host): its key pair's name, so the leader's link knows whose messages it takes."""
    return f"{FOLLOWER} {replica * k + g}"


def check_spread(config) -> None:
    """Refuse ``cluster.partition_placement = "spread"`` where it cannot run, naming why: it
    needs the Ray launcher (the local launcher runs on one host), roles reachable from other
    hosts (``cluster.host`` beyond loopback) and one copy of the parameters (a follower host
    has no etcd certificate of its own yet)."""
    from hogwild.net.address import is_loopback, parse_address

    cluster = config.cluster
    if cluster.launcher != "ray":
        raise ConfigError(
            f"cluster.partition_placement = 'spread' places a replica's partitions on different "
            f"Ray nodes: set cluster.launcher = 'ray' (--launcher ray), got {cluster.launcher!r} "
            "(the local launcher runs every partition on this host: 'pack')"
        )
    if is_loopback(parse_address(f"{cluster.host}:0")):
        raise ConfigError(
            f"cluster.partition_placement = 'spread': the partitions on other nodes reach each "
            f"other over the network; set cluster.host to this host's address beyond loopback "
            f"(every role then binds its node's), got {cluster.host!r}"
        )
    if cluster.copies > 1:
        raise ConfigError(
            f"cluster.partition_placement = 'spread' runs with cluster.copies = 1 (a follower "
            f"node's partitions have no etcd certificate of their own yet), got {cluster.copies}"
        )


@dataclass
class PartitionedPortion(Portion):
    """A portion as the partitions carry it: fed, closed, flushed."""

    closing: int = 0  # the close asked of the feeder for it (0: none)
    flushing: int = 0  # the flush asked of the partitions at its end (0: not yet)
    flush_deadline: float = 0.0
    completed: int = -1  # examples completed (in all) when last seen to move
    moved: float = 0.0  # when that was (time.monotonic)


class PartitionedReplica(PartitionedTrainer, PortionRole):
    """One partitioned replica as a served role (see the module docstring)."""

    exchanges = True
    portion_type = PartitionedPortion

    def __init__(self, config, data, index: int) -> None:
        overrides = {
            "train.parameters": STORE,
            "train.fc_push": "deltas",  # a partition's rows travel as their progress
            "output.checkpoint_dir": "",
            "output.metrics": "",
            "output.tensorboard": "",  # the driver writes the job's
            "output.progress": False,
        }
        if len(set(config.model.partition_hosts)) > 1:  # spread by the launcher over nodes:
            # the link speaks CURVE with the job's keys (a roster: the roles' own key pairs)
            overrides["cluster.keys"] = config.cluster.keys or config.ps.keys
        config = config.override(overrides)
        PartitionedTrainer.__init__(self, config, data)
        silence_s = driver_silence_s(config, config.cluster.replicas + 1)
        PortionRole.__init__(self, config, index, silence_s)
        self.n_train = len(self.train_images)
        self.wake = threading.Event()
        self.closes = self.flushes = 0  # requests made of the partitions so far
        self.fetches = 0  # FETCH rounds asked of the follower hosts
        self.store = self.home = None

    # -- the partitions' homes -------------------------------------------------------------------

    def _home_of(self, p: int, placements=()) -> dict:
        from hogwild.store.registry import store_class

        if self.store is None:
            self.store = store_class(STORE)(self.config, self.network, placements)
        return {
            "store": STORE,
            "values": self.store.home_spec(p),
            "n_push": self.store.n_push,
            "n_fetch": self.store.n_fetch,
        }

    def homes(self, placements) -> list[dict | None]:
        return [self._home_of(p, placements) for p in range(len(placements))]

    def version_words(self) -> int:
        from hogwild.store.registry import store_class

        return store_class(STORE).version_words(self.network.n_params)

    def follower_home(self) -> dict | None:
        # the store alone: each follower reaches the same servers, rebuilt from the job's config
        # there (nothing it reaches is taken from the network), and this replica's store is
        # built once, by homes(), with its partitions' placements
        return {"store": STORE}

    def link_roles(self) -> tuple[str, ...]:
        # the leader's link binds beside this replica's address, under the replica's key pair;
        # the followers serve at their own addresses, which the roster lists
        return (self.name_in_roster, *([""] * (self.groups.n_groups - 1)))

    def link_senders(self) -> tuple[str, ...]:
        # the replica's own key pair speaks for the leader's host, each follower's for its own
        k = self.config.model.partitions
        followers = (follower_role(self.index, k, g) for g in range(1, self.groups.n_groups))
        return (self.name_in_roster, *followers)

    @property
    def name_in_roster(self) -> str:
        return f"replica {self.index}"

    def _take_the_servers_model(self) -> None:
        """``params`` and ``base`` := the servers' model over the rows of the partitions here
        (every partition idle and flushed; :class:`~hogwild.partition.host_rows.HostRows`), and
        on every follower host over its own (a FETCH round)."""
        self.home.take(self.arena.array("params"), self.arena.array("base"))
        if self.followers:
            from hogwild.partition import frames as fr

            self.fetches += 1
            self.receiver.await_round(fr.FETCHED, self.fetches)
            for g in self.followers:
                self.outbox.send(g, fr.encode(fr.FETCH, 0, a=self.fetches))
            deadline = time.monotonic() + FLUSH_TIMEOUT_S
            while not self._followers_answered(fr.FETCHED, self.fetches):
                self._check_alive("taking the servers' model")
                if time.monotonic() > deadline:
                    raise PartitionDiedError(
                        f"replica {self.index}: the partition hosts did not take the servers' "
                        f"model within {FLUSH_TIMEOUT_S:.0f} s"
                    )
                time.sleep(0.005)

    def _followers_answered(self, kind: int, asked: int) -> bool:
        """Whether every follower host answered round ``asked`` of ``kind`` (FLUSHED, FETCHED)."""
        return all(self.receiver.round(kind, g) == asked for g in self.followers)

    # -- the network thread (ReplicaServer's requests) --------------------------------------------

    @property
    def job(self) -> str:
        return self.store.reach["job"]

    def facts(self) -> dict:
        facts = {
            "workers": self.plan.k,
            "partitions": self.plan.k,
            "cpus": [p.cpu for p in self.placements],
        }
        receiver = self.receiver
        if self.groups is not None and receiver is not None:  # spread over hosts
            facts["partition_hosts"] = list(self.groups.addresses)
            facts["link"] = {"taken": receiver.blocks, "refused": receiver.refused}
        home = self.home
        if home is not None:  # what this host took of the servers' model at epoch boundaries
            facts["pulled"] = home.facts()
        return facts

    def wake_main(self) -> None:
        self.wake.set()  # the main thread asks the feeder to close (it owns the control words)

    # -- the main thread ---------------------------------------------------------------------------

    def start(self) -> str:
        """Start the partitions and take the servers' model; the ready line's description."""
        from hogwild.logs import role_logger
        from hogwild.partition.host_rows import HostRows
        from hogwild.shm.sweeper import sweep_report

        for line in sweep_report():  # as an unpartitioned replica does: a killed one's segments
            role_logger(f"replica {self.index}").info("%s", line)
        warm_kernels(self.plan, self.config.train.in_flight)
        n = self.network.n_params
        self._start(np.zeros(n, np.float32), np.zeros(n, np.float32))  # the servers' comes next
        self.home = HostRows.open(
            STORE, self.store.home_spec(0), self.arena, self.network, self.config, self.plan,
            self.local,
        )  # fmt: skip
        self._take_the_servers_model()
        cpus = ", ".join(str(p.cpu) for p in self.placements)
        where = f"{self.plan.k} partitions on CPUs {cpus}"
        if self.groups is not None:
            here = ", ".join(map(str, self.local))
            others = "; ".join(
                f"{', '.join(map(str, self.groups.members(g)))} at {self.groups.addresses[g]}"
                for g in self.followers
            )
            where = f"{self.plan.k} partitions: {here} here on CPUs {cpus}, {others}"
        return (
            f"replica {self.index} ({where}, {self.config.train.in_flight} examples in flight; "
            f"{self.store.home_name()})"
        )

    def step(self) -> None:
        """Begin the next portion it holds when idle; follow the one under way."""
        portion = self.portion
        if portion is None or not portion.running:
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                self.wake.wait(POLL_S)
                self.wake.clear()
                return
            self._begin(command)
        self._check_alive(f"training epoch {self.portion.epoch + 1}")
        self._follow(self.portion)
        if self.portion.running:
            self.wake.wait(0.005)
            self.wake.clear()

    def release(self) -> None:
        try:  # the stop lines, for the log: a print to a closed pipe must not skip the cleanup
            if self.receiver is not None:  # what crossed between the hosts
                print(
                    f"hogwild replica: replica {self.index}'s link took {self.receiver.blocks} "
                    f"messages from its partition hosts and refused {self.receiver.refused}",
                    file=sys.stderr,
                    flush=True,
                )
            if self.home is not None:
                print(f"hogwild replica: replica {self.index} {self.home.said()}",
                      file=sys.stderr, flush=True)  # fmt: skip
        finally:
            try:
                self.release_endpoint()
                if self.home is not None:
                    self.home.close()
                    self.home = None
            finally:
                self._shutdown()  # the partitions and the arena, whatever came before

    def _begin(self, command: Train) -> None:
        from hogwild.shm.atomics import atomic_store

        previous = self.portion
        if previous is not None and previous.epoch != command.epoch:
            self._take_the_servers_model()  # every partition flushed the last portion
        size = command.stop - command.start
        order = self.arena.array("order")
        permutation = epoch_permutation(self.config.train.seed, command.epoch, self.n_train)
        order[(self.handed + np.arange(size)) % len(order)] = permutation[
            command.start : command.stop
        ]
        self.arena.array("floats")[proc.LR] = command.lr
        if not self.begin(command):  # closed before it began: it trains nothing
            self.handed += size
            atomic_store(self.arena.array("control"), proc.COUNT, self.handed)

    def _check_moving(self, portion: PartitionedPortion, completed: int) -> None:
        """Raise :class:`~hogwild.errors.WorkerStalledError` when the partitions, all alive,
        completed no example for ``train.stall_s`` seconds."""
        now = time.monotonic()
        if completed != portion.completed:
            portion.completed, portion.moved = completed, now
        elif now - portion.moved > self.config.train.stall_s:
            raise WorkerStalledError(
                f"replica {self.index}: its partitions completed no example in "
                f"{self.config.train.stall_s:.0f} s of epoch {portion.epoch + 1}"
            )

    def _follow(self, portion: PartitionedPortion) -> None:
        """Ask the feeder to close, the partitions to flush, as due; the figures once done."""
        from hogwild.shm.atomics import atomic_load, atomic_store

        control = self.arena.array("control")
        with self.lock:
            close = portion.epoch <= self.closed_epoch
        if close and not portion.closing and not portion.flushing:
            self.closes += 1
            portion.closing = self.closes
            atomic_store(control, proc.CLOSE, self.closes)
        if not portion.flushing:
            if portion.closing and atomic_load(control, proc.CLOSED) != portion.closing:
                return  # the feeder has not cut what it hands out yet
            count = atomic_load(control, proc.COUNT)
            completed = int(self.totals()[proc.STAT_EXAMPLES])
            if completed < count:  # examples in flight
                self._check_moving(portion, completed)
                return
            self.handed = count  # a close cut it to what was fed
            self.flushes += 1
            portion.flushing = self.flushes
            portion.flush_deadline = time.monotonic() + FLUSH_TIMEOUT_S
            atomic_store(control, proc.FLUSH, self.flushes)
            if self.followers:  # their partitions push their rows' progress too
                from hogwild.partition import frames as fr

                self.receiver.await_round(fr.FLUSHED, self.flushes)
                for g in self.followers:
                    self.outbox.send(g, fr.encode(fr.FLUSH, 0, a=self.flushes))
        flushed = [atomic_load(control, proc.FLUSHED + 8 * p) for p in self.local]
        if self.followers:
            from hogwild.partition import frames as fr

            if not self._followers_answered(fr.FLUSHED, portion.flushing):
                flushed.append(-1)
        if any(f != portion.flushing for f in flushed):
            if time.monotonic() > portion.flush_deadline:
                raise PartitionDiedError(
                    f"replica {self.index}: the partitions did not push a portion's progress to "
                    f"the parameter servers within {FLUSH_TIMEOUT_S:.0f} s"
                )
            return
        done = self.totals() - portion.before
        self.finish(
            portion,
            examples=int(done[proc.STAT_EXAMPLES]),
            loss=float(done[proc.STAT_LOSS]),
            correct=int(done[proc.STAT_CORRECT]),
            store_wait_s=float(done[proc.STAT_STORE_WAIT]),
        )
