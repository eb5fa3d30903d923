"""Which event comes next in a simulated world: the seeded draw among what can happen now.

Each step of a :class:`~hogwild_plugins.ps.simulation.world.World` is one weighted choice among
the events that can happen now (:meth:`EventDraw.offers`): a server's replication thread runs to
its next blocking point; a message in flight is delivered (in order per link, or out of it with
``reorder``), dropped or duplicated; a copy that does not answer is given up on (the peer
timeout); a client sends or re-sends a push, pulls, or sends a held pull again; the clock
ticks; and, among :data:`FAULTS` the world was given, a server is paused or resumed, killed or
restarted, its lease ended early, etcd wiped, and (opt-in) a host cut off or healed. The draw is
``random.Random.choices``'s own, written out (:meth:`EventDraw.next`): a seed's schedule is the
one ``choices`` would make, and every seed's schedule depends on the order and weights here, so
an opt-in fault offers its events last (the other seeds draw as they did without it).

What an event does is the world's (:meth:`~hogwild_plugins.ps.simulation.world.World.apply`);
the draws a step makes inside it (an application that fails, a message read slowly, a parcel
not taken, a revoke's delay) come from generators of their own, so that they leave this draw's
sequence as it was.
"""

from __future__ import annotations

import bisect
import itertools
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hogwild_plugins.ps.simulation.world import World

__all__ = ["FAULTS", "EventDraw"]

FAULTS = frozenset(
    {"drop", "duplicate", "reorder", "pause", "kill", "expire", "wipe", "fail", "split"}
)
CUT_WEIGHT, HEAL_WEIGHT = 0.03, 0.3  # the opt-in fault "cut": a host off the network, and back
_TICK, _WIPE = ("tick",), ("wipe",)


class EventDraw:
    """The events a world of ``servers`` servers and ``clients`` clients may draw (their
    tuples made once and reused: a step builds no tuple per choice)."""

    def __init__(self, servers: int, clients: int) -> None:
        self.runs = [("run", i) for i in range(servers)]
        self.clients = [(("send", c), ("pull", c)) for c in range(clients)]
        self.messages: list[tuple] = []  # the n-th message's deliver, drop, duplicate

    def next(self, world: World, rng: random.Random) -> tuple:
        """One seeded choice among what can happen in ``world`` now (one ``rng.random()``).

        The draw is ``random.Random.choices``'s own (the weights summed in the same order, one
        ``random()``, the same bisection), written out so that a step builds no pair per
        choice: a seed's schedule is the one ``choices`` would make."""
        weights, events = self.offers(world)
        cumulative = list(itertools.accumulate(weights))
        drawn = rng.random() * (cumulative[-1] + 0.0)
        return events[bisect.bisect(cumulative, drawn, 0, len(cumulative) - 1)]

    def offers(self, world: World) -> tuple[list[float], list[tuple]]:
        """What can happen in ``world`` now, and the weight of each: two lists in step (event
        tuples are reused from step to step)."""
        faults = world.faults
        weights: list[float] = []
        events: list[tuple] = []
        weigh, offer = weights.append, events.append
        for s in world.live():
            if not s.paused and s.runnable():
                weigh(6.0)
                offer(self.runs[s.me])
            exchanges = s.exchanges()
            if not exchanges:  # mostly none out: no set to build and sort
                continue
            for peer in sorted({p for e in exchanges for p in e.waiting_on()}):
                weigh(0.4)
                offer(("timeout", s.me, peer))
        reorder, drop, duplicate = "reorder" in faults, "drop" in faults, "duplicate" in faults
        links = set()
        if drop and duplicate:  # every message offers (deliver,) drop, duplicate: in chunks
            by_message = self.messages
            for n in range(len(by_message), len(world.network)):
                by_message.append((("deliver", n), ("drop", n), ("duplicate", n)))
            again = (0.1, 0.15, 0.1) if reorder else (0.15, 0.1)
            for n, (dst, message) in enumerate(world.network):
                link = (message[0], dst)  # a link delivers in order unless messages reorder
                if link not in links:
                    links.add(link)
                    weights += (4.0, 0.15, 0.1)
                    events += by_message[n]
                else:
                    weights += again
                    events += by_message[n] if reorder else by_message[n][1:]
        else:
            for n, (dst, message) in enumerate(world.network):
                link = (message[0], dst)
                if link not in links:
                    links.add(link)
                    weigh(4.0)
                    offer(("deliver", n))
                elif reorder:
                    weigh(0.1)
                    offer(("deliver", n))
                if drop:
                    weigh(0.15)
                    offer(("drop", n))
                if duplicate:
                    weigh(0.1)
                    offer(("duplicate", n))
        for client, (send, pull) in zip(world.clients, self.clients, strict=True):
            weigh(3.0 if client.outstanding is None else 0.3)
            offer(send)
            weigh(0.5)
            offer(pull)
        weigh(1.0)
        offer(_TICK)
        pause, kill, expire = "pause" in faults, "kill" in faults, "expire" in faults
        for i, s in world.servers.items():
            if s is None:
                if kill:
                    weigh(0.3)
                    offer(("restart", i))
                continue
            if pause:
                weigh(0.4 if s.paused else 0.06)
                offer(("resume" if s.paused else "pause", i))
            if kill:
                weigh(0.02)
                offer(("kill", i))
            if expire:
                weigh(0.02)
                offer(("expire", i))
        if "wipe" in faults:
            weigh(0.01)
            offer(_WIPE)
        if "cut" in faults:  # opt-in, last: the other faults' seeds draw as they did without it
            for i, s in world.servers.items():
                if s is not None:
                    weigh(HEAL_WEIGHT if i in world.cut else CUT_WEIGHT)
                    offer(("heal" if i in world.cut else "cut", i))
        for c, client in enumerate(world.clients):  # last too: only a held pull draws it
            if client.held is not None:
                weigh(1.0)
                offer(("resend held", c))
        return weights, events
