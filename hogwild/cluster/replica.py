"""A model replica of a cluster job: the single-node engine, its epochs given by the driver.

Adam section 3.2 and DistBelief's Downpour (section 4.1): a replica is the trainer of
:mod:`hogwild.training.trainer` (its arena, its ``cluster.workers_per_replica`` worker
processes training Hogwild-style, each on its copy of the parameters) whose parameter store is
``ps``: the copies' communication threads push every ``train.n_push`` examples and pull every
``train.n_fetch`` from the parameter servers (the wait is measured: ``store_wait_s``). What a
replica does not decide is its work: it serves control requests from the driver, which runs
:mod:`hogwild.cluster.coordinator`, through the one serve loop of every replica role
(:class:`~hogwild.cluster.serving.ReplicaServer`; this module's :class:`TrainerReplica` is its
:class:`~hogwild.cluster.serving.ServedRole`, keeping its portions as every replica role does:
:class:`~hogwild.cluster.replica_role.PortionRole`):

- ``train`` (epoch, lr, seed, start, stop): train the portion ``order[start:stop]`` of the
  epoch's permutation (computed here from the job's seed), split over the replica's workers,
  after the portions it holds already (the driver hands out the next one ahead, so the workers
  go on without waiting for it);
- ``close`` (epoch): stop what it holds of the epoch at the next chunk (Adam's epoch rule
  across replicas);
- ``status``: the epoch's finished portions with their figures, and the progress of the one
  under way;
- ``stop``: leave.

With several server groups (distributed Hogwild, SINGA 5.2) the replica is a worker group bound
to its own server group (``ps.servers``); the first replica bound to each server group, after
every ``cluster.sync_every`` examples it has trained (and before it reports a portion done), moves
its server group to the groups' mean (:class:`hogwild.cluster.group_sync.GroupSync`, through the
shards' operations) while its workers go on training.

Every request its parameter-store clients send carries the replica's fencing token (its index and
``--incarnation``, the driver's count of its starts: :mod:`hogwild.net.fencing`): once the driver
has restarted it elsewhere (it took this process for dead), the servers refuse this one.

The network thread only records a command; the main thread acts on it, drives the workers and
keeps the portions' state. A replica whose driver has not asked anything for
:data:`~hogwild.cluster.serving.DRIVER_SILENCE_S` seconds (longer while the driver may still be
starting the other replicas) takes the driver for dead and leaves, releasing everything.
"""

from __future__ import annotations

import os
import queue

from hogwild.cluster.group_sync import GroupSync
from hogwild.cluster.replica_role import PortionRole, driver_silence_s
from hogwild.cluster.services import worker_group
from hogwild.cluster.serving import POLL_S, ReplicaServer
from hogwild.config.topology import replica_starts_workers, resolve_topology
from hogwild.errors import ConfigError
from hogwild.logs import role_logger
from hogwild.model.seeds import worker_seed
from hogwild.net.fencing import fencing_token
from hogwild.shm.sweeper import sweep_report
from hogwild.training.job import CONTROL_EPOCH, EPOCH_CLOSED, STAT_EXAMPLES, epoch_permutation
from hogwild.training.messages import Train, Trained
from hogwild.training.trainer import Trainer


