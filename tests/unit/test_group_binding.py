"""Which server group each role of a cluster job trains against (hogwild/cluster/group_binding.py,
pure): replicas shared among the groups in order, a synchronous group's members following their
worker group, each told its group's servers, its group's number only when there are several, and
the flags every replica and member shares.
"""

from __future__ import annotations

from hogwild.cluster.group_binding import bound_members, bound_replicas, group_of, shared_flags
from hogwild.cluster.roles import RoleSpec

SERVERS = ["h:1", "h:2", "h:3", "h:4"]
TWO_GROUPS = [["h:1", "h:2"], ["h:3", "h:4"]]


def replicas(n: int) -> list[RoleSpec]:
    return [RoleSpec("replica", i, ("cluster", "replica", str(i))) for i in range(n)]


def test_the_groups_share_the_replicas_in_order_as_evenly_as_they_divide():
    assert [group_of(i, 4, 2) for i in range(4)] == [0, 0, 1, 1]
    assert [group_of(i, 3, 2) for i in range(3)] == [0, 0, 1]
    assert [group_of(i, 2, 1) for i in range(2)] == [0, 0]


def test_one_group_tells_its_servers_and_no_group_number():
    extra = shared_flags(["d:1"], SERVERS, [SERVERS])
    assert extra == ["--data.servers=d:1"]  # one group: no other group to synchronise with
    bound = bound_replicas(replicas(2), [SERVERS], extra)
    assert [b.argv[3:] for b in bound] == [(f"--ps.servers={','.join(SERVERS)}", *extra)] * 2
    assert [b.index for b in bound] == [0, 1] and bound[0].kind == "replica"


def test_several_groups_tell_each_replica_its_groups_servers_and_number():
    extra = shared_flags([], SERVERS, TWO_GROUPS)
    assert extra == [f"--cluster.group_servers={','.join(SERVERS)}"]
    bound = bound_replicas(replicas(4), TWO_GROUPS, extra)
    assert [b.argv[3:] for b in bound] == [
        ("--ps.servers=h:1,h:2", *extra, "--ps.server_group=0"),
        ("--ps.servers=h:1,h:2", *extra, "--ps.server_group=0"),
        ("--ps.servers=h:3,h:4", *extra, "--ps.server_group=1"),
        ("--ps.servers=h:3,h:4", *extra, "--ps.server_group=1"),
    ]


def test_members_follow_their_worker_groups_coordinator_and_server_group():
    members = [RoleSpec("member", i, ("cluster", "member")) for i in range(6)]  # 3 per group
    bound = bound_members(members, ["c:0", "c:1"], TWO_GROUPS, ["--data.servers=d:1"])
    assert [b.argv[2:4] for b in bound] == [("--coordinator", "c:0")] * 3 + [
        ("--coordinator", "c:1")
    ] * 3
    assert [b.argv[-1] for b in bound] == ["--ps.server_group=0"] * 3 + ["--ps.server_group=1"] * 3
    assert all("--data.servers=d:1" in b.argv for b in bound)
    assert bound_members([], ["c:0"], TWO_GROUPS, []) == []
