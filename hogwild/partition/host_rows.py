"""A host's share of the servers' model: the rows its partitions read, taken at epoch boundaries.

Adam section 3.2: a partitioned replica's machines each hold and move only the slice of the
model they compute. A partition's forward and backward passes read only its own rows of every
weighted layer (:meth:`~hogwild.partition.plan.PartitionPlan.param_rows`: its output maps or
units, their biases; its inputs are the activations the others send, never their weights), and
its update rule writes only them. So when a host of a cluster replica takes the servers' model
(at its start, and in each FETCH round before a new epoch) it asks the home only for the shards
its partitions' rows lie in (:meth:`hogwild.store.exchange.Home.own`, the one a partition's own
cadence pulls use) and writes only those rows into its arena's ``params`` and ``base``: with K
partitions spread one to a host each host pulls its 1/K of the model and the rest of the shards
that share rows with it (on a model of many shards, about 1/K), not all of it; with all K on
one host (``pack``) it pulls every shard, as before. A host's partitions are fixed for the
job, so the other partitions' rows in its arena are never written after the leader's SETUP
(zeros) and nothing here reads them: the driver evaluates and checkpoints the servers' model.
What the takes pulled is counted in bytes of values (the shards' floats, four bytes each), not
bytes on the wire, and a pull the client retried counts once.

A take is a pull on behalf of the host's partitions: it rewrites their rows' ``base``, against
which their own homes' pushes are computed, so those pushes must be stamped with the versions the
take pulled, not with the older ones of their homes' last own pulls (the servers would count them
staler than they are: decayed more under ``ps.rule = "staleness"``, refused past
``ps.max_staleness``). :class:`~hogwild.partition.takes.Takes` hands them to the partitions here,
whose exchangers adopt them (:meth:`hogwild.store.exchange.Exchanger.adopt`) before any push of
the examples that follow. A take comes only while every partition here is idle and flushed, and
before the host hands out another example, so every push after a take carries its versions.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hogwild.partition import process as proc
from hogwild.partition.link import rows_of
from hogwild.partition.plan import PartitionPlan
from hogwild.partition.takes import Takes
from hogwild.store.exchange import Home


class HostRows:
    """The rows of one host's partitions, taken from a home that pulls only their shards.

    Args:
        home: The host's own home (not a partition's: its exchanger's thread owns that one);
            owned by this object from now on (:meth:`close`), also when this raises.
        plan: The replica's partition plan.
        partitions: The partitions on this host.
        takes: Where each take's versions go for the partitions here (None: nowhere).

    Attributes:
        rows: ``[start, stop)`` ranges of the flat parameter vector, partition by partition
            (each partition's ascending).
    """

    def __init__(
        self, home: Home, plan: PartitionPlan, partitions: Iterable[int], takes: Takes | None = None
    ) -> None:
        self.home, self.published = home, takes
        try:
            self.partitions = tuple(partitions)
            if not self.partitions:
                raise ValueError("a host's rows need at least one partition on the host")
            self.rows = rows_of(plan, self.partitions)
            self.model_bytes = 4 * int(plan.network.n_params)
            home.own(np.array(self.rows, dtype=np.int64).reshape(-1, 2))
        except BaseException:
            home.close()
            raise
        # (takes, bytes of values they pulled), replaced whole after each take: describe reads
        # it on the network thread while the main thread takes, and must see both of one take
        self._counts = (0, 0)

    @classmethod
    def open(
        cls, store: str, values: dict, arena, network, config, plan: PartitionPlan,
        partitions: Iterable[int],
    ) -> HostRows:  # fmt: skip
        """A host's own home of the parameter store ``store`` (reached as ``values``, the
        store's home spec), over the rows of ``partitions``: the leader's and a follower's."""
        from hogwild.store.protocol import WorkerSpec
        from hogwild.store.registry import store_class

        takes = Takes(arena, proc.TAKEN)  # before the home: a failure here leaks nothing
        spec = WorkerSpec(store, -1, values)
        home = store_class(store).open_home(spec, arena, network, config)
        return cls(home, plan, partitions, takes)

    def take(self, params: np.ndarray, base: np.ndarray) -> None:
        """``params`` and ``base`` := the home's values, over this host's rows (every partition
        here idle and flushed: nothing writes them meanwhile), and the versions they were
        pulled at published to the partitions here (:class:`~hogwild.partition.takes.Takes`)."""
        values = self.home.fetch()
        for lo, hi in self.rows:
            params[lo:hi] = values[lo:hi]
            base[lo:hi] = values[lo:hi]
        if self.published is not None:
            self.published.publish(self.home.versions())
        self._counts = (self._counts[0] + 1, int(self.home.fetched_bytes))

    @property
    def takes(self) -> int:
        """How many times :meth:`take` ran."""
        return self._counts[0]

    @property
    def pulled_bytes(self) -> int:
        """Bytes of values the takes pulled so far (the shards of this host's rows, each
        time; not bytes on the wire)."""
        return self._counts[1]

    def close(self) -> None:
        """Close the home (it is this object's from its start)."""
        self.home.close()

    def facts(self) -> dict:
        """What the takes moved, for a role's ``describe`` and its stop line (``takes`` and
        ``bytes`` of the same take, read from any thread)."""
        takes, pulled = self._counts
        return {
            "partitions": list(self.partitions),
            "takes": takes,
            "bytes": pulled,
            "model_bytes": self.model_bytes,
        }

    def said(self) -> str:
        """One line's worth: what this host pulled at its epoch boundaries."""
        takes, pulled = self._counts
        return (
            f"took the servers' model {takes} time(s), {pulled:,} bytes of values in all: "
            f"the shards of the rows of partitions {', '.join(map(str, self.partitions))} (the "
            f"whole model is {self.model_bytes:,} bytes)"
        )
