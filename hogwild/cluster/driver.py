"""``hogwild cluster``: the driver that starts a job's roles, runs its epochs and stops it all.

The driver is the job's one process on the user's side (Adam section 3; DistBelief's Downpour,
section 4.1). This module is the orchestration; each concept it uses lives in its own module.
It:

1. writes the resolved config into the run directory (every role reads it), picks the
   parameter servers' addresses and starts them (``hogwild ps serve``) and the data servers
   (``hogwild data serve``) side by side, through the launcher ``cluster.launcher`` names
   (:mod:`hogwild.cluster.roles` plans them);
2. gives the servers the model: the initial weights, or the checkpoint's with ``--resume``
   (:mod:`hogwild.cluster.servers`, through the ``ps`` parameter store's parent side);
3. starts the model replicas (``hogwild cluster replica``, side by side), which join that
   model. The job's topology (:mod:`hogwild.config.topology`) says what a replica role is: a
   Downpour replica, or with ``cluster.framework`` ``"sandblaster"``, ``"allreduce"`` or
   ``"hybrid"`` a worker group (a coordinator, L-BFGS or synchronous SGD, and its replica
   threads); with ``"hogwild"`` (distributed Hogwild), or the hybrid with
   ``cluster.server_groups`` > 1, several server groups, each replica or worker group bound to one
   and synchronising them every ``cluster.sync_every`` examples
   (:mod:`hogwild.cluster.group_sync`; which group each unit trains against:
   :mod:`hogwild.cluster.group_binding`), and the driver making them one model at every epoch
   end. What the cluster takes from the parameter-server plugin for these is declared in
   :mod:`hogwild.cluster.services`; what is not built is refused before anything starts;
4. runs the epochs (:mod:`hogwild.cluster.epochs`, whose
   :class:`~hogwild.cluster.coordinator.Coordinator` hands each epoch's permutation out in
   portions on demand, with warm start and the epoch rule across replicas): at every epoch end
   the servers' model is pulled and evaluated on the test set, between epochs
   (``cluster.evaluate = "between"``) or beside the next one (``"beside"``:
   :func:`evaluates_between`), and the epoch's checkpoint (the format ``hogwild train``
   writes: ``hogwild eval`` and ``torch.nn`` load it) and metrics line are written
   (:mod:`hogwild.cluster.records`);
5. restarts a replica or a data server that dies while the job trains, up to
   ``cluster.restarts`` times each, and a parameter server too when servers keep copies
   (:mod:`hogwild.cluster.supervisor` decides; the driver carries it out: a line on stderr, a
   ``restart`` metrics record, the counts in the status table and the final summary): a data
   server comes back on its address, a replica pulls the servers' model as it starts and takes
   the work the coordinator hands it (what it lost, or what is left);
6. stops every role at the end, on Ctrl-C or SIGTERM, and when a role dies that is not restarted
   (a parameter server, whose state is lost with one copy, or a role past its restarts): an
   error naming the role, its host and its exit status or signal; the last checkpoint is kept.

Beyond loopback every role gets a CURVE key pair of its own (:mod:`hogwild.cluster.curve_keys`
decides which keys the job uses). It answers ``status`` control requests (the table
:mod:`hogwild.cluster.status` draws) on the address it writes to ``RUN_DIR/cluster.json``,
which ``hogwild cluster status`` reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from hogwild.cluster.curve_keys import with_job_keys
from hogwild.cluster.epochs import EpochLoop
from hogwild.cluster.fences import ReplicaFences
from hogwild.cluster.group_binding import bound_members, bound_replicas, shared_flags
from hogwild.cluster.identities import JobKeys
from hogwild.cluster.launcher import RoleFailedError, launcher_class
from hogwild.cluster.links import ReplicaLinks
from hogwild.cluster.prometheus import role_ports
from hogwild.cluster.records import EpochRecords
from hogwild.cluster.roles import on_port_of, plan_roles, with_incarnation, with_servers
from hogwild.cluster.servers import JobServers
from hogwild.cluster.services import worker_group
from hogwild.cluster.status import LiveStatus, server_row, status_act
from hogwild.cluster.supervisor import Fence, Restart, RestartPolicy, Supervisor
from hogwild.config import PS_DEFAULT_LR
from hogwild.config.checks import etcd_election_unread
from hogwild.config.topology import require_built, resolve_topology, split_groups
from hogwild.data.plan import plan_data
from hogwild.data.remote import all_silent
from hogwild.errors import ConfigError, HogwildError
from hogwild.logs import role_logger
from hogwild.model.network import build_network
from hogwild.net.auth import use_identity
from hogwild.net.control import ControlServer
from hogwild.net.metrics import serve_metrics
from hogwild.progress import Progress as ProgressLines
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.training.job import subset_indices
from hogwild.training.metrics import MetricsWriter
from hogwild.training.resume import check_directory, starting_point
from hogwild.training.tensorboard import TensorBoardLog

STOP_GRACE_S = 10.0  # replicas told to stop release their workers and arena by themselves


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
        require_built(topology)  # refused: what is not built
        if config.optim.smooth:  # the coordinator hands each portion its epoch's one rate
            raise ConfigError(
                "optim.smooth: a cluster job trains each epoch at its one rate (the driver hands "
                "every portion the epoch's rate); set optim.smooth = false, or train with "
                "`hogwild train`, where the rate moves within each epoch"
            )
        if config.model.partitions > 1:  # replicas of K partition processes
            from hogwild.cluster.partitioned import check_partitioned_job

            check_partitioned_job(config, topology, config.cluster.data_servers)
        if topology.coordinated:  # sandblaster, allreduce, hybrid: a coordinator per group
            worker_group(topology.framework).check_job(config, data, topology.framework)
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
        self.tensorboard: TensorBoardLog | None = None  # opened when the job runs
        self.metrics = MetricsWriter(
            self.config.output.metrics, resume, overwrite, listeners=(self._to_tensorboard,)
        )
        self.live = LiveStatus(self.config.output.progress)
        self.records: EpochRecords | None = None  # the epochs' test figures, lines, checkpoints
        self.run_dir: Path | None = None
        self.own_run_dir = False
        self.launcher = self.control = None
        self.servers = JobServers(self.job)  # the model given, pulled; the controller
        self.epochs: EpochLoop | None = None
        self.links: ReplicaLinks | None = None  # the replicas' control clients
        self.fences: ReplicaFences | None = None  # replicas' incarnations fenced on the servers
        self.specs: dict = {}  # the supervised roles' specs as started, by name
        self.job_keys: JobKeys | None = None  # a key pair per role (roles beyond loopback)
        self.policy = RestartPolicy(
            self.config.cluster.restarts, config.output.checkpoint_dir, config.data.wait_s
        )
        self.data_servers: list[str] = []  # the job's own data servers' addresses
        self.supervisor: Supervisor | None = None  # once the launcher exists
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
                        role_logger("cluster").error("while stopping: %s", exc)
                raise
            with deferred_signals():
                self._shutdown()
            return result

    def _to_tensorboard(self, record: dict) -> None:
        if self.tensorboard is not None:
            self.tensorboard.record(record)

    def _run(self) -> dict:
        config, cluster = self.config, self.config.cluster
        output = config.output
        self.tensorboard = TensorBoardLog(
            output.tensorboard, output.tensorboard_every, config.train.batch
        )
        self._make_run_dir()
        config, self.job_keys = with_job_keys(config, self.run_dir, self.progress.line)
        unread = etcd_election_unread(cluster)
        if unread is not None:  # accepted (roles get a given etcd's address), but said once
            role_logger("cluster").warning("%s", unread)
            # nor handed on: the servers size their etcd writes from hogwild's own timeout
            config = replace(config, cluster=replace(config.cluster, etcd_election_ms=0))
        self.config = config
        self.launcher = launcher_class(cluster.launcher)(config, str(self.run_dir))
        self.launcher.job_keys = self.job_keys
        if cluster.copies > 1:  # the job's own etcd members on the launcher's nodes, if it can
            etcd_members = getattr(self.launcher, "start_etcd_cluster", None)
            config = self.config = self.servers.with_controller(
                config, self.progress.line, etcd_members
            )
            self.launcher.config = config
        self.records = self._records(config)
        config_file = str(self.run_dir / f"{self.job}.json")
        Path(config_file).write_text(json.dumps(config.to_dict()))
        self.supervisor = Supervisor(
            self.policy, self.launcher, self.servers.forget_server, self._start_again, self._back,
            self._data_silent, self._fence, self._start_together,
        )  # fmt: skip
        self._fenced: dict[str, int] = {}  # a held replica fenced: the incarnation it starts as
        self.links = ReplicaLinks(
            self.job, config.ps, self.policy, self.supervisor, unresponsive=self._unresponsive
        )
        plan = plan_roles(config, config_file, self.source, cluster.host)
        servers = self.launcher.reserve(plan.ps, cluster.host)
        self.fences = ReplicaFences(
            self.job, servers, timeout_s=config.ps.timeout_s, retries=config.ps.retries,
            keys=config.ps.keys or None,
        )  # fmt: skip
        stores = [str(self.run_dir / f"ps-{i}") for i in range(len(servers))]
        for store in stores:  # a server's store recovers a crash within a job, never a new job:
            shutil.rmtree(store, ignore_errors=True)  # the model comes from init or --resume
        per_group = cluster.ps  # a server group's servers; the groups are listed one after another
        with_servers(plan, config_file, self.job, servers, stores, per_group)
        if len(servers) > per_group:  # several server groups: each its own etcd namespace
            self.servers.per_group = per_group
        self._give_metrics_ports(plan)
        if cluster.copies > 1:  # a dead server is replaced: it rejoins and catches up
            for spec in plan.ps:
                self._supervise(spec)
        data_servers = self.launcher.start_all([*plan.ps, *plan.data])[len(plan.ps) :]
        self.data_servers = data_servers  # a restart brings one back at its address
        for spec, address in zip(plan.data, data_servers, strict=True):
            self._supervise(on_port_of(spec, address))  # a restart comes back there
        groups = split_groups(servers, per_group)
        start_epoch = self._give_the_servers_the_model(groups)
        extra = shared_flags(data_servers, servers, groups)
        replicas = bound_replicas(plan.replicas, groups, extra)  # each to its server group
        for spec in replicas:
            self._supervise(spec)
        coordinators = self.launcher.start_all(replicas)
        self.links.connect(coordinators)
        members = bound_members(plan.members, coordinators, groups, extra)
        if members:  # a synchronous group's members (roles of their own, on any node)
            for spec in members:
                self._supervise(spec)
            self.launcher.start_all(members)
        self._serve_status()
        self.progress.line(
            f"hogwild cluster: {self.topology.describe()}; {cluster.replicas} replica(s) x "
            f"{self._replica_processes()}, {len(servers)} parameter server(s) "
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
                "partitions": config.model.partitions,
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
        self.epochs = EpochLoop(
            config, self.topology, replicas=len(self.links), n_train=self.n_train,
            start_epoch=start_epoch, connections=self.network.connections,
            records=self.records, servers=self.servers, call=self.links.call,
            recover=self._recover,
        )  # fmt: skip
        return self.epochs.run(self._job_fields, lambda: self.live.draw(self._rows()))

    def _replica_processes(self) -> str:
        partitions = self.config.model.partitions
        if partitions > 1:
            return f"{partitions} partitions ({self.config.train.in_flight} examples in flight)"
        return f"{self.config.cluster.workers_per_replica} worker(s)"

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

    def _seen(self) -> dict[int, dict]:
        """Each replica's last status, as the epochs saw it."""
        return self.epochs.seen if self.epochs is not None else {}

    def _summary(self) -> dict:
        """The driver's own gauges: the job's progress as the replicas last reported it."""
        seen = list(self._seen().values())
        return {
            "replicas": len(self.links) if self.links is not None else 0,
            "examples": sum(int(v["status"].get("examples") or 0) for v in seen),
            "examples_per_s": sum(float(v["row"].get("ex/s") or 0.0) for v in seen),
            "roles_gone": len(self.policy.gone),
            "restarts": sum(self.policy.restarts.values()),
        }

    def _give_the_servers_the_model(self, groups: list[list[str]]) -> int:
        """Initial or checkpointed weights, given once (to every server group: the groups
        begin as one model); the first epoch to train. A resumed job's epochs join the
        records."""
        self.servers.open_store(self.config, self.network, groups)
        if self.config.cluster.copies == 1:  # a wait on a dead server ends with the job's error
            self.servers.watch(lambda: self.supervisor.check() or True)  # not after its retries
        params, velocity, start_epoch, history = starting_point(
            self.config, self.network, self.n_classes, self.resume, self.progress.line
        )
        self.servers.give(params, velocity)
        self.records.history.extend(history)
        return start_epoch

    def _job_fields(self) -> dict:
        """The final record's fields of a cluster job (:meth:`EpochRecords.final`)."""
        cluster = self.config.cluster
        restarts = self.policy.restarts
        return {
            "framework": self.topology.framework,
            "optimizer": self.topology.optimizer,
            "replicas": cluster.replicas,
            "workers": cluster.replicas * cluster.workers_per_replica,
            "ps_servers": self.topology.servers,  # every server group's
            "server_groups": self.topology.server_groups,
            "data_servers": cluster.data_servers,
            "restarts": {name.replace(" ", "-"): n for name, n in sorted(restarts.items())},
        }

    # -- the roles -------------------------------------------------------------------------------

    def _supervise(self, spec) -> None:
        """``spec``'s role comes back when it dies (:mod:`hogwild.cluster.supervisor`)."""
        self.specs[spec.name] = spec
        self.supervisor.supervise(spec.name, spec.kind, spec.index)

    def _start_again(self, restart: Restart) -> str:
        """Start a dead role again (:meth:`_start_together` of it alone); its address."""
        (result,) = self._start_together([restart])
        if isinstance(result, RoleFailedError):
            raise result
        return result

    def _start_together(self, restarts: list[Restart]) -> list[str | RoleFailedError]:
        """Start dead roles of one tier again through the launcher, side by side; each one's
        address once it serves (within ``cluster.start_timeout_s``) or why it did not start.
        A replica is fenced and its work goes back to the coordinator before any starts."""
        self.live.clear()
        incarnations: dict[str, int] = {}
        for restart in restarts:
            role_logger("cluster").warning(
                "%s; restarting (%d of %d)", restart.exit.describe(), restart.count, restart.limit
            )
            if restart.kind == "replica":  # fenced before its portions go to others
                fenced = self._fenced.pop(restart.name, None) if restart.fenced else None
                incarnation = self._fence_replica(restart.name) if fenced is None else fenced
                incarnations[restart.name] = incarnation
        results = self.launcher.restart_all([self.specs[r.name] for r in restarts])
        for restart, result in zip(restarts, results, strict=True):
            if restart.name in incarnations and not isinstance(result, RoleFailedError):
                self.fences.started(self.specs[restart.name].index, incarnations[restart.name])
        return results

    def _fence(self, fence: Fence) -> None:
        """A replica held (its restart waits for a data server): fenced now, its portions given
        up; its restart later only starts it, as the incarnation fenced here."""
        role_logger("cluster").warning("%s: fenced while its restart waits", fence.name)
        self._fenced[fence.name] = self._fence_replica(fence.name)

    def _fence_replica(self, name: str) -> int:
        """Refuse replica ``name``'s old incarnations on the servers and give its portions
        back to the coordinator; the incarnation it is to start as."""
        spec = self.specs[name]
        incarnation = self.fences.replace(spec.index)
        self.specs[name] = with_incarnation(spec, incarnation)
        self.epochs.lost(spec.index)
        self.links.close(spec.index)
        return incarnation

    def _data_silent(self) -> bool:
        """Whether none of the job's own data servers answers now (False if it runs none)."""
        return all_silent(self.data_servers, keys=self.config.ps.keys or None)

    def _members_follow(self, group: int, address: str) -> None:
        """A synchronous group came back on ``address`` as a new incarnation (the old one
        fenced on the servers, its members' pushes with it): its members are killed and come
        back (as any member that died) told the new address and incarnation."""
        per_group = self.config.cluster.workers_per_replica
        argv = self.specs[f"replica {group}"].argv
        incarnation = int(argv[argv.index("--incarnation") + 1]) if "--incarnation" in argv else 0
        for name, spec in list(self.specs.items()):
            if spec.kind == "member" and spec.index // per_group == group:
                told = list(spec.argv)
                told[told.index("--coordinator") + 1] = address
                self.specs[name] = with_incarnation(replace(spec, argv=tuple(told)), incarnation)
                self.launcher.kill(name)

    def _recover(self) -> None:
        """Between the epoch loop's polls: restart the roles that died (or stop the job), and
        ask the servers that missed a fence again."""
        self.supervisor.recover()
        self.fences.retry(time.monotonic())

    def _unresponsive(self, replica: int) -> bool:
        """Replica ``replica`` did not answer a request through every retry, and the launcher
        saw no exit (paused, or cut off from the driver): whether it is now taken for dead and
        will be restarted. It is fenced on every server first (the process may live on where
        the launcher cannot reach it), then killed."""
        name = f"replica {replica}"
        if not self.policy.restartable(name):
            return False  # the job stops, naming it
        self.fences.replace(replica)
        role_logger("cluster").warning(
            "%s did not answer the driver for %.0f s; fenced on the servers, killing it",
            name, self.config.ps.timeout_s * (self.config.ps.retries + 1),
        )  # fmt: skip
        self.launcher.kill(name)
        deadline = time.monotonic() + self.config.cluster.stop_timeout_s
        while not self.policy.awaiting_restart(name) and time.monotonic() < deadline:
            time.sleep(0.05)
            self.supervisor.poll()
        return self.policy.awaiting_restart(name)

    def _back(self, restart: Restart, address: str) -> None:
        """A restarted role serves: a replica rejoins the epochs; a server must be where the
        replicas were told it is."""
        spec, exit_ = self.specs[restart.name], restart.exit
        if spec.kind == "replica":
            self.links.reconnect(spec.index, address)
            self.epochs.joined(spec.index)
            self._members_follow(spec.index, address)
        elif on_port_of(spec, address) != spec:
            raise RoleFailedError(
                f"{restart.name} came back on {address}, not where the replicas were told it is"
            )
        elif spec.kind == "ps":  # a restarted server holds no fences
            self.fences.tell(self.fences.servers[spec.index])
        self.metrics.write(
            {"event": "restart", "role": restart.name, "host": exit_.host,
             "returncode": exit_.returncode, "restart": restart.count, "address": address}
        )  # fmt: skip
        self._write_where()

    # -- status ----------------------------------------------------------------------------------

    def _rows(self) -> list[dict]:
        rows = [seen["row"] for _, seen in sorted(self._seen().items())]
        rows += [{"role": n, "state": "serving"} for n, s in self.specs.items() if s.kind == "data"]
        rows = [{**row, "restarts": self.policy.restarts.get(row["role"], 0)} for row in rows]
        try:
            rows += [server_row(s) for s in self.servers.status()]
        except HogwildError:
            pass
        self.rows = rows
        return rows

    def _serve_status(self) -> None:
        act = status_act(self.job, lambda: self.rows)
        self.control = ControlServer(
            f"{self.config.cluster.host}:0", self.job, act, keys=self.config.ps.keys or None
        )
        self.control.start()
        if self.job_keys is not None:
            self.job_keys.located("driver", str(self.control.address))
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

    # -- the end ---------------------------------------------------------------------------------

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

        if self.supervisor is not None:
            step(self.supervisor.poll)
        asked = self.links is not None and len(self.links) > 0
        if self.links is not None:
            step(self.links.stop_all)
        if self.launcher is not None:
            step(lambda: self.launcher.stop_all(grace_s=STOP_GRACE_S if asked else 0.0))
        step(self.servers.close_controller)  # after the servers: they give their leases back
        if self.control is not None:
            step(self.control.stop)
        if self.job_keys is not None:  # this process speaks as nobody in particular again
            step(lambda: use_identity(None))
        if self.endpoint is not None:
            step(self.endpoint.close)
            self.endpoint = None
        self.servers.close(step)
        if self.fences is not None:
            step(self.fences.close)
        if self.records is not None:
            step(self.records.close)
        if self.tensorboard is not None:
            step(self.tensorboard.close)
        if self.run_dir is not None:
            step(lambda: (self.run_dir / "cluster.json").unlink(missing_ok=True))
            if self.own_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        if failures:
            raise failures[0]
