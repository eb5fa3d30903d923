"""A cluster job's epochs as the driver runs them: the coordinator's instructions carried out.

:class:`EpochLoop` holds the job's :class:`~hogwild.cluster.coordinator.Coordinator` (which
decides, without I/O, which replica trains which portion of which epoch and when an epoch ends)
and does what it answers: a ``train`` or ``close`` request to a replica, and at an epoch's end the
servers' model pulled, its record made (:class:`~hogwild.cluster.records.EndedEpoch`) and handed
to the records (which evaluate it, between epochs or beside the next one, and write the
checkpoint). Between instructions it polls each training replica's ``status`` (the coordinator
learns progress and finished portions from it), sooner when a replica is due to finish its
portion (:mod:`hogwild.cluster.polling`), and asks the idle ones now and then so that they know
the driver lives.

It owns no process or socket: the driver gives it the call to a replica (``call``, which answers
None for a replica that died and will be restarted), the recovery of dead roles (``recover``,
which may call :meth:`EpochLoop.lost` and :meth:`EpochLoop.joined` for a restarted replica), the
servers' side (:class:`~hogwild.cluster.servers.JobServers`) and the records.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

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
from hogwild.cluster.polling import PollSchedule, training_rate
from hogwild.cluster.records import EndedEpoch, EpochRecords, merge_histograms
from hogwild.cluster.status import replica_row
from hogwild.optim.schedule import learning_rate

__all__ = ["KEEP_ALIVE_S", "MIN_PORTION_PER_WORKER", "EpochLoop"]

KEEP_ALIVE_S = 5.0  # the longest a live replica goes without a request from the driver
# The smallest portion of an epoch per worker of a replica: the last portions of an epoch are
# this size, so replicas finish within about one of each other; each costs a push and a round
# trip to the driver, which cadence 512 (Downpour's) makes one exchange's worth of training.
MIN_PORTION_PER_WORKER = 256


class EpochLoop:
    """The epochs of one job (see the module docstring).

    Args:
        config: The job's resolved config.
        topology: Its :class:`~hogwild.config.topology.JobTopology`.
        replicas: How many replicas (worker groups) train.
        n_train: Training examples, as each replica chooses them.
        start_epoch: The first epoch to train (a resumed job's next).
        connections: The model's connections (for the records' connections/s).
        records: The epochs' records.
        servers: The parameter servers' side (pull, status, server groups).
        call: ``call(replica, op, **body)``: a control request; None when the replica died and
            will be restarted.
        recover: Restart the roles that died, or stop the job (raises).
    """

    def __init__(
        self,
        config,
        topology,
        *,
        replicas: int,
        n_train: int,
        start_epoch: int,
        connections: int,
        records: EpochRecords,
        servers,
        call: Callable[..., dict | None],
        recover: Callable[[], None],
    ) -> None:
        self.config, self.topology, self.replicas = config, topology, replicas
        self.connections, self.records, self.servers = connections, records, servers
        self.call, self.recover = call, recover
        self.coordinator = Coordinator(
            replicas=replicas,
            n_train=n_train,
            epochs=config.train.epochs,
            start_epoch=start_epoch,
            seed=config.train.seed,
            lr_of=lambda e: learning_rate(config.optim, e, config.train.epochs),
            warm_start=config.cluster.warm_start,
            fraction=config.cluster.epoch_fraction,
            # a coordinated group's share is its batch: one fixed shard each
            guided=config.cluster.split == "portions" and not topology.coordinated,
            min_portion=MIN_PORTION_PER_WORKER * config.cluster.workers_per_replica,
        )
        self.pending: deque = deque()  # the coordinator's instructions not yet carried out
        self.seen: dict[int, dict] = {}  # each replica's last status: {"status", "at", "row"}
        self.polls = PollSchedule()  # when to ask the replicas next
        self.last_keep_alive = 0.0
        self.train_started = 0.0
        self.warmed = False  # the records were told to load the evaluation's kernels

    # -- what the recovery tells it ----------------------------------------------------------------

    def lost(self, replica: int) -> None:
        """Replica ``replica`` died: what it held goes back to the coordinator."""
        self.pending.extend(self.coordinator.handle(Lost(replica)))
        self.seen.pop(replica, None)

    def joined(self, replica: int) -> None:
        """Replica ``replica`` (back) serves: it takes work again."""
        self.pending.extend(self.coordinator.handle(Joined(replica)))

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, final_fields: Callable[[], dict], draw: Callable[[], None]) -> dict:
        """Train every epoch; the records' final record (with ``final_fields()``). ``draw``
        redraws the live status table every ``cluster.status_s`` seconds."""
        config, coordinator = self.config, self.coordinator
        wall_start = epoch_start = self.train_started = time.perf_counter()
        for replica in range(self.replicas):
            self.joined(replica)
        drawn = 0.0
        limit_blas_threads(1)  # the evaluation's threads each call sgemm (see hogwild.blas)
        try:
            while True:
                while self.pending:
                    instruction = self.pending.popleft()
                    if isinstance(instruction, StartPortion):
                        self.call(
                            instruction.replica,
                            "train",
                            epoch=instruction.epoch,
                            lr=instruction.lr,
                            start=instruction.start,
                            stop=instruction.stop,
                            seed=instruction.seed,
                        )
                    elif isinstance(instruction, Close):
                        self.call(instruction.replica, "close", epoch=instruction.epoch)
                    elif isinstance(instruction, EpochEnd):
                        ended = self._pull_epoch(instruction, time.perf_counter() - epoch_start)
                        self.warmed = True  # the evaluation loads what it has not
                        # Evaluated on a thread: beside training, the next epoch starts at once
                        # and this loop goes on polling, so the replicas do not idle through
                        # the evaluation and the driver still sees a role die; between epochs,
                        # it returns once the evaluation is done (see cluster.evaluate).
                        self.records.ended(ended)
                        self.pending.extend(coordinator.advance())
                        epoch_start = time.perf_counter()
                        self.records.write()
                    elif isinstance(instruction, Finished):
                        return self.records.final(final_fields(), wall_start)
                time.sleep(self._poll_delay())
                self.records.write()
                self.recover()
                for replica in replicas_training(coordinator):
                    self.pending.extend(self._events(replica))
                self._warm_when_half_trained()
                self._keep_alive()
                if time.monotonic() - drawn >= config.cluster.status_s:
                    drawn = time.monotonic()
                    draw()
        except BaseException:
            self.records.stopped()  # keeps what was already evaluated
            raise

    def _warm_when_half_trained(self) -> None:
        """Have the records load the evaluation's kernels (:meth:`EpochRecords.warm`) once half
        of the first epoch this run trains is trained: early enough that its evaluation mostly
        finds them loaded, late enough that a job stopped early (a role that died, Ctrl-C) never
        loads them: numba's import and the kernels' load, more than a CPU-second of a driver that
        otherwise computes nothing with them. Once an epoch ended, its evaluation loads them."""
        coordinator = self.coordinator
        if self.warmed or coordinator.ended:  # an ended epoch's evaluation loads them itself
            return
        if 2 * sum(part.trained for part in coordinator.parts.values()) >= coordinator.n_train:
            self.warmed = True
            self.records.warm()

    def _keep_alive(self) -> None:
        """Ask the replicas that are not training now and then, so they know the driver lives."""
        now = time.monotonic()
        if now - self.last_keep_alive < KEEP_ALIVE_S:
            return
        self.last_keep_alive = now
        training = set(replicas_training(self.coordinator))
        for replica in range(self.replicas):
            if replica not in training:
                self.call(replica, "status")

    def _poll_delay(self) -> float:
        """Seconds to sleep before the next poll (:mod:`hogwild.cluster.polling`): shorter when
        a replica is due to finish its current portion (or the warm start), by its rate so far,
        so it is handed its next portion, or the epoch ends and the next one begins, within
        milliseconds of it."""
        coordinator, due = self.coordinator, {}
        for replica in replicas_training(coordinator):
            seen = self.seen.get(replica)
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

    def _events(self, replica: int) -> list:
        status = self.call(replica, "status")
        if status is None:
            return []
        now, previous = time.monotonic(), self.seen.get(replica)
        seconds = now - previous["at"] if previous else 0.0
        row = replica_row(status, previous["status"] if previous else None, seconds)
        self.seen[replica] = {"status": status, "at": now, "row": row}
        out = []
        for event in status_events(replica, status):
            out += self.coordinator.handle(event)
        return out

    def _pull_epoch(self, end: EpochEnd, seconds: float) -> EndedEpoch:
        """The servers' model at ``end`` (copied: the next epoch changes it) and the epoch's
        record without its test figures, made before the next epoch starts."""
        params, velocity, spread = self.servers.pull_model()
        servers = self.servers.status()
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
            "connections_per_s": rate * self.connections,
            "data_wait_s": end.data_wait_s,
            "fetch_wait_s": end.store_wait_s,
            "store_wait_s": end.store_wait_s,
            "per_replica_examples": {str(k): v for k, v in end.per_replica.items()},
            "updates_per_s": sum(s.get("updates_per_s", 0.0) for s in servers),
            "ps_updates": sum(int(s.get("updates", 0)) for s in servers),  # since they started
            "staleness": merge_histograms(s.get("staleness_histogram") for s in servers),
        }
        groups = {str(r): seen["status"]["sandblaster"] for r, seen in self.seen.items()
                  if "sandblaster" in seen["status"]}  # fmt: skip
        if groups:  # a Sandblaster group's counters: iterations, passes, portions, backups...
            record["sandblaster"] = groups
        if self.servers.groups is not None:  # the worker groups' synchronisations and the driver's
            replicas = sum(seen["status"].get("syncs", 0) for seen in self.seen.values())
            record["group_syncs"] = self.servers.groups.syncs + replicas
            record["group_spread"] = spread  # the largest |p_g - mean| before the epoch's sync
        return EndedEpoch(record, params.copy(), velocity.copy())
