"""Which host runs which partition of a replica, and which blocks must leave a host (no I/O).

``model.partition_hosts`` gives, per partition, the ``HOST:PORT`` of the host that runs it;
partitions with the same address form one *host group* and share one arena there (the
one-host exchange of :mod:`hogwild.partition.process`: counters, no copies). Group 0 is the
*leader*, the group of partition 0 (the feeder and the softmax's owner): it drives the epochs,
evaluates and writes checkpoints. The other groups are *followers*
(:mod:`hogwild.partition.follower`). A block crosses to another group only where a partition
there reads it:

- forward, a producer's slice of a boundary's input block goes to every group holding a
  contributor (a reader) of that boundary;
- backward, a contributor's partial error over slice ``q`` goes to the group of ``q``'s owner,
  all the owners of one group in one message (one count on that group's counter);
- the feeder's examples go to every follower, and the followers' "done" to the leader.

Which values cross per boundary is the plan's (:class:`~hogwild.partition.plan.PartitionPlan`);
this module only says between which hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hogwild.errors import ConfigError
from hogwild.net.address import AddressError, is_loopback, parse_address
from hogwild.partition.plan import FLOAT_BYTES, SOFTMAX_OWNER, PartitionPlan

LEADER = 0


@dataclass(frozen=True)
class HostGroups:
    """The partitions' host groups.

    Attributes:
        addresses: Per group, the ``HOST:PORT`` its receiver binds and the others send to
            (group 0 first: the leader's).
        group_of: Per partition, its group.
    """

    addresses: tuple[str, ...]
    group_of: tuple[int, ...]

    @classmethod
    def from_hosts(cls, hosts: tuple[str, ...] | list[str], k: int) -> HostGroups:
        """Groups from ``model.partition_hosts`` (one ``HOST:PORT`` per partition), numbered in
        order of first appearance, so partition 0's is group 0.

        Raises:
            ConfigError: Not one address per partition, or an address that is not HOST:PORT.
        """
        if len(hosts) != k:
            raise ConfigError(
                f"model.partition_hosts names {len(hosts)} host(s); model.partitions = {k} needs "
                "one HOST:PORT per partition"
            )
        addresses: list[str] = []
        group_of = []
        for p, host in enumerate(hosts):
            try:
                address = parse_address(host)
            except AddressError as exc:
                raise ConfigError(f"model.partition_hosts[{p}] = {host!r}: {exc}") from None
            if address.transport != "tcp" or not address.port:
                raise ConfigError(
                    f"model.partition_hosts[{p}] = {host!r}: expected HOST:PORT with a port"
                )
            if host not in addresses:
                addresses.append(host)
            group_of.append(addresses.index(host))
        return cls(tuple(addresses), tuple(group_of))

    @property
    def n_groups(self) -> int:
        return len(self.addresses)

    def members(self, group: int) -> tuple[int, ...]:
        """The partitions of ``group``, in order."""
        return tuple(p for p, g in enumerate(self.group_of) if g == group)

    def beyond_loopback(self) -> bool:
        """Whether any group's address can be reached from another machine."""
        return not all(is_loopback(parse_address(a)) for a in self.addresses)

    def forward_targets(self, plan: PartitionPlan, boundary: int, p: int) -> tuple[int, ...]:
        """The other groups that read partition ``p``'s slice of ``plan.boundaries[boundary]``'s
        input block (those holding one of its contributors)."""
        b = plan.boundaries[boundary]
        if p not in b.producers:
            return ()
        mine = self.group_of[p]
        return tuple(sorted({self.group_of[c] for c in b.contributors} - {mine}))

    def backward_targets(
        self, plan: PartitionPlan, boundary: int, p: int
    ) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Per other group, the slice owners there whose part of contributor ``p``'s partial
        error over ``plan.boundaries[boundary]``'s block it needs (owners in order)."""
        b = plan.boundaries[boundary]
        if p not in b.contributors:
            return ()
        mine = self.group_of[p]
        owners: dict[int, list[int]] = {}
        for q in b.producers:
            g = self.group_of[q]
            if g != mine:
                owners.setdefault(g, []).append(q)
        return tuple((g, tuple(qs)) for g, qs in sorted(owners.items()))

    def bytes_between_hosts(self, plan: PartitionPlan) -> int:
        """Bytes of activations and errors that cross between hosts for one example (a part of
        the plan's ``bytes_per_example``; the examples themselves, LOAD, come on top)."""
        total = 0
        for i, b in enumerate(plan.boundaries):
            size = [hi - lo for lo, hi in b.slices]
            for p in b.producers:
                total += FLOAT_BYTES * size[p] * len(self.forward_targets(plan, i, p))
            if b.backward_bytes:
                for p in b.contributors:
                    for _, owners in self.backward_targets(plan, i, p):
                        total += FLOAT_BYTES * sum(size[q] for q in owners)
        return total

    def describe(self, plan: PartitionPlan) -> str:
        """Which host runs which partitions, and what crosses between them per example."""
        lines = [f"Partitions over {self.n_groups} hosts (model.partition_hosts)"]
        for g, address in enumerate(self.addresses):
            role = "the leader, `hogwild train`" if g == LEADER else "`hogwild partition-host`"
            members = ", ".join(map(str, self.members(g)))
            lines.append(f"  {address}  partitions {members}  ({role})")
        lines.append(
            f"bytes crossing between hosts per example: {self.bytes_between_hosts(plan):,} of "
            f"{plan.bytes_per_example:,}, plus the example ({plan.network.input_size:,} bytes) "
            "to each other host"
        )
        return "\n".join(lines)


def host_groups(config, plan: PartitionPlan) -> HostGroups | None:
    """The job's host groups, or None when every partition runs on this host's arena (no
    ``model.partition_hosts``, or one address for all).

    Raises:
        ConfigError: As :meth:`HostGroups.from_hosts`; or the addresses reach beyond loopback
            and ``cluster.keys`` names no CURVE key directory.
    """
    hosts = config.model.partition_hosts
    if not hosts:
        return None
    groups = HostGroups.from_hosts(hosts, plan.k)
    if groups.n_groups == 1:
        return None
    if groups.beyond_loopback() and not config.cluster.keys:
        raise ConfigError(
            "model.partition_hosts: partitions on other hosts exchange activations and errors "
            "over the network, which needs CURVE keys: make a directory with `hogwild ps keys "
            "DIR`, copy it to every host and set cluster.keys = DIR (--cluster.keys=DIR)"
        )
    assert groups.group_of[SOFTMAX_OWNER] == LEADER
    return groups
