"""The ledger phase of ``bench/figures/chaos_cluster.py``: SIGKILL primaries under a client that
keeps the sum of everything acknowledged, and compare the servers' parameters with it at the end.

A training job cannot tell a lost update from a late one (its own updates change the parameters
it would be checked against), so the promise "an acknowledged update survives the death of any
copy while one lives" is checked here, as tests/cluster/test_ps_failover.py does, in a phase of
its own: three ``hogwild ps serve --copies 3 --etcd ...`` processes (the bundled job's model and
layout, ``ps.lease_s`` as given), one etcd on loopback, and one client pushing integer-valued
deltas (``[-3, 3]`` per parameter; float32 sums of such integers stay exact) in a loop (back to
back, or one at most every ``push_every_s``: a smoke run's pace), adding
each to a float64 ledger once ``push_deltas`` returned, i.e. once every in-sync copy committed it.

Every ``kill_every_s`` (times 0.5 to 1.5, seeded) the primary of a random bucket holding shards
is SIGKILLed, once every such bucket has a live primary and another live in-sync copy (the
promise needs one survivor); its etcd lease is ended at once and it is started again on its port,
as ``hogwild cluster``'s driver does (``_forget_server``, then a restart). At the end the pushes
stop, every copy catches up, and the client pulls: ``lost`` counts the parameters whose value is
not the ledger's.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import numpy as np
import psutil
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd_process import EtcdProcess
from hogwild_plugins.ps.serving.launch import ServeProcess

from bench.support.leaks import LeakCheck
from bench.support.ps_watch import ServerWatch, spread
from hogwild.config import load_config
from hogwild.errors import HogwildError
from hogwild.model.network import model_network
from hogwild.net.ports import free_port

JOB = "adam_mnist"  # the bundled config's job
SYNC_TIMEOUT_S = 60.0
STALL_S = 60.0  # no acknowledged push for this long: the phase stops and says so


def ledger_phase(
    kills: int,
    kill_every_s: float,
    seed: int,
    lease_s: int = 2,
    log=print,
    push_every_s: float = 0.0,
) -> dict:
    """Run the phase (see the module docstring); its figures. ``push_every_s``: the client
    starts a push at most this often (0: back to back, the full run's; a smoke run paces it, so
    that its three servers and the client do not spend the phase replicating full models)."""
    rng = random.Random(seed)
    n_params = model_network(load_config().model).n_params
    started = time.monotonic()
    check, processes = LeakCheck(), []
    servers: dict[int, ServeProcess] = {}
    events: list[dict] = []
    problems: list[str] = []
    etcd_server = EtcdProcess()
    address = etcd_server.start()
    processes.append(psutil.Process(etcd_server.process.pid))
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    client = watch = None

    def launch(i: int) -> None:
        args = ["--threads", "1", "--copies", "3", "--lease-s", str(lease_s)]
        args += ["--servers", ",".join(addresses), "--index", str(i), "--etcd", address]
        servers[i] = ServeProcess(args)
        servers[i].launch()
        processes.append(psutil.Process(servers[i].process.pid))

    def start(i: int) -> None:
        launch(i)
        servers[i].wait_ready()

    try:
        for i in range(3):  # side by side: each start is mostly the server's imports
            launch(i)
        for i in range(3):
            servers[i].wait_ready()
        client = PSClient(addresses, JOB, client_id=1, etcd=address)
        watch = ServerWatch(addresses, address, JOB, alive=lambda i: _running(servers[i])).start()
        client.assign(np.zeros(n_params, np.float32))
        if watch.wait_copies(3, SYNC_TIMEOUT_S)[1] is None:
            raise RuntimeError("ledger phase: the three copies never came in sync")
        ledger = np.zeros(n_params, np.float64)
        pusher = Pusher(client, ledger, n_params, seed, every_s=push_every_s)
        try:
            for _ in range(kills):
                if not _pause(kill_every_s * rng.uniform(0.5, 1.5), pusher, problems):
                    break
                waited, seen = watch.wait_copies(2, SYNC_TIMEOUT_S)
                if seen is None:
                    problems.append(f"no bucket map with 2 live in-sync copies in {waited:.0f} s")
                    break
                victim = seen[rng.choice(sorted(seen))]["primary"]
                held = {b: v["epoch"] for b, v in seen.items() if v["primary"] == victim}
                watch.poll()  # what the victim won so far
                killed_at = time.time()
                servers[victim].kill()
                _forget(watch, victim)
                events.append({"server": victim, "at": killed_at, "buckets": held,
                               "waited_for_copies_s": round(waited, 3),
                               "pushes": pusher.count})  # fmt: skip
                log(f"ledger: killed ps {victim}, primary of {sorted(held)}; {pusher.count} pushes")
                start(victim)
            _pause(kill_every_s, pusher, problems)
        finally:
            pusher.stop()
        problems += pusher.errors
        if watch.wait_copies(3, SYNC_TIMEOUT_S)[1] is None:
            problems.append("the copies did not all catch up after the last kill")
        final = np.empty(n_params, np.float32)
        client.pull(final)
        watch.poll()
        expected = ledger.astype(np.float32)
        lost = int(np.count_nonzero(final != expected))
        for e in events:
            e["failovers"] = [watch.failover(e["at"], b, ep) for b, ep in e["buckets"].items()]
        failovers = [f for e in events for f in e["failovers"]]
    finally:
        if client is not None:
            client.close()
        if watch is not None:
            watch.stop()
        for server in servers.values():
            server.kill()
        etcd_server.stop()
    ports = {int(a.rsplit(":", 1)[1]) for a in [*addresses, address]}
    return {
        "phase": (
            "separate from the training runs: three `hogwild ps serve --copies 3 --etcd` "
            "processes and one client pushing integer deltas, because a ledger client cannot push "
            "into a training job's parameters without changing them (nor can a job's own "
            "updates be told lost from late)"
        ),
        "pushes": pusher.count,
        "kills": len(events),
        "lost": lost,
        "max_abs_error": float(np.max(np.abs(final.astype(np.float64) - ledger))),
        "n_params": n_params,
        "failover_s": spread([f["failover_s"] for f in failovers]),
        "takeover_s": spread([f["takeover_s"] for f in failovers]),
        "waited_for_copies_s": spread([e["waited_for_copies_s"] for e in events]),
        "problems": problems,
        "lease_s": lease_s,
        "push_every_s": push_every_s,
        "wall_s": round(time.monotonic() - started, 1),
        "leaked": check.count(processes, ports),
        "events": events,
    }


def _running(server: ServeProcess) -> bool:
    return server.process is not None and server.process.poll() is None


def _forget(watch: ServerWatch, index: int) -> None:
    """End a killed server's etcd lease now, as ``hogwild cluster``'s driver does for a server
    it saw exit: SIGKILLed, it answers nothing, so no ``revoked/<i>`` marker (no takeover waits
    for reads)."""
    try:
        value, _ = watch.etcd.get(f"members/{index}")
        if value is not None and isinstance(value.get("lease"), int):
            watch.etcd.revoke(value["lease"])
    except HogwildError:
        pass  # it lapses by itself


def _pause(seconds: float, pusher: Pusher, problems: list[str]) -> bool:
    """Sleep, watching the pusher: False if it failed or stalled."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pusher.errors:
            return False
        if time.monotonic() - pusher.last_ack > STALL_S:
            problems.append(f"no push acknowledged for {STALL_S:.0f} s (after {pusher.count})")
            return False
        time.sleep(0.05)
    return True


