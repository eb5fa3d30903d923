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
one host (``pack``) it pulls every shard, as before. The other partitions' rows in this
arena stay as they were (the leader's SETUP values, or an older epoch's) and nothing here reads
them: the driver evaluates and checkpoints the servers' model.
"""

from __future__ import annotations

import numpy as np

from hogwild.partition.link import rows_of
from hogwild.partition.plan import PartitionPlan
from hogwild.store.exchange import Home


class HostRows:
    """The rows of one host's partitions, taken from a home that pulls only their shards.

    Args:
        home: The host's own home (not a partition's: its exchanger's thread owns that one);
            owned by this object from now on (:meth:`close`), also when this raises.
        plan: The replica's partition plan.
        partitions: The partitions on this host.

    Attributes:
        rows: ``[start, stop)`` ranges of the flat parameter vector, in order.
        takes: How many times :meth:`take` ran.
    """

    def __init__(self, home: Home, plan: PartitionPlan, partitions) -> None:
        self.home = home
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
        self.takes = 0

    def take(self, params: np.ndarray, base: np.ndarray) -> None:
        """``params`` and ``base`` := the home's values, over this host's rows (every partition
        here idle and flushed: nothing writes them meanwhile)."""
        values = self.home.fetch()
        for lo, hi in self.rows:
            params[lo:hi] = values[lo:hi]
            base[lo:hi] = values[lo:hi]
        self.takes += 1

    @property
    def pulled_bytes(self) -> int:
        """Bytes the takes pulled so far (the shards of this host's rows, each time)."""
        return int(self.home.fetched_bytes)

    def close(self) -> None:
        """Close the home (it is this object's from its start)."""
        self.home.close()

    def facts(self) -> dict:
        """What the takes moved, for a role's ``describe`` and its stop line."""
        return {
            "partitions": list(self.partitions),
            "takes": self.takes,
            "bytes": self.pulled_bytes,
            "model_bytes": self.model_bytes,
        }

    def said(self) -> str:
        """One line's worth: what this host pulled at its epoch boundaries."""
        return (
            f"took the servers' model {self.takes} time(s), {self.pulled_bytes:,} bytes in all: "
            f"the shards of the rows of partitions {', '.join(map(str, self.partitions))} (the "
            f"whole model is {self.model_bytes:,} bytes)"
        )
