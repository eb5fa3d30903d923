"""A deterministic simulator of the replicated parameter server (no sockets, threads or clocks).

:mod:`.etcd` is etcd in memory, :mod:`.server` one server's real replication state machines
carried out as its threads do (:mod:`.messages` what it sends and takes, :mod:`.store` what
outlives its process), :mod:`.world` the servers, clients, network and faults of one seeded
schedule (:mod:`.draw` which event comes next), :mod:`.invariants` what the job must never do,
checked after every step, and :mod:`.liveness` what it must do once the faults end (the world
healed, every bucket serving again). ``bench/simulate.py`` runs many seeds.
"""

from hogwild_plugins.ps.simulation.draw import FAULTS
from hogwild_plugins.ps.simulation.world import Config, Violation, World, run_seed

__all__ = ["FAULTS", "Config", "Violation", "World", "run_seed"]
