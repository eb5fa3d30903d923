"""Server groups moved to their mean (distributed Hogwild's synchronisation), over real sockets.

Three server groups of one parameter server each (Adagrad rule, so that anything that went
through the rule would show), each holding a different model: one synchronisation leaves every
group at the mean, exactly (integer-valued parameters whose mean is exact in float32), through
the shards' operations, with the scratch vector cleared and the versions moved; updates pushed
to one group afterwards reach the others at the next synchronisation, divided among the groups;
groups serving models of different sizes, or a list that does not split into groups, are
refused naming what is wrong.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.groups import ServerGroups
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.config.topology import split_groups
from hogwild.errors import ConfigError

pytestmark = pytest.mark.ps_kernels

N = 5000
GEOMETRY = ModelGeometry(N)  # shard_kib=4: five shards


def start_groups(stack: ExitStack, models: list[np.ndarray], geometry=GEOMETRY) -> list:
    return [
        stack.enter_context(
            local_server(geometry, initial=model, shard_kib=4, rule="adagrad", lr=0.5)
        )
        for model in models
    ]


def values_of(server) -> np.ndarray:
    with PSClient([str(server.address)], server.options.job, client_id=99) as client:
        out = np.empty(client.layout.n_params, np.float32)
        client.pull(out)
        return out


def test_one_sync_leaves_every_group_at_the_mean_and_later_updates_spread():
    rng = np.random.default_rng(3)
    models = [(rng.integers(-50, 50, N) * 3).astype(np.float32) for _ in range(3)]
    mean = (models[0] + models[1] + models[2]) / 3  # exact: multiples of 3
    with ExitStack() as stack:
        servers = start_groups(stack, models)
        groups = ServerGroups([[str(s.address)] for s in servers], "test", "t")
        stack.callback(groups.close)
        result = groups.sync()
        assert result.spread == float(np.abs(np.stack(models) - mean).max())
        for server in servers:
            np.testing.assert_array_equal(values_of(server), mean)
            assert all(s["version"] >= 1 for s in server.status()["shards"])
        assert groups.sync().spread == 0.0  # already one model
        # a replica's plain push (through the Adagrad rule) to group 1 only ...
        with PSClient([str(servers[1].address)], "test", client_id=7) as pusher:
            pusher.push_deltas(np.full(N, 1.0, np.float32))
        after_push = values_of(servers[1])
        moved = after_push - mean
        assert np.abs(moved).min() > 0  # the rule moved every parameter
        np.testing.assert_array_equal(values_of(servers[0]), mean)
        groups.sync()  # ... reaches every group, a third of it each
        want = (mean * 2 + after_push) / 3
        for server in servers:
            np.testing.assert_allclose(values_of(server), want, rtol=0, atol=1e-5)
        assert groups.syncs == 3


def test_groups_of_different_models_and_lists_that_do_not_split_are_refused():
    with ExitStack() as stack:
        small = start_groups(stack, [np.zeros(N, np.float32)])
        large = start_groups(stack, [np.zeros(2 * N, np.float32)], ModelGeometry(2 * N))
        with pytest.raises(ConfigError, match="serve models of different sizes"):
            ServerGroups([[str(small[0].address)], [str(large[0].address)]], "test", "t")
        with pytest.raises(ConfigError, match="expected two or more"):
            ServerGroups([[str(small[0].address)]], "test", "t")
    with pytest.raises(ConfigError, match="3 server.* do not split into server groups of 2"):
        split_groups(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], 2)
    assert split_groups(["a:1", "a:2", "b:1", "b:2"], 2) == [["a:1", "a:2"], ["b:1", "b:2"]]


def test_overlapping_syncs_of_their_own_groups_meet_at_the_mean():
    """Two worker groups pull at the same moment, then each moves its own server group: they
    meet (were each to move both groups, the groups would swap)."""
    models = [np.full(N, 0.0, np.float32), np.full(N, 6.0, np.float32)]
    with ExitStack() as stack:
        servers = start_groups(stack, models)
        addresses = [[str(s.address)] for s in servers]
        first = ServerGroups(addresses, "test", "replica-0")
        stack.callback(first.close)
        second = ServerGroups(addresses, "test", "replica-1")
        stack.callback(second.close)
        assert first.pull() == second.pull() == 3.0
        first.move(own=0)
        second.move(own=1)
        for server in servers:
            np.testing.assert_array_equal(values_of(server), np.full(N, 3.0, np.float32))
        alone = first.sync(own=0)  # already one model: nothing moves
        assert alone.spread == 0.0
        with pytest.raises(ConfigError, match="server group 2: the job has 2 groups"):
            first.move(own=2)


def test_a_delta_left_by_a_synchroniser_that_died_is_not_applied():
    models = [np.full(N, 0.0, np.float32), np.full(N, 6.0, np.float32)]
    with ExitStack() as stack:
        servers = start_groups(stack, models)
        addresses = [[str(s.address)] for s in servers]
        with PSClient(addresses[0], "test", client_id=5) as c:  # died after its push
            c.push_deltas(np.ones(N, np.float32), into="sync-t")
        groups = ServerGroups(addresses, "test", "t")  # the same name, restarted
        stack.callback(groups.close)
        groups.sync()
        for server in servers:
            np.testing.assert_array_equal(values_of(server), np.full(N, 3.0, np.float32))
        rows = groups.status()  # numbered across the groups, each with its group
        assert [(r["server"], r["group"]) for r in rows] == [(0, 0), (1, 1)]
