"""Adam Fig. 9: parameter updates per second against server cores, beside limits and peers.

Two update APIs (Adam 3.2.6): ``deltas`` (accumulated weight deltas, 1 MiB shards; an update is
one parameter changed by one delta) and ``activations`` (a fully connected layer's k activation
and k error vectors; an update is one multiply-accumulate of the k outer products, as Adam
counts). Each is measured for 1 .. all server cores three ways:

- ``inproc``: the update path alone, on queued buffers: work items submitted straight to the
  server's update threads (pinned to the cores), no sockets;
- ``ipc`` and ``tcp``: a server process pinned to the cores, ``--clients`` client processes
  (:class:`hogwild_plugins.ps.client.PSClient`) each pushing synchronously (one 1 MiB delta, or
  one layer's vectors, then wait for the acknowledgement) over loopback, the servers receiving
  as they do by default (``recv = "auto"``: into blocks of a private pool on two cores or more,
  in place on one). ``tcp`` on all cores is also run with frames used in place, in ZeroMQ's
  buffers (``"recv": "inplace"``, the default with copies), and on
  a server that queues every push and pull for its update threads (``"pushes"`` and
  ``"pulls": "queued"``) beside the default, whose network thread serves a shard whose update
  thread is idle itself.

Limits from the same run: STREAM triad GB/s on all cores (numba, float32; a delta update moves
12 bytes unbatched, so triad/12 is the unbatched update ceiling: opportunistic batching can beat
it), float32 sgemm GFLOP/s on all cores (one multiply-accumulate is 2 flops), and raw pyzmq
request/reply of 1 MiB frames with the same clients (ROUTER receiving without copy, adding the
frame into a float32 vector with numpy as the issue's yardstick does, 2-byte answer; over TCP
also without the add: ``pyzmq_1mb_receive_only_gb_s``, the transport alone). Peers, with the
same clients and the same synchronous 1 MiB pushes over loopback: a Ray actor parameter server
(``bench/peers/ps_ray.py``) and PyTorch RPC (``bench/peers/ps_torch_rpc.py``), the latter twice:
``torch_rpc`` with TensorPipe on TCP, over the same loopback as ours (the issue's comparison),
and ``torch_rpc_same_host`` with TensorPipe's own choice, which on one host is shared memory (no
socket: a comparison with a transport ZeroMQ does not have, reported beside it). Ray's object
store is shared memory on one host whatever one does.

Run: ``python bench/figures/adam_fig9_ps.py --out bench/results/ps.json --plot
bench/results/fig9.png``; prints one JSON line. ``--seconds`` per measurement (default 2; the sgemm
limit multiplies for the shorter of 1 s and ``--seconds``, both in the record),
``--no-peers`` to skip Ray and torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.peers.ps_raw_zmq import WARMUP, raw_client, raw_server
from bench.support.child_server import ChildServer, alive, warm_forkserver
from bench.support.machine import Gang, describe_machine, sgemm_gflops, versions
from bench.support.paths import REPO
from bench.support.record import command_line, emit_record, source

SHARD = 262_144  # floats per 1 MiB shard
N_SHARDS = 8
FC = FcLayer(layer=1, offset=4 * SHARD, n_in=1024, n_out=1024)  # W: 4 MiB, shards 4..7
GEOMETRY = ModelGeometry(N_SHARDS * SHARD, (FC,))
K = 256  # vectors per API (b) push (Adam: "typically in the hundreds")
QUEUED = 8  # deltas waiting per shard in the in-process measurement


# ---------------------------------------------------------------------- limits


def triad_gb_s(cores: list[int], seconds: float) -> float:
    """STREAM triad ``a = b + s c`` (float32, 3 x 64 MiB per thread), one thread per core."""
    from numba import njit

    @njit(nogil=True, cache=False)
    def triad(a, b, c, s, reps):
        for _ in range(reps):
            for i in range(a.shape[0]):
                a[i] = b[i] + s * c[i]

    n = 16 << 20
    done, threads = [0.0] * len(cores), []

    def run(t: int) -> None:
        os.sched_setaffinity(0, {cores[t]})
        a, b, c = (np.ones(n, np.float32) for _ in range(3))
        triad(a, b, c, np.float32(0.5), 1)
        reps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            triad(a, b, c, np.float32(0.5), 2)
            reps += 2
        done[t] = 12.0 * n * reps / (time.perf_counter() - started)

    triad(*(np.ones(4, np.float32) for _ in range(3)), np.float32(1), 1)  # compile
    for t in range(len(cores)):
        threads.append(threading.Thread(target=run, args=(t,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return sum(done) / 1e9


# ---------------------------------------------------------------------- in process


def inproc(api: str, cores: list[int], seconds: float, queued: int = QUEUED) -> float:
    """Updates/s of the update threads alone, fed from this thread (no sockets).

    Deltas arrive ``queued`` per shard at a time (pushes of several clients waiting for the
    same shard: what opportunistic batching works on), from a pool of 64 distinct 1 MiB buffers
    (64 MiB: more than the last-level cache, so they come from memory, as fresh ones would).
    """
    from hogwild_plugins.ps.engine import UpdateEngine
    from hogwild_plugins.ps.kernels import RULE_SGD, compile_kernels
    from hogwild_plugins.ps.work import PushDeltas, PushVectors, Shard, Work

    from hogwild.blas import limit_blas_threads

    compile_kernels()
    limit_blas_threads(1)
    shards = [
        Shard(s, s * SHARD, np.empty(SHARD, np.float32), np.empty(0, np.float32))
        for s in range(N_SHARDS)
    ]
    engine = UpdateEngine(
        shards, rule=RULE_SGD, lr=1.0, mu=0.0, eps=1e-8, threads=len(cores), cpus=set(cores)
    )
    engine.start()
    rng = np.random.default_rng(0)
    deltas = [rng.standard_normal(SHARD).astype(np.float32) for _ in range(64)]
    a = rng.standard_normal((K, FC.n_in)).astype(np.float32)
    rows = SHARD // FC.n_in
    ets = [rng.standard_normal((rows, K)).astype(np.float32) for _ in range(4)]

    def round_of_work(r: int) -> list[Work]:
        if api == "deltas":
            return [
                PushDeltas(
                    s,
                    offset=0,
                    length=SHARD,
                    delta=deltas[(r * 7 + s * queued + j) % 64],
                )
                for s in range(N_SHARDS)
                for j in range(queued)
            ]
        return [
            PushVectors(
                4 + j,
                layer=FC,
                first_row=j * rows,
                activations=a,
                errors_by_row=ets[j],
                coef=-0.01,
                length=SHARD,
            )
            for j in range(4)  # the layer's shards
        ]

    submitted = 0
    try:
        for work in round_of_work(0):  # warm-up
            submitted += engine.submit(work)
        _drain(engine, submitted)
        before, r = sum(engine.updated), 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            backlog = submitted - sum(engine.applied)
            if backlog < (2 * N_SHARDS * queued if api == "deltas" else 4 * len(cores)):
                r += 1
                for work in round_of_work(r):
                    submitted += engine.submit(work)
            else:  # the queued work lasts milliseconds: a tighter poll would take the CPU
                time.sleep(5e-4)  # the update threads measure on (20 us cost 20 % on 2 cores)
        _drain(engine, submitted)
        return (sum(engine.updated) - before) / (time.perf_counter() - started)
    finally:
        engine.stop()


def _drain(engine, submitted: int, timeout: float = 60.0) -> None:
    """Wait until every submitted item was applied."""
    deadline = time.monotonic() + timeout
    while sum(engine.applied) < submitted:
        if time.monotonic() > deadline:
            raise RuntimeError("the update threads did not apply their queues in time")
        time.sleep(20e-6)


# ---------------------------------------------------------------------- over loopback


FORKSERVER_PRELOAD = (
    "bench.support.ps_kernels_loaded",  # the parameter server's code and kernels
    "bench.peers.ps_raw_zmq",
    "bench.support.child_server",
    "bench.support.machine",
    "bench.support.paths",
    "bench.support.record",
)


def ps_server(bench: int, cpus: list[int], transport: str, recv: str, direct: bool, conn) -> None:
    """A parameter server process on ``cpus`` until the benchmark (pid ``bench``) says stop or
    is gone; sends its address and whether it started warm (its kernels loaded in the
    forkserver), then its status.

    ``direct``: pulls and pushes of a shard whose update thread is idle are served by the
    network thread (the default); False queues every request for the update threads.
    """
    from hogwild_plugins.ps.serving.options import ServerOptions
    from hogwild_plugins.ps.serving.server import ParameterServer

    os.sched_setaffinity(0, cpus)
    sys.setswitchinterval(2e-4)  # as `hogwild ps serve` does
    address = "127.0.0.1:0" if transport == "tcp" else f"ipc:///tmp/hogwild-bench-{os.getpid()}"
    options = ServerOptions(
        job="bench",
        servers=(address,),
        threads=len(cpus),
        recv=recv,
        ack="queued",
        direct_pulls=direct,
        direct_pushes=direct,
    )
    warm = "bench.support.ps_kernels_loaded" in sys.modules  # imported by the forkserver
    server = ParameterServer(GEOMETRY, options)
    conn.send((str(server.start(set(cpus))), warm))
    while not conn.poll(0.2):
        if not alive(bench):  # the benchmark died: nobody will say stop
            break
    else:
        with contextlib.suppress(EOFError):  # its end of the pipe closed: stop as asked
            conn.recv()
    status = server.status()
    server.stop()
    with contextlib.suppress(BrokenPipeError):
        conn.send(status)


def ps_client(address: str, api: str, seconds: float, rank: int, *, ready) -> tuple:
    """Updates/s, requests/s and requests sent of one client, synchronously (a Gang task).

    The clock stops after a pull of the shards pushed to, which the server answers only once
    every push before it is applied: acknowledgements sent when a push is queued
    (``ack = "queued"``) do not let the count run ahead of the updates. ``api = "pull"`` pulls
    one 1 MiB shard at a time instead (its "updates" are the parameters read).
    """
    from hogwild_plugins.ps.client import PSClient

    client = PSClient([address], "bench", client_id=1000 + rank, timeout_s=60.0)
    scratch = np.empty(GEOMETRY.n_params, np.float32)
    try:
        if api == "pull":
            per, shards = SHARD, [rank % N_SHARDS]

            def push():
                client.pull(scratch, shards=shards)

        elif api == "deltas":
            delta = np.ones(GEOMETRY.n_params, np.float32)
            client.pin(delta)  # as a replica pins its push buffer
            lo = (rank % N_SHARDS) * SHARD
            per, shards = SHARD, [rank % N_SHARDS]

            def push():
                client.push_deltas(delta, ranges=[(lo, lo + SHARD)])
        else:
            rng = np.random.default_rng(rank)
            a = rng.standard_normal((K, FC.n_in)).astype(np.float32)
            e = rng.standard_normal((K, FC.n_out)).astype(np.float32)
            per, shards = K * FC.size, [4, 5, 6, 7]

            def push():
                client.push_vectors(FC.layer, a, e, 1e-4)

        for _ in range(WARMUP):
            push()
        ready()
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            push()
            count += 1
        client.pull(scratch, shards=shards)
        elapsed = time.perf_counter() - started
        return count * per / elapsed, count / elapsed, count + WARMUP + 1
    finally:
        client.close()


def received_into(address: str) -> str:
    """How a running server receives pushes (``"pool"`` or ``"inplace"``), from its status."""
    from hogwild_plugins.ps.client import PSClient

    with PSClient([address], "bench", client_id=999, timeout_s=30.0) as client:
        return client.status()[0]["recv"]


def loopback(gang: Gang, server: ChildServer, api: str, seconds: float) -> dict:
    """Updates/s and requests/s of the gang's clients calling ``server``, and the server's CPU
    time per request (every thread of its process: ZeroMQ's I/O, network and update threads)."""
    cpu = server.cpu_seconds()
    _, answers = gang.run(ps_client, [(server.address, api, seconds, r) for r in range(gang.n)])
    cpu = server.cpu_seconds() - cpu
    rate_key = "pulls_per_s" if api == "pull" else "pushes_per_s"
    return {
        "updates_per_s": sum(a[0] for a in answers),
        rate_key: sum(a[1] for a in answers),
        "server_cpu_ms": 1e3 * cpu / sum(a[2] for a in answers),
    }


# ---------------------------------------------------------------------- peers


def peer(script: str, clients: int, seconds: float, repeats: int, *extra: str) -> dict:
    command = [
        sys.executable,
        str(REPO / "bench" / "peers" / script),
        "--clients",
        str(clients),
        "--seconds",
        str(seconds),
        "--repeats",
        str(repeats),
        *extra,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 600 s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the JSON record here too")
    parser.add_argument("--plot", help="draw Fig. 9 into this PNG")
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--clients", type=int, default=2, help="client processes over loopback")
    parser.add_argument("--no-peers", action="store_true", help="skip Ray and PyTorch RPC")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    limits = {
        "triad_gb_s": triad_gb_s(cpus, args.seconds),
        # a second of multiplying (less for a tiny run's shorter measurements)
        "sgemm_gflops": sgemm_gflops(len(cpus), seconds=min(1.0, args.seconds))["total"],
    }
    results, rounds = measure(args, cpus)
    limits["pyzmq_1mb_gb_s"] = statistics.median(r["raw_tcp"] for r in rounds) / 1e9
    limits["pyzmq_1mb_ipc_gb_s"] = statistics.median(r["raw_ipc"] for r in rounds) / 1e9
    limits["pyzmq_1mb_receive_only_gb_s"] = (
        statistics.median(r["raw_tcp_receive_only"] for r in rounds) / 1e9
    )
    for t in ("tcp", "ipc", "tcp_receive_only"):
        cpu = statistics.median(r[f"raw_{t}_server_cpu_ms"] for r in rounds)
        limits[f"pyzmq_1mb_{t}_server_cpu_ms"] = round(cpu, 4)
    peers = {}
    if not args.no_peers:
        for name, script, *extra in (
            ("ray", "ps_ray.py"),
            ("torch_rpc", "ps_torch_rpc.py", "--transport", "tcp"),
            ("torch_rpc_same_host", "ps_torch_rpc.py", "--transport", "default"),
        ):
            peers[name] = peer(script, args.clients, max(args.seconds, 3.0), args.repeats, *extra)
    record = {
        "benchmark": "ps",
        "results": results,
        "limits": limits,
        "peers": peers,
        "targets": targets(results, limits, peers, rounds, len(cpus)),
        "shard_floats": SHARD,
        "k": K,
        "layer": [FC.n_out, FC.n_in],
        "queued_per_shard": QUEUED,
        "repeats": args.repeats,
        "seconds": args.seconds,  # per measurement
        "sgemm_s": min(1.0, args.seconds),  # the sgemm limit's own multiplying time
        # every parameter server found its kernels loaded by the forkserver (not started cold)
        "servers_started_warm": all(r["servers_started_warm"] for r in rounds),
        "machine": describe_machine(),
        "versions": versions(),
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
        "source": source(),  # the commit, and files changed from it
    }
    emit_record(record, args.out)
    if args.plot:
        from bench.support.plot_adam_fig9 import plot_fig9

        plot_fig9(record, args.plot)
    return 0


def measure(args, cpus: list[int]) -> tuple[list[dict], list[dict]]:
    """Every configuration once per round, rounds interleaved; rows of medians, and the rounds.

    The servers stay up for the whole run (idle while others are measured), so that each round
    measures every configuration within a minute of the others: this machine's speed drifts.
    """
    s, counts = args.seconds, range(1, len(cpus) + 1)
    # the server's default receive ("auto": pool blocks on 2 cores or more), and in place
    configs = [(n, t, "auto") for n in counts for t in ("ipc", "tcp")] + [
        (len(cpus), "tcp", "inplace")
    ]
    everything = len(cpus)
    rounds: list[dict] = []
    with contextlib.ExitStack() as stack:
        # every server forked from one that loaded the server's code and kernels once, and the
        # modules this script imports (a forked child imports the script again); it ends last
        forks = stack.enter_context(warm_forkserver(*FORKSERVER_PRELOAD))
        gang = stack.enter_context(Gang(args.clients, name="bench-ps-client"))
        # the yardstick adds each push into a float32 vector (the issue's); over TCP also the
        # transport alone, receiving and answering without touching the data
        raw = {
            key: stack.enter_context(ChildServer(raw_server, cpus, *key, context=forks))
            for key in (("tcp", True), ("ipc", True), ("tcp", False))
        }
        servers = {
            c: stack.enter_context(
                ChildServer(ps_server, cpus[: c[0]], c[1], c[2], True, context=forks)
            )
            for c in configs
        }
        # pulls and pushes of 1 MiB shards: served by the network thread when the shard's
        # update thread is idle (the default) and, on a server that does not, all queued for
        # the update threads
        received = {c: received_into(server.address) for c, server in servers.items()}
        queued = stack.enter_context(
            ChildServer(ps_server, cpus, "tcp", "auto", False, context=forks)
        )
        pullers = {"direct": servers[(everything, "tcp", "auto")], "queued": queued}
        warm = all(server.warm for server in (*servers.values(), queued))
        for _ in range(args.repeats):
            found: dict = {}
            for (t, add), server in raw.items():
                name = f"raw_{t}" if add else f"raw_{t}_receive_only"
                cpu = server.cpu_seconds()
                _, answers = gang.run(raw_client, [(server.address, s)] * gang.n)
                cpu = server.cpu_seconds() - cpu
                found[name] = sum(rate for rate, _ in answers)
                found[f"{name}_server_cpu_ms"] = 1e3 * cpu / sum(n for _, n in answers)
            for n in counts:
                for api in ("deltas", "activations"):
                    found[(api, "inproc", n, "auto")] = {"updates_per_s": inproc(api, cpus[:n], s)}
            for (n, t, recv), server in servers.items():
                for api in ("deltas", "activations") if recv == "auto" else ("deltas",):
                    found[(api, t, n, recv)] = loopback(gang, server, api, s)
            found[("deltas", "tcp", everything, "queued")] = loopback(gang, queued, "deltas", s)
            for how, server in pullers.items():
                found[("pull", "tcp", everything, how)] = loopback(gang, server, "pull", s)
            found["servers_started_warm"] = warm
            rounds.append(found)
    results = []
    for key in (k for k in rounds[0] if isinstance(k, tuple)):
        api, transport, n, variant = key
        row = {"api": api, "transport": transport, "server_cores": n}
        if transport != "inproc":
            row["clients"] = args.clients
        if api == "pull":
            row["pulls"] = variant
        elif variant == "queued":
            row["pushes"] = variant
        elif variant != "auto":
            row["recv"] = variant
        if (n, transport, variant) in received:
            row["received"] = received[(n, transport, variant)]  # what "auto" decided
        for field in rounds[0][key]:
            values = [r[key][field] for r in rounds]
            row[field] = round(statistics.median(values), 4 if field.endswith("_ms") else 1)
            if field == "updates_per_s":
                row["range"] = [min(values), max(values)]
        results.append(row)
    return results, [
        {k: v for k, v in r.items() if isinstance(k, str)}
        | {
            "ours_tcp": r[("deltas", "tcp", everything, "auto")]["updates_per_s"] * 4,
            "ours_tcp_queued": r[("deltas", "tcp", everything, "queued")]["updates_per_s"] * 4,
        }
        for r in rounds
    ]


def targets(results: list[dict], limits: dict, peers: dict, rounds: list[dict], cores: int) -> dict:
    """The issue's targets as measured ratios (each should reach its threshold).

    In process against the limits; a 1 MiB push and its acknowledgement over TCP against raw
    pyzmq as the median of the per-round ratios (each round measured both within a minute);
    against the peers with the same clients and the same synchronous 1 MiB pushes.
    """

    def rows(api: str, transport: str) -> list[dict]:
        return [
            r
            for r in results
            if r["api"] == api
            and r["transport"] == transport
            and "recv" not in r
            and "pushes" not in r
        ]

    tcp_a = next(r for r in rows("deltas", "tcp") if r["server_cores"] == cores)
    pulls = {r["pulls"]: r["pulls_per_s"] for r in results if r["api"] == "pull"}
    best = {
        api: max(r["updates_per_s"] for r in rows(api, "inproc"))
        for api in ("deltas", "activations")
    }
    out = {
        "deltas_inproc_vs_triad": best["deltas"] / (limits["triad_gb_s"] * 1e9 / 12),
        "activations_inproc_vs_sgemm": best["activations"] / (limits["sgemm_gflops"] * 1e9 / 2),
        "push_1mb_tcp_vs_pyzmq": statistics.median(r["ours_tcp"] / r["raw_tcp"] for r in rounds),
        "push_1mb_tcp_vs_pyzmq_rounds": [round(r["ours_tcp"] / r["raw_tcp"], 3) for r in rounds],
        "push_1mb_tcp_vs_pyzmq_receive_only": statistics.median(
            r["ours_tcp"] / r["raw_tcp_receive_only"] for r in rounds
        ),
        "push_1mb_direct_vs_queued": statistics.median(
            r["ours_tcp"] / r["ours_tcp_queued"] for r in rounds
        ),
        "pull_1mb_direct_vs_queued": pulls["direct"] / pulls["queued"],
        "thresholds": {
            "deltas_inproc_vs_triad": 0.7,
            "activations_inproc_vs_sgemm": 0.5,
            "push_1mb_tcp_vs_pyzmq": 0.8,
            "vs_ray": 5.0,
            "vs_torch_rpc": 2.0,
        },
    }
    for name in ("ray", "torch_rpc", "torch_rpc_same_host"):
        rate = peers.get(name, {}).get("updates_per_s")
        if rate:
            out[f"vs_{name}"] = tcp_a["updates_per_s"] / rate
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


if __name__ == "__main__":
    raise SystemExit(main())