ERROR_LOG_EVERY_S = 5.0  # a pusher logs a failed push at most this often


class Pusher:
    """A thread pushing integer deltas and adding each acknowledged one to the ledger.

    Args:
        client, ledger, n_params, seed: Where to push, the float64 sum of what was
            acknowledged, the parameters' count, the deltas' seed.
        low: The deltas' smallest value (they go to 3): 0 makes every delta non-negative, so
            a parameter below the ledger lost an acknowledged update and one above it was
            given an update more than once (or one whose push raised: see ``uncertain``).
        keep_going: Go on after a push raised (its fate is unknown: its delta is added to
            ``uncertain``, not to the ledger) instead of stopping at the first error.
        acks: A list to append ``(sent, acknowledged)`` to for each acknowledged push, both
            ``time.time()`` (None: not kept).
        every_s: Start a push at most this often (0: each as soon as the last returned); a
            smoke run's pace, so that its servers do not spend its whole length replicating.
    """

    def __init__(
        self,
        client: PSClient,
        ledger: np.ndarray,
        n_params: int,
        seed: int,
        low: int = -3,
        keep_going: bool = False,
        acks: list[tuple[float, float]] | None = None,
        every_s: float = 0.0,
    ) -> None:
        self.client, self.ledger, self.n_params = client, ledger, n_params
        self.rng = np.random.default_rng(seed)
        self.low, self.keep_going, self.acks = low, keep_going, acks
        self.every_s = every_s
        self.uncertain = np.zeros(n_params, np.float64)
        self.count, self.errors, self.last_ack = 0, [], time.monotonic()
        self._said_at = -ERROR_LOG_EVERY_S  # when a failed push was last logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-ledger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = time.monotonic() + self.every_s
            delta = self.rng.integers(self.low, 4, self.n_params).astype(np.float32)
            sent = time.time()
            try:
                self.client.push_deltas(delta)  # returns once every in-sync copy committed it
            except Exception as exc:  # noqa: BLE001 - reported: that push's fate is unknown
                self.errors.append(f"push {self.count + 1} failed: {exc!r}")
                # and when, in the pushing process's log, at most every ERROR_LOG_EVERY_S (a
                # report quotes the log's tail): a run stuck on failing pushes says so
                if time.monotonic() - self._said_at >= ERROR_LOG_EVERY_S:
                    self._said_at = time.monotonic()
                    print(f"{time.strftime('%H:%M:%S')} {self.errors[-1]} ({len(self.errors)} "
                          "failed so far)", file=sys.stderr, flush=True)  # fmt: skip
                np.add(self.uncertain, delta, out=self.uncertain)
                if not self.keep_going:
                    return
                continue
            np.add(self.ledger, delta, out=self.ledger)
            self.count += 1
            self.last_ack = time.monotonic()
            if self.acks is not None:
                self.acks.append((sent, time.time()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STALL_S + 30)
        if self._thread.is_alive():
            self.errors.append("the pushing thread did not stop")
