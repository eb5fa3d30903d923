"""``hogwild cluster``: the driver that starts a job's roles, runs its epochs and stops it all.

The driver is the job's one process on the user's side (Adam section 3; DistBelief's Downpour,
section 4.1). It:

1. writes the resolved config into the run directory (every role reads it), picks the
   parameter servers' addresses and starts them (``hogwild ps serve``) and the data servers
   (``hogwild data serve``) side by side, through the launcher ``cluster.launcher`` names;
2. gives the servers the model: the initial weights, or the checkpoint's with ``--resume``
   (through the ``ps`` parameter store's parent side, :mod:`hogwild.store`);
3. starts the model replicas (``hogwild cluster replica``, side by side), which join that
   model. The job's
   topology (:mod:`hogwild.cluster.topology`) says what a replica role is: a Downpour replica,
   or with ``cluster.framework`` ``"sandblaster"``, ``"allreduce"`` or ``"hybrid"`` a worker
   group (a coordinator, L-BFGS or synchronous SGD, and its replica threads,
   :mod:`hogwild_plugins.ps.sandblaster.group`); with ``"hogwild"`` (distributed Hogwild)
   several server groups, each replica bound to one and synchronising them every
   ``cluster.sync_every`` examples, and the driver making them one model at every epoch end
   (:mod:`hogwild_plugins.ps.groups`); what is not built is refused before anything starts;
4. runs the epochs with :class:`~hogwild.cluster.coordinator.Coordinator` (each epoch's
   permutation handed out in portions on demand, warm start, the epoch rule across replicas),
   polling each replica's progress; at every epoch end it pulls the servers' model and evaluates
   it on the test set, then starts the next epoch (``cluster.evaluate = "between"``; with
   ``"beside"`` the next epoch starts at once and a thread evaluates meanwhile:
   :func:`evaluates_between`); then it writes the epoch's checkpoint (the format ``hogwild
   train`` writes: ``hogwild eval`` and ``torch.nn`` load it) and metrics line
   (:mod:`hogwild.cluster.records`);
5. restarts a replica or a data server that dies while the job trains, up to
   ``cluster.restarts`` times each (a line on stderr, a ``restart`` metrics record; the counts go
   into the status table and the final summary): a data server comes back on its address and
   rejoins the replicas' turn, a replica pulls the servers' model as it starts and takes the
   work the coordinator hands it (what it lost, or what is left: :class:`Lost`);
6. stops every role at the end, on Ctrl-C or SIGTERM, and when a role dies that is not restarted
   (a parameter server, whose state is lost with one copy, or a role past its restarts): an
   error naming the role, its host and its exit status or signal; the last checkpoint is kept.

It answers ``status`` control requests (the table :mod:`hogwild.cluster.status` draws) on the
address it writes to ``RUN_DIR/cluster.json``, which ``hogwild cluster status`` reads.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

from hogwild.blas import limit_blas_threads
from hogwild.cluster.coordinator import (
    Close,
    Coordinator,
    EpochEnd,
    Finished,
    Joined,
    Lost,
    StartPortion,
    replicas_training,
    status_events,
)
from hogwild.cluster.launcher import RoleExit, RoleFailedError, launcher_class
from hogwild.cluster.polling import PollSchedule, training_rate
from hogwild.cluster.prometheus import role_ports, serve_metrics
from hogwild.cluster.records import EndedEpoch, EpochRecords, merge_histograms
from hogwild.cluster.roles import on_port_of, plan_roles, with_servers
from hogwild.cluster.status import LiveStatus, format_table, replica_row, server_row
from hogwild.cluster.topology import require_built, resolve_topology
from hogwild.config import PS_DEFAULT_LR
from hogwild.errors import HogwildError
from hogwild.model.network import build_network
from hogwild.net.address import is_loopback, parse_address
from hogwild.net.auth import make_keys
from hogwild.net.control import ControlClient, ControlServer
from hogwild.optim.schedule import learning_rate
from hogwild.progress import Progress as ProgressLines
from hogwild.shm.arena import Arena, ArenaLayout
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.store.registry import store_class
from hogwild.training.job import plan_data, subset_indices
from hogwild.training.metrics import MetricsWriter
from hogwild.training.resume import check_directory, starting_point

KEEP_ALIVE_S = 5.0  # the longest a live replica goes without a request from the driver
STOP_GRACE_S = 10.0  # replicas told to stop release their workers and arena by themselves
# The smallest portion of an epoch per worker of a replica: the last portions of an epoch are
# this size, so replicas finish within about one of each other; each costs a push and a round
# trip to the driver, which cadence 512 (Downpour's) makes one exchange's worth of training.
MIN_PORTION_PER_WORKER = 256


def evaluates_between(cluster) -> bool:
    """Whether the replicas wait for each epoch's evaluation (``cluster.evaluate``).

    ``auto``: between epochs with the local launcher, whose driver shares the replicas' cores
    (an evaluation beside training gets a third of a core there and slows the epoch beside
    it), beside training with Ray, whose driver usually has a machine of its own.
    """
    if cluster.evaluate == "auto":
        return cluster.launcher == "local"
    return cluster.evaluate == "between"


def job_name(config) -> str:
    """The job's name on the wire: ``ps.job``, else the config file's stem."""
    if config.ps.job:
        return config.ps.job
    origin = config.origin
    return Path(origin).stem if origin and not origin.startswith("<") else "adam_mnist"


class ClusterDriver:
    """One ``hogwild cluster`` job (see the module docstring).

    Args:
        config: The resolved job config (``[cluster]`` says which roles).
        data: The data as the driver evaluates it (MNIST arrays or an image cache's manifest);
            the roles read ``data.source`` (a directory of idx files, or the cache).
        resume: Continue from the last checkpoint in ``output.checkpoint_dir``.
        overwrite: Replace the checkpoints there.
    """

    def __init__(self, config, data, *, resume=False, overwrite=False) -> None:
        self.job = job_name(config)
        self.topology = topology = resolve_topology(config.cluster, config.ps.rule)
        require_built(topology, config.cluster.copies)  # refused: what is not built
        if topology.coordinated:  # sandblaster, allreduce, hybrid: a coordinator per group
            from hogwild_plugins.ps.sandblaster.group import check_job

            check_job(config, data, topology.framework)
        servers = {}  # L-BFGS bypasses the servers' rule, and ps.rule must stay "auto"
        if topology.optimizer != "lbfgs":
            rule = topology.server_rule(config.ps.rule)
            servers = {"ps.rule": rule, "ps.lr": config.ps.lr or PS_DEFAULT_LR[rule]}
        if topology.server_groups > 1:  # the roles' plan counts every group's servers
            servers["cluster.server_groups"] = topology.server_groups
        self.config = config.override(
            {**topology.cluster_overrides(), "ps.job": self.job, **servers}
        )
        self.data, self.source, self.resume = data, self.config.data.source, resume
        self.replace_old = check_directory(config.output.checkpoint_dir, resume, overwrite)
        plan, n_train, self.n_test = plan_data(self.config, data, 1)
        subset = subset_indices(self.config.train.seed, n_train, self.config.train.subset)
        self.n_train = n_train if subset is None else len(subset)  # as each replica chooses
        self.n_classes = plan.n_classes
        self.network = build_network(self.config.model, self.n_classes)
        self.evaluate_between = evaluates_between(self.config.cluster)
        self.progress = ProgressLines(self.config.output.progress, self.network.connections)
        self.metrics = MetricsWriter(self.config.output.metrics)
        self.live = LiveStatus(self.config.output.progress)
        self.records: EpochRecords | None = None  # the epochs' test figures, lines, checkpoints
        self.run_dir: Path | None = None
        self.own_run_dir = False
        self.launcher = self.arena = self.store = self.control = self.etcd = None
        self.groups = None  # several server groups: every group's clients (distributed Hogwild)
        self.train_started = 0.0
        self.clients: list[ControlClient] = []
        self.last_status: dict[int, dict] = {}
        self.polls = PollSchedule()  # when to ask the replicas next
        self.gone: set[str] = set()  # roles the launcher saw exit
        self.exits: dict = {}  # their RoleExit, by name: how each ended (until restarted)
        self.specs: dict = {}  # the replicas' and data servers' specs as started, by name
        self.restarts: dict[str, int] = {}  # restarts so far, by role name
        self.last_keep_alive = 0.0
        self.endpoint = None  # the driver's Prometheus endpoint (cluster.metrics_port)
        self.rows: list[dict] = []

    # -- the job ---------------------------------------------------------------------------------

    def run(self) -> dict:
        with terminate_as_interrupt():
            try:
                result = self._run()
            except BaseException:
                with deferred_signals():  # the job's own error is what the user must see
                    try:
                        self._shutdown()
                    except Exception as exc:  # noqa: BLE001
                        print(f"hogwild cluster: while stopping: {exc}", file=sys.stderr)
                raise
            with deferred_signals():
                self._shutdown()
            return result

    def _run(self) -> dict:
        config, cluster = self.config, self.config.cluster
        self._make_run_dir()
        config = self.config = self._with_keys(config)
        if cluster.copies > 1:
            config = self.config = self._with_etcd(config)
        self.records = self._records(config)
        config_file = str(self.run_dir / f"{self.job}.json")
        Path(config_file).write_text(json.dumps(config.to_dict()))
        self.launcher = launcher_class(cluster.launcher)(config, str(self.run_dir))
        plan = plan_roles(config, config_file, self.source, cluster.host)
        servers = self.launcher.reserve(plan.ps, cluster.host)
        stores = [str(self.run_dir / f"ps-{i}") for i in range(len(servers))]
        for store in stores:  # a server's store recovers a crash within a job, never a new job:
            shutil.rmtree(store, ignore_errors=True)  # the model comes from init or --resume
        per_group = cluster.ps  # a server group's servers; the groups are listed one after another
        with_servers(plan, config_file, self.job, servers, stores, per_group)
        self._give_metrics_ports(plan)
        if cluster.copies > 1:  # a dead server is replaced: it rejoins and catches up
            self.specs.update({spec.name: spec for spec in plan.ps})
        self.records.warm()
        data_servers = self.launcher.start_all([*plan.ps, *plan.data])[len(plan.ps) :]
        for spec, address in zip(plan.data, data_servers, strict=True):
            self.specs[spec.name] = on_port_of(spec, address)  # a restart comes back there
        groups = [servers[i : i + per_group] for i in range(0, len(servers), per_group)]
        start_epoch, history = self._give_the_servers_the_model(groups)
        self.records.history.extend(history)  # a resumed job's epochs
        extra = [f"--data.servers={','.join(data_servers)}"] if data_servers else []
        if len(groups) > 1:
            extra.append(f"--cluster.group_servers={','.join(servers)}")
        replicas = []
        for spec in plan.replicas:  # each worker group trains against its server group
            group = groups[spec.index * len(groups) // len(plan.replicas)]
            argv = (*spec.argv, f"--ps.servers={','.join(group)}", *extra)
            replicas.append(replace(spec, argv=argv))
            self.specs[spec.name] = replicas[-1]
        addresses = self.launcher.start_all(replicas)
        self.clients = [self._client(i, a) for i, a in enumerate(addresses)]
        self._serve_status()
        self.progress.line(
            f"hogwild cluster: {self.topology.describe()}; {cluster.replicas} replica(s) x "
            f"{cluster.workers_per_replica} worker(s), {len(servers)} parameter server(s) "
            f"({config.ps.rule}), "
            f"{len(data_servers)} data server(s), launcher {cluster.launcher}; "
            f"{self.n_train:,} training examples; run directory {self.run_dir}"
        )
        self.metrics.write(
            {
                "event": "start",
                "connections": self.network.connections,
                "replicas": cluster.replicas,
                "workers_per_replica": cluster.workers_per_replica,
                "framework": self.topology.framework,
                "optimizer": self.topology.optimizer,
                "ps_servers": servers,
                "data_servers": data_servers,
                "start_epoch": start_epoch,
                "evaluate": "between" if self.evaluate_between else "beside",
                **self._cadences(),
                "config": config.to_dict(),
                "pid": os.getpid(),
            }
        )
        return self._epochs(start_epoch)

    def _records(self, config) -> EpochRecords:
        """The epochs' records, made once the config is the roles' (keys, etcd, lease): the
        checkpoints and the final record carry it, and ``--resume`` compares against it."""
        return EpochRecords(
            config, self.network, self.data, n_test=self.n_test, n_classes=self.n_classes,
            n_train=self.n_train, metrics=self.metrics, progress=self.progress, live=self.live,
            replace_old=self.replace_old, between=self.evaluate_between,
            # between epochs the whole machine is the evaluation's: a thread per CPU of the driver
            eval_threads=len(os.sched_getaffinity(0)) if self.evaluate_between else 1,
        )  # fmt: skip

    def _cadences(self) -> dict:
        """The replicas' push and pull cadences as they run them (``train.n_push = 0``: the ps
        store's own); none for a coordinated group, which exchanges on its coordinator's word."""
        if self.topology.coordinated:
            return {}
        from hogwild.store.registry import cadences

        n_push, n_fetch = cadences(self.config.override({"train.parameters": "ps"}))
        return {"n_push": n_push, "n_fetch": n_fetch}

    def _client(self, replica: int, address: str) -> ControlClient:
        return ControlClient(
            address,
            self.job,
            timeout_s=self.config.ps.timeout_s,
            retries=self.config.ps.retries,
            keys=self.config.ps.keys or None,
            alive=self._alive_check(f"replica {replica}"),
        )

    def _make_run_dir(self) -> None:
        directory = self.config.output.checkpoint_dir
        if directory:
            self.run_dir = Path(directory)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.run_dir = Path(tempfile.mkdtemp(prefix="hogwild-cluster-"))
            self.own_run_dir = True

    def _give_metrics_ports(self, plan) -> None:
        """With ``cluster.metrics_port``: each role's own port, as an override on its argv."""
        first = self.config.cluster.metrics_port
        if not first:
            return
        ports = role_ports(first, len(plan.ps), len(plan.data), len(plan.replicas))

        def told(spec):
            return replace(spec, argv=(*spec.argv, f"--cluster.metrics_port={ports[spec.name]}"))

        plan.ps = [told(s) for s in plan.ps]
        plan.data = [told(s) for s in plan.data]
        plan.replicas = [told(s) for s in plan.replicas]
        self.endpoint = serve_metrics("driver", "driver", ports["driver"], self._summary)

    def _summary(self) -> dict:
        """The driver's own gauges: the job's progress as the replicas last reported it."""
        seen = [v["status"] for v in list(self.last_status.values())]
        rows = [v["row"] for v in list(self.last_status.values())]
        return {
            "replicas": len(self.clients),
            "examples": sum(int(s.get("examples") or 0) for s in seen),
            "examples_per_s": sum(float(r.get("ex/s") or 0.0) for r in rows),
            "roles_gone": len(self.gone),
            "restarts": sum(self.restarts.values()),
        }

    def _with_etcd(self, config):
        """``cluster.etcd``: the one given, or an etcd this driver starts on loopback (and
        stops with the job) for the replicated parameter servers' map and leases."""
        from hogwild_plugins.ps.etcd_process import EtcdProcess

        address = config.cluster.etcd
        if not address:
            self.etcd = EtcdProcess()  # its data in a directory of its own, removed with it
            address = self.etcd.start()
            self.progress.line(f"hogwild cluster: etcd for the servers' copies on {address}")
        self._clear_map(address)  # an earlier run's map would name primaries that are gone
        changes = {"cluster.etcd": address}
        if not config.ps.lease_s:  # auto: as short as the etcd honours
            changes["ps.lease_s"] = self.etcd.min_ttl_s if self.etcd is not None else 2
        return config.override(changes)

    def _clear_map(self, address: str | None = None) -> None:
        """Delete every etcd key of this job (its bucket map and members)."""
        from hogwild_plugins.ps.etcd import Etcd
        from hogwild_plugins.ps.routes import etcd_prefix

        with Etcd(address or self.config.cluster.etcd, prefix=etcd_prefix(self.job)) as etcd:
            for key in etcd.get_prefix("")[0]:
                etcd.delete(key)

    def _forget_server(self, index: int) -> None:
        """A parameter server died: end its etcd lease now, so that its buckets fail over at
        once instead of when the lease runs out."""
        from hogwild_plugins.ps.etcd import Etcd
        from hogwild_plugins.ps.routes import etcd_prefix

        try:
            with Etcd(self.config.cluster.etcd, prefix=etcd_prefix(self.job)) as etcd:
                value, _ = etcd.get(f"members/{index}")
                if value is not None and isinstance(value.get("lease"), int):
                    etcd.revoke(value["lease"])
        except HogwildError as exc:  # the lease lapses by itself
            print(f"hogwild cluster: could not end ps {index}'s lease: {exc}", file=sys.stderr)

    def _with_keys(self, config):
        """The job's CURVE keys in ``ps.keys`` (every role reads them there): ``cluster.keys``,
        else made in the run directory when the roles listen beyond loopback."""
        keys = config.cluster.keys or config.ps.keys
        if not keys and not is_loopback(parse_address(f"{config.cluster.host}:0")):
            made = self.run_dir / "keys"
            if not (made / "server.key").exists():  # a resumed job keeps its keys
                make_keys(made)
                self.progress.line(f"CURVE keys for the job's roles made in {made}")
            keys = str(made)
        return config.override({"ps.keys": keys}) if keys != config.ps.keys else config

    def _give_the_servers_the_model(self, groups: list[list[str]]) -> tuple[int, list[dict]]:
        """The parent side of the ``ps`` store: initial or checkpointed weights, given once (to
        every server group: the groups begin as one model)."""
        config, network = self.config, self.network
        self.store = store_class("ps")(config.override({"ps.servers": groups[0]}), network, ())
        layout = ArenaLayout()
        self.store.add_regions(layout)
        self.arena = Arena.create("cluster", layout)
        self.store.attach(self.arena)
        if config.cluster.copies == 1:  # a wait on a dead server ends with the job's error
            self.store.client.peers.alive = lambda: self._check_roles() or True  # not retries
        params, velocity, start_epoch, history = starting_point(
            config, network, self.n_classes, self.resume, self.progress.line
        )
        self.store.load(params, velocity)
        if len(groups) > 1:
            from hogwild_plugins.ps.groups import ServerGroups

            ps = config.ps
            self.groups = ServerGroups(
                groups, self.job, "driver", timeout_s=ps.timeout_s, retries=ps.retries,
                keys=ps.keys or None,
            )  # fmt: skip
            self.groups.assign(self.store.snapshot()[0])
        return start_epoch, history

    def _servers_status(self) -> list[dict]:
        """Every parameter server's counters (every group's)."""
        return self.groups.status() if self.groups is not None else self.store.home_status()

    # -- epochs ----------------------------------------------------------------------------------

    def _epochs(self, start_epoch: int) -> dict:
        config = self.config
        coordinator = Coordinator(
            replicas=len(self.clients),
            n_train=self.n_train,
            epochs=config.train.epochs,
            start_epoch=start_epoch,
            seed=config.train.seed,
            lr_of=lambda e: learning_rate(config.optim, e, config.train.epochs),
            warm_start=config.cluster.warm_start,
            fraction=config.cluster.epoch_fraction,
            # a coordinated group's share is its batch: one fixed shard each
            guided=config.cluster.split == "portions" and not self.topology.coordinated,
            min_portion=MIN_PORTION_PER_WORKER * config.cluster.workers_per_replica,
        )
        wall_start = epoch_start = self.train_started = time.perf_counter()
        pending: deque = deque()
        for r in range(len(self.clients)):
            pending.extend(coordinator.handle(Joined(r)))
        drawn = 0.0
        limit_blas_threads(1)  # the evaluation's threads each call sgemm (see hogwild.blas)
        try:
            while True:
                while pending:
                    instruction = pending.popleft()
                    if isinstance(instruction, StartPortion):
                        self._call(
                            instruction.replica,
                            "train",
                            epoch=instruction.epoch,
                            lr=instruction.lr,
                            start=instruction.start,
                            stop=instruction.stop,
                            seed=instruction.seed,
                        )
                    elif isinstance(instruction, Close):
                        self._call(instruction.replica, "close", epoch=instruction.epoch)
                    elif isinstance(instruction, EpochEnd):
                        ended = self._pull_epoch(instruction, time.perf_counter() - epoch_start)
                        # Evaluated on a thread: beside training, the next epoch starts at once
                        # and this loop goes on polling, so the replicas do not idle through
                        # the evaluation and the driver still sees a role die; between epochs,
                        # it returns once the evaluation is done (see cluster.evaluate).
                        self.records.ended(ended)
                        pending.extend(coordinator.advance())
                        epoch_start = time.perf_counter()
                        self.records.write()
                    elif isinstance(instruction, Finished):
                        return self.records.final(self._job_fields(), wall_start)
                time.sleep(self._poll_delay(coordinator))
                self.records.write()
                self._recover(coordinator, pending)
                for replica in replicas_training(coordinator):
                    pending.extend(self._events(coordinator, replica))
                self._keep_alive(coordinator)
                if time.monotonic() - drawn >= config.cluster.status_s:
                    drawn = time.monotonic()
                    self.live.draw(self._rows())
        except BaseException:
            self.records.stopped()  # keeps what was already evaluated
            raise

    def _job_fields(self) -> dict:
        """The final record's fields of a cluster job (:meth:`EpochRecords.final`)."""
        cluster = self.config.cluster
        return {
            "framework": self.topology.framework,
            "optimizer": self.topology.optimizer,
            "replicas": cluster.replicas,
            "workers": cluster.replicas * cluster.workers_per_replica,
            "ps_servers": self.topology.servers,  # every server group's
            "server_groups": self.topology.server_groups,
            "data_servers": cluster.data_servers,
            "restarts": {name.replace(" ", "-"): n for name, n in sorted(self.restarts.items())},
        }

    def _alive_check(self, name: str):
        """For a role's control client: False once the launcher saw the role exit, so a call
        to a dead replica ends at once instead of after every retry."""

        def alive() -> bool:
            self._poll_roles()
            return name not in self.gone

        return alive

    def _call(self, replica: int, op: str, **body) -> dict | None:
        """A control request to a replica; None when it died and will be restarted (the next
        :meth:`_recover` does it), else a failure names the replica (or the role that died)."""
        name = f"replica {replica}"
        if name in self.exits and self._restartable(name):
            return None  # dead, or a restart that did not start: nobody to ask
        try:
            return self.clients[replica].call(op, **body)
        except HogwildError as exc:
            self._poll_roles()
            if name in self.exits and self._restartable(name):
                return None
            self._check_roles()  # a role that died is the cause: say so
            raise HogwildError(f"replica {replica} did not answer {op!r}: {exc}") from None

    def _keep_alive(self, coordinator: Coordinator) -> None:
        """Ask the replicas that are not training now and then, so they know the driver lives."""
        now = time.monotonic()
        if now - self.last_keep_alive < KEEP_ALIVE_S:
            return
        self.last_keep_alive = now
        training = set(replicas_training(coordinator))
        for replica in range(len(self.clients)):
            if replica not in training:
                self._call(replica, "status")

    def _poll_delay(self, coordinator: Coordinator) -> float:
        """Seconds to sleep before the next poll (:mod:`hogwild.cluster.polling`): shorter when
        a replica is due to finish its current portion (or the warm start), by its rate so far,
        so it is handed its next portion, or the epoch ends and the next one begins, within
        milliseconds of it."""
        due = {}
        for replica in replicas_training(coordinator):
            seen = self.last_status.get(replica)
            left = coordinator.remaining(replica)
            if seen is None or left is None:
                continue
            status = seen["status"]
            rate = training_rate(status) if status.get("epoch") == coordinator.epoch else None
            if left and rate is None:
                continue  # not started yet, or no examples yet: nothing to go by
            portion = (coordinator.epoch, coordinator.current(replica))
            due[replica] = (portion, seen["at"] + (left / rate if left else 0.0))
        return self.polls.delay(time.monotonic(), due)

    def _events(self, coordinator: Coordinator, replica: int) -> list:
        status = self._call(replica, "status")
        if status is None:
            return []
        now, previous = time.monotonic(), self.last_status.get(replica)
        seconds = now - previous["at"] if previous else 0.0
        row = replica_row(status, previous["status"] if previous else None, seconds)
        self.last_status[replica] = {"status": status, "at": now, "row": row}
        out = []
        for event in status_events(replica, status):
            out += coordinator.handle(event)
        return out

    def _pull_epoch(self, end: EpochEnd, seconds: float) -> EndedEpoch:
        """The servers' model at ``end`` (copied: the next epoch changes it) and the epoch's
        record without its test figures, made before the next epoch starts."""
        spread = None
        if self.groups is not None:  # every replica is idle: the groups become one model
            spread = self.groups.sync().spread
        self.store.end_epoch()  # the servers' model, pulled
        params, velocity = self.store.snapshot()
        servers = self._servers_status()
        rate = end.examples / seconds if seconds else 0.0
        counted = not self.topology.coordinated  # a coordinated group counts no answers
        record = {
            "event": "epoch",
            "epoch": end.epoch,
            "lr": end.lr,
            "examples": end.examples,
            "train_loss": end.loss / max(end.examples, 1),
            "train_accuracy": end.correct / max(end.examples, 1) if counted else None,
            "train_s": seconds,
            "wall_s": time.perf_counter() - self.train_started,  # since the first epoch began
            "examples_per_s": rate,
            "connections_per_s": rate * self.network.connections,
            "data_wait_s": end.data_wait_s,
            "fetch_wait_s": end.store_wait_s,
            "store_wait_s": end.store_wait_s,
            "per_replica_examples": {str(k): v for k, v in end.per_replica.items()},
            "updates_per_s": sum(s.get("updates_per_s", 0.0) for s in servers),
            "ps_updates": sum(int(s.get("updates", 0)) for s in servers),  # since they started
            "staleness": merge_histograms(s.get("staleness_histogram") for s in servers),
        }
        groups = {str(r): seen["status"]["sandblaster"] for r, seen in self.last_status.items()
                  if "sandblaster" in seen["status"]}  # fmt: skip
        if groups:  # a Sandblaster group's counters: iterations, passes, portions, backups...
            record["sandblaster"] = groups
        if self.groups is not None:  # the worker groups' synchronisations and the driver's
            replicas = sum(seen["status"].get("syncs", 0) for seen in self.last_status.values())
            record["group_syncs"] = self.groups.syncs + replicas
            record["group_spread"] = spread  # the largest |p_g - mean| before the epoch's sync
        return EndedEpoch(record, params.copy(), velocity.copy())

    # -- roles -----------------------------------------------------------------------------------

    def _poll_roles(self) -> None:
        """Record the roles the launcher saw exit (each is reported by it once)."""
        for exit_ in self.launcher.poll():
            self.exits.setdefault(exit_.name, exit_)
            self.gone.add(exit_.name)
            spec = self.specs.get(exit_.name)
            if spec is not None and spec.kind == "ps" and self.config.cluster.copies > 1:
                self._forget_server(spec.index)  # now: its buckets fail over at once

    def _restartable(self, name: str) -> bool:
        """A replica or data server below ``cluster.restarts``; a parameter server too with
        ``cluster.copies > 1`` (with one copy its state dies with it)."""
        if name not in self.specs:  # a parameter server
            return False
        return self.restarts.get(name, 0) < self.config.cluster.restarts

    def _check_roles(self) -> None:
        """Stop the job with an error naming every role that exited, if one is not restarted."""
        self._poll_roles()
        if any(not self._restartable(name) for name in self.exits):
            kept, limit = self.config.output.checkpoint_dir, self.config.cluster.restarts

            def told(exit_) -> str:
                if not limit or self._restartable(exit_.name):
                    return exit_.describe()
                if exit_.name not in self.specs:
                    return f"{exit_.describe()} (a parameter server is not restarted)"
                return f"{exit_.describe()} (restarted {limit} times already: cluster.restarts)"

            raise RoleFailedError(
                "; ".join(told(e) for e in self.exits.values())
                + "; the job is stopped"
                + (f" and the last checkpoint in {kept} is kept" if kept else "")
            )

    def _recover(self, coordinator: Coordinator, pending: deque) -> None:
        """Restart the roles that exited (parameter servers, then data servers: a replica
        starting reads from them), or stop the job as :meth:`_check_roles` says."""
        self._check_roles()
        order = {"ps": 0, "data": 1, "replica": 2}
        for name in sorted(self.exits, key=lambda n: order[self.specs[n].kind]):
            self._restart(name, coordinator, pending)

    def _restart(self, name: str, coordinator: Coordinator, pending: deque) -> None:
        """Start a dead role again through the launcher and wait (``cluster.start_timeout_s``)
        until it serves; a replica rejoins the coordinator's epochs."""
        exit_, spec = self.exits.pop(name), self.specs[name]
        count = self.restarts[name] = self.restarts.get(name, 0) + 1
        self.live.clear()
        print(
            f"hogwild cluster: {exit_.describe()}; restarting ({count} of "
            f"{self.config.cluster.restarts})",
            file=sys.stderr,
            flush=True,
        )
        if spec.kind == "replica":
            pending.extend(coordinator.handle(Lost(spec.index)))
            self.clients[spec.index].close()
            self.last_status.pop(spec.index, None)
        try:
            address = self.launcher.restart(spec)
        except RoleFailedError as exc:  # its next death: restarted again while restarts remain
            self.exits[name] = RoleExit(name, exit_.host, None, why=str(exc))
            return  # (after the data servers: a replica may not start while none answers)
        self.gone.discard(name)
        if spec.kind == "replica":
            self.clients[spec.index] = self._client(spec.index, address)
            pending.extend(coordinator.handle(Joined(spec.index)))
        elif on_port_of(spec, address) != spec:
            raise RoleFailedError(
                f"{name} came back on {address}, not where the replicas were told it is"
            )
        self.metrics.write(
            {"event": "restart", "role": name, "host": exit_.host, "returncode": exit_.returncode,
             "restart": count, "address": address}
        )  # fmt: skip
        self._write_where()

    def _rows(self) -> list[dict]:
        rows = [seen["row"] for _, seen in sorted(self.last_status.items())]
        rows += [{"role": n, "state": "serving"} for n, s in self.specs.items() if s.kind == "data"]
        rows = [{**row, "restarts": self.restarts.get(row["role"], 0)} for row in rows]
        try:
            rows += [server_row(s) for s in self._servers_status()]
        except HogwildError:
            pass
        self.rows = rows
        return rows

    def _serve_status(self) -> None:
        def act(op: str, body: dict) -> dict:
            if op == "status":
                return {"job": self.job, "rows": self.rows, "table": format_table(self.rows)}
            from hogwild.net.control import ControlRefused

            raise ControlRefused(f"unknown op {op!r} (status)")

        self.control = ControlServer(
            f"{self.config.cluster.host}:0", self.job, act, keys=self.config.ps.keys or None
        )
        self.control.start()
        self._write_where()

    def _write_where(self) -> None:
        """``RUN_DIR/cluster.json``: where the driver answers, and its roles (their pids)."""
        where = {
            "job": self.job,
            "address": self.control.address,
            "pid": os.getpid(),
            "roles": self.launcher.describe(),
            "keys": self.config.ps.keys or None,
        }
        path = self.run_dir / "cluster.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(where))
        temporary.replace(path)  # a reader never sees half of it

    def _shutdown(self) -> None:
        """Release everything, each step whatever the others did; the first failure is raised."""
        self.live.clear()
        self.progress.close()
        failures: list[BaseException] = []

        def step(release) -> None:
            try:
                release()
            except Exception as exc:  # noqa: BLE001 - the next steps must still run
                failures.append(exc)

        if self.launcher is not None:
            step(self._poll_roles)
        step(self._tell_replicas_to_stop)
        asked = bool(self.clients)
        self.clients = []
        if self.launcher is not None:
            step(lambda: self.launcher.stop_all(grace_s=STOP_GRACE_S if asked else 0.0))
        if self.etcd is not None:  # after the servers: they give their leases back
            step(self.etcd.stop)
            self.etcd = None
        elif self.config.cluster.copies > 1 and self.config.cluster.etcd:
            step(self._clear_map)  # someone else's etcd: leave nothing of this job in it
        if self.control is not None:
            step(self.control.stop)
        if self.endpoint is not None:
            step(self.endpoint.close)
            self.endpoint = None
        if self.groups is not None:
            step(self.groups.close)
            self.groups = None
        if self.store is not None:
            step(self.store.close)
            self.store = None
        if self.arena is not None:
            step(self.arena.close)
            step(self.arena.unlink)
            self.arena = None
        if self.records is not None:
            step(self.records.close)
        if self.run_dir is not None:
            step(lambda: (self.run_dir / "cluster.json").unlink(missing_ok=True))
            if self.own_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        if failures:
            raise failures[0]

    def _tell_replicas_to_stop(self) -> None:
        for index, client in enumerate(self.clients):
            try:
                if f"replica {index}" not in self.gone:  # nobody there to answer: do not wait
                    client.call("stop")
            except HogwildError:
                pass
            finally:
                client.close()
