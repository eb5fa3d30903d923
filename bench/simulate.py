"""More seeded schedules of the replication simulator than the test suite runs.

``python bench/simulate.py --seeds N [--first S]`` runs seeds ``S .. S + N - 1`` of
:mod:`hogwild_plugins.ps.simulation` (the real replication state machines; servers, clients, etcd
and a network under every fault, checked after every step). It stops at the first violation,
prints it (the seed, the broken invariant, the whole schedule and every server's stories) on
stderr and exits 1; otherwise it prints one JSON line: the seeds, how many updates were
acknowledged and faults injected, how many servers stopped because the driver replaced them, how
many acknowledged updates died with every server holding them (killed or stopped; those of them
that died with a stop apart), and the seconds it took. Each schedule then heals and must
serve again (:mod:`hogwild_plugins.ps.simulation.liveness`: every bucket a serving primary, its
copies caught up, every client's update acknowledged, or an allowed outcome); ``--safety-only``
skips that. ``--jobs`` shares the seeds among processes; ``--steps`` sets each schedule's
length; ``--ttls 3,10,20`` gives each server its own lease TTL (ticks; servers may run with
different ``--lease-s``). A failing seed replays alone with ``--seeds 1 --first SEED`` (and the
same ``--ttls``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/simulate.py``): the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hogwild_plugins.ps.simulation import FAULTS, Config, Violation, run_seed
from hogwild_plugins.ps.simulation.liveness import heal_and_check

OPT_IN = frozenset({"unbuilt", "cut"})  # not in FAULTS: a parcel not taken, a host cut off
# counted over the schedule and its heal: servers stopped because the driver replaced them, the
# acknowledged updates that died with every server holding them (forgiven: killed or stopped), and
# those of them that died with a stop (the system's own, review V finding 1)
WHOLE_RUN = ("replaced_stops", "died_with_every_copy", "died_with_a_stop")


def run_seeds(
    first: int, count: int, steps: int, faults: frozenset, live: bool = True,
    config: Config | None = None,
) -> dict:  # fmt: skip
    """Seeds ``first`` .. ``first + count - 1`` of ``config`` (default: the simulator's; each
    healed and checked for liveness after, with ``live``): the totals, or the first
    violation."""
    totals = {"seeds": 0, "acknowledged": 0, "faults": 0}
    totals |= dict.fromkeys(WHOLE_RUN, 0)
    for seed in range(first, first + count):
        try:
            world = run_seed(seed, steps, config or Config(), faults=faults)
            counts = dict(world.counts)  # the schedule's (the heal's re-sends not counted)
            if live:
                heal_and_check(world)
        except Violation as exc:
            return {**totals, "violation": str(exc), "seed": seed}
        totals["seeds"] += 1
        totals["acknowledged"] += counts["acknowledged"]
        totals["faults"] += counts["faults"]
        for name in WHOLE_RUN:  # the heal's too: a server may stop at its first read there
            totals[name] += world.counts[name]
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/simulate.py", description=__doc__)
    add = parser.add_argument
    add("--seeds", type=int, required=True, help="how many schedules")
    add("--first", type=int, default=0, help="the first seed (default 0)")
    add("--steps", type=int, default=60, help="steps per schedule (default 60, as the tests)")
    add("--jobs", type=int, default=1, help="processes sharing the seeds (default 1)")
    add("--safety-only", action="store_true", help="no heal and liveness check after each")
    add("--without", default="", help=f"faults left out, comma-separated (of {sorted(FAULTS)})")
    add("--with", dest="extra", default="", help=f"opt-in faults added (of {sorted(OPT_IN)})")
    add(
        "--ttls", default="", help="each server's lease TTL in ticks, comma-separated (default: 10)"
    )
    args = parser.parse_args(argv)
    try:
        ttls = tuple(int(t) for t in args.ttls.split(",") if t)
        config = Config(ttls=ttls)
    except ValueError as exc:
        parser.error(f"--ttls {args.ttls!r}: {exc}")
    without = {f for f in args.without.split(",") if f}
    extra = {f for f in args.extra.split(",") if f}
    if args.seeds < 1 or args.steps < 1 or args.jobs < 1 or not without <= FAULTS:
        parser.error("--seeds, --steps and --jobs must be >= 1; --without names faults")
    if not extra <= OPT_IN:
        parser.error(f"--with names opt-in faults (of {sorted(OPT_IN)})")
    faults = (FAULTS - without) | extra
    started = time.perf_counter()
    size = -(-args.seeds // args.jobs)
    chunks = [
        (start, min(size, args.first + args.seeds - start))
        for start in range(args.first, args.first + args.seeds, size)
    ]
    live = not args.safety_only
    if args.jobs == 1:
        results = [
            run_seeds(start, count, args.steps, faults, live, config) for start, count in chunks
        ]
    else:
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            futures = [
                pool.submit(run_seeds, s, c, args.steps, faults, live, config) for s, c in chunks
            ]
            results = [f.result() for f in futures]
    failed = [r for r in results if "violation" in r]
    if failed:
        first = min(failed, key=lambda r: r["seed"])
        print(first["violation"], file=sys.stderr)
        print(f"seed {first['seed']} broke an invariant", file=sys.stderr)
        return 1
    record = {
        "benchmark": "simulate",
        "first": args.first,
        "seeds": sum(r["seeds"] for r in results),
        "steps": args.steps,
        "faults_kinds": sorted(faults),
        "ttls": list(config.ttls) or [config.ttl] * config.servers,
        "liveness": not args.safety_only,
        "acknowledged": sum(r["acknowledged"] for r in results),
        "faults": sum(r["faults"] for r in results),
        # servers that found their lease revoked by the driver and stopped (exit 2), and the
        # acknowledged updates forgiven: gone with every holder, and of those with a stop
        **{name: sum(r[name] for r in results) for name in WHOLE_RUN},
        "seconds": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
