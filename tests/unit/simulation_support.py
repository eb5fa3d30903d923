"""What the simulator's tests share: the schedules' length and faults, and steps that script a
schedule (a client's push to the primary, a server run until it waits on an exchange)."""

from __future__ import annotations

from hogwild_plugins.ps.simulation import FAULTS, World
from hogwild_plugins.ps.simulation.messages import Exchange

STEPS = 60
CHECKED_FAULTS = FAULTS
# The pinned seeds (RARE_SEEDS and each regression's) were found before a copy's network thread
# could be drawn to read a message for a while ("split"): replayed without it, their schedules
# stay the ones that found what they pin.
PINNED_FAULTS = FAULTS - {"split"}


def send(world: World, client: int = 0) -> None:
    """Client ``client`` sends its next update, and the push reaches the primary."""
    world.apply(("send", client))
    world.apply(("deliver", len(world.network) - 1))


def primary_of(world: World, shard: int):
    record = world.etcd.record(world.bucket_of[shard])
    return world.servers[record.primary]


def run_until_waiting(world: World, server, kind: str) -> Exchange:
    """Run ``server``'s thread until it waits on an exchange of ``kind`` messages."""
    for _ in range(20):
        world.apply(("run", server.me))
        if server.waiting is not None and server.waiting.requests[0][1].kind == kind:
            return server.waiting
    raise AssertionError(f"server {server.me} never sent a {kind}")
