"""Which event a simulated world draws next (plugins/ps/simulation/draw.py): the chunked offers
and the written-out draw are the plain construction's and ``random.Random.choices``'s, so that
every seed's schedule is the one they would make.
"""

from __future__ import annotations

import random

import pytest
from hogwild_plugins.ps.simulation import FAULTS, World, run_seed

from tests.unit.simulation_support import STEPS


def plain_offers(world: World) -> tuple[list[float], list[tuple]]:
    """What can happen in ``world`` now, and each weight, built the plain way, one pair per
    choice in the order ``EventDraw.offers`` promises: the oracle of its chunked construction."""
    choices: list[tuple[float, tuple]] = []
    for s in world.live():
        if not s.paused and s.runnable():
            choices.append((6.0, ("run", s.me)))
        peers = sorted({p for e in s.exchanges() for p in e.waiting_on()})  # both threads'
        choices += [(0.4, ("timeout", s.me, peer)) for peer in peers]
    links = set()
    for n, (dst, message) in enumerate(world.network):
        if (message[0], dst) not in links:
            links.add((message[0], dst))
            choices.append((4.0, ("deliver", n)))
        elif "reorder" in world.faults:
            choices.append((0.1, ("deliver", n)))
        if "drop" in world.faults:
            choices.append((0.15, ("drop", n)))
        if "duplicate" in world.faults:
            choices.append((0.1, ("duplicate", n)))
    for c, client in enumerate(world.clients):
        choices.append((3.0 if client.outstanding is None else 0.3, ("send", c)))
        choices.append((0.5, ("pull", c)))
    choices.append((1.0, ("tick",)))
    for i, s in world.servers.items():
        if s is None:
            if "kill" in world.faults:
                choices.append((0.3, ("restart", i)))
            continue
        if "pause" in world.faults:
            choices.append((0.4 if s.paused else 0.06, ("resume" if s.paused else "pause", i)))
        if "kill" in world.faults:
            choices.append((0.02, ("kill", i)))
        if "expire" in world.faults:
            choices.append((0.02, ("expire", i)))
    if "wipe" in world.faults:
        choices.append((0.01, ("wipe",)))
    return [w for w, _ in choices], [e for _, e in choices]


@pytest.mark.parametrize(
    "faults", [FAULTS, frozenset({"reorder", "pause", "kill"}), frozenset({"drop", "wipe"})]
)
def test_a_step_draws_the_event_random_choices_would(faults):
    """The draw builds its offers in chunks and writes ``random.Random.choices``'s draw out (it
    is the seeded run's hot path): through whole schedules, cold and established, under every
    fault and under subsets, each step offers what the plain construction offers and applies
    the event ``choices`` picks from the same generator state, with one draw as it makes."""
    for seed in range(0, 24, 3):
        world = run_seed(seed, 0, faults=faults)
        applied: list[tuple] = []  # (event, the generator's state as it is applied)
        apply = world.apply

        def recorded(event, applied=applied, world=world, apply=apply):
            applied.append((event, world.rng.getstate()))
            return apply(event)

        world.apply = recorded
        for _ in range(STEPS):
            weights, events = world.draw.offers(world)
            assert (weights, events) == plain_offers(world), (seed, len(applied))
            twin = random.Random()
            twin.setstate(world.rng.getstate())
            [expected] = twin.choices(events, weights)
            world.step()
            event, state = applied[-1]
            assert event == expected, (seed, len(applied))
            assert state == twin.getstate(), (seed, len(applied))  # (a send draws its shard after)
        assert len(applied) == STEPS