class TrainerReplica(Trainer, PortionRole):
    """One model replica: the single-node engine as a served role (see the module docstring)."""

    def __init__(self, config, data, index: int, incarnation: int = 0) -> None:
        config = config.override(
            {
                "ps.token": fencing_token(index, incarnation),  # what the driver fences
                "train.workers": config.cluster.workers_per_replica,
                "train.parameters": "ps",
                "train.sync": False,
                "output.checkpoint_dir": "",
                "output.metrics": "",
                "output.tensorboard": "",  # the driver writes the job's
                "output.progress": False,
            }
        )
        Trainer.__init__(self, config, data)
        # The driver asks every live replica at least every few seconds; it may be busy starting
        # the other replicas for up to start_timeout_s each before it asks anything.
        cluster = config.cluster
        PortionRole.__init__(self, config, index, driver_silence_s(config, cluster.replicas + 1))
        self.n_test = 0  # the driver evaluates: no test examples in a replica's arena
        self.answered = 0  # the workers that answered for the portion under way
        self.group_sync = GroupSync(config, index)  # several server groups: its part

    # -- the network thread (ReplicaServer's requests) --------------------------------------------

    @property
    def job(self) -> str:
        return self.store.reach["job"]

    def facts(self) -> dict:
        return {"workers": self.n_workers, "cpus": [p.cpu for p in self.placements]}

    def wake_main(self) -> None:
        self.gang.wake()  # an idle main thread begins it now, not at its next poll

    def closing(self, epoch: int) -> None:
        portion = self.portion
        if portion is not None and portion.epoch == epoch and portion.running:
            self.arena.array("control")[CONTROL_EPOCH] = EPOCH_CLOSED

    def more_status(self) -> dict:
        return self.group_sync.status()

    # -- the main thread ---------------------------------------------------------------------------

    def start(self) -> str:
        """Start the workers (and the server groups' clients); the ready line's description."""
        for line in sweep_report():
            role_logger(f"replica {self.index}").info("%s", line)
        self._start()
        reach = self.store.reach
        self.group_sync.open(reach["job"], reach["etcd"] or None, reach["etcd_tls"] or None)
        cpus = ", ".join(str(p.cpu) for p in self.placements)
        return (
            f"replica {self.index} ({self.n_workers} worker(s) on CPUs {cpus}; "
            f"{self.store.summary()})"
        )

    def step(self) -> None:
        """Begin the next portion it holds when idle; take what the workers answer; synchronise
        the server groups when due."""
        portion = self.portion
        if portion is None or not portion.running:  # idle: the next portion it holds, if any
            try:
                self._begin(self.commands.get_nowait())
            except queue.Empty:
                pass
        message = self.gang.poll(f"replica {self.index}'s portion", POLL_S)
        if isinstance(message, Trained):
            self._answered(message)
        portion = self.portion
        if self.group_sync.groups is not None and portion is not None and portion.running:
            self.group_sync.when_due(self._trained())  # a finished portion has synchronised

    def release(self) -> None:
        try:
            self.group_sync.close()
        finally:  # the workers and the arena go whatever the groups' clients did
            try:
                self.release_endpoint()
            finally:
                self._shutdown()

    def _trained(self) -> float:
        """Examples its workers trained, in all (when its server group is due a
        synchronisation)."""
        return float(self.arena.array("stats")[:, STAT_EXAMPLES].sum())

    def _begin(self, command: Train) -> None:
        previous = self.portion
        if previous is None or previous.epoch != command.epoch:
            if previous is not None:  # every copy takes the servers' model before the epoch
                self.store.end_epoch()
            self.arena.array("order")[:] = epoch_permutation(
                self.config.train.seed, command.epoch, self.n_train
            )
        self.answered = 0
        self.begin(command)
        size = command.stop - command.start
        for worker in range(self.n_workers):
            lo = command.start + round(worker * size / self.n_workers)
            hi = command.start + round((worker + 1) * size / self.n_workers)
            seed = worker_seed(command.seed, command.epoch, worker)
            self.gang.send(worker, Train(command.epoch, command.lr, lo, hi, seed))

    def beginning(self, command: Train, closed: bool) -> None:
        # under the lock: a `close` that comes now finds the portion begun and closes it
        control = self.arena.array("control")
        control[CONTROL_EPOCH] = EPOCH_CLOSED if closed else command.epoch

    def _answered(self, message: Trained) -> None:
        portion = self.portion
        if portion is None or message.epoch != portion.epoch or not portion.running:
            return
        self.answered += 1
        portion.examples += message.examples
        portion.loss += message.loss
        portion.correct += message.correct
        portion.data_wait_s += message.data_wait_s
        portion.store_wait_s += message.store_wait_s
        if self.answered == self.n_workers:
            if self.group_sync.groups is not None:  # before "done": not beside the driver's
                self.group_sync.when_due(self._trained())
            self.finish(portion)


def run_replica(args) -> int:
    """``hogwild cluster replica``: one replica of a running cluster job (started by a launcher);
    with a coordinated topology (Sandblaster, AllReduce, hybrid), the worker group its framework
    registers (:func:`hogwild.cluster.services.worker_group`)."""
    from hogwild.config import load_config
    from hogwild.data.plan import load_data

    config = load_config(args.config, getattr(args, "overrides", None) or None)
    incarnation = getattr(args, "incarnation", 0)
    keys = args.keys or config.ps.keys or None
    topology = resolve_topology(config.cluster, config.ps.rule)
    if replica_starts_workers(config) and getattr(args, "fork_workers_server", False):
        _fork_workers_server(f"replica {args.index} of the job of {args.config}")
    if config.model.partitions > 1:  # one replica over K partition processes
        from hogwild.cluster.partitioned import PartitionedReplica

        config = config.override({"ps.token": fencing_token(args.index, incarnation)})
        role = PartitionedReplica(config, load_data(config, args.data), args.index)
    elif topology.coordinated:  # sandblaster, allreduce, hybrid
        group = worker_group(topology.framework)
        config = config.override({"ps.token": fencing_token(args.index, incarnation)})
        role = group(topology.framework, config, load_data(config, args.data), args.index)
    else:
        # With data servers its workers read from them and the plan comes from their answer:
        # the idx files (both splits, decompressed) would be read for nothing
        data = None if config.data.servers else load_data(config, args.data)
        role = TrainerReplica(config, data, args.index, incarnation)
    return ReplicaServer(role, args.bind, keys).serve()


def _fork_workers_server(role: str) -> None:
    """The replica's workers' forkserver forked from this process now, while it runs one thread
    (:func:`hogwild.training.zygote.import_and_fork_server`): a role started as a fresh
    interpreter (the Ray launcher's roles, a local role spawned) would otherwise start a second
    fresh interpreter that imports numba again for its first gang, about a second and a half of
    CPU per start (a coordinated framework's replica, whose group trains in its own processes,
    starts none). A role forked from the local launcher's role server has one already (forked
    there): this is then a no-op, as it is wherever the fork is refused (the reason is logged;
    the first gang starts a server the usual way). ``role`` names the process in the server's
    title, with the job's config, so that whatever finds the job's processes by their command
    line (its run directory, or a node's mirror of it) finds this one."""
    from hogwild.training.zygote import import_and_fork_server

    import_and_fork_server(f"pid {os.getpid()}, {role}")


def run_member(args) -> int:
    """``hogwild cluster member``: one member process of a synchronous worker group (started by
    a launcher once its group serves), as the framework's registered group serves it."""
    from hogwild.config import load_config
    from hogwild.data.plan import load_data

    config = load_config(args.config, getattr(args, "overrides", None) or None)
    topology = resolve_topology(config.cluster, config.ps.rule)
    if not topology.coordinated:
        raise ConfigError(
            f"hogwild cluster member: cluster.framework = {topology.framework!r} has no "
            "synchronous worker groups (sandblaster, allreduce, hybrid have)"
        )
    if not 0 <= args.index < config.cluster.replicas * config.cluster.workers_per_replica:
        raise ConfigError(
            f"--index {args.index}: the job's groups have "
            f"{config.cluster.replicas * config.cluster.workers_per_replica} members"
        )
    group = worker_group(topology.framework)
    keys = args.keys or config.ps.keys or None
    # its pushes carry its group's token: fenced with the group when the group is replaced
    own_group = args.index // config.cluster.workers_per_replica
    config = config.override({"ps.token": fencing_token(own_group, args.incarnation)})
    data = load_data(config, args.data)
    return group.serve_member(config, data, args.index, args.coordinator, args.bind, keys)
