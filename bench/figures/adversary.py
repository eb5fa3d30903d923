"""Hostile clients against a parameter server, a copy and a data server: no crash, bounded
memory, an exact ledger.

Three roles run as their own processes, as a job runs them: ``hogwild ps serve`` (the bundled
MNIST model), a copy (two ``hogwild ps serve --copies 2`` under an etcd on loopback; the
messages go to the copy of one bucket) and ``hogwild data serve`` (MNIST idx). ``--messages``
hostile messages are shared among them, each role's sent from several sockets, pipelined (a
window of requests in flight, as clients do), drawn at random from these kinds:

- **mutated**: a valid request with one thing broken (random header bytes, a byte flipped, a
  field replaced by a random value, frames dropped, added, cut or replaced);
- **values**: valid headers with hostile values: NaN and infinite deltas, offsets and shapes at
  2^32 - 1 and 2^64 - 1, epochs past 2^31, record indices out of range or negative, batch sizes
  past the limit;
- **names** (ps): vector operations on random names (reads: nothing may be allocated) and fills
  of new names (refused past ``ps.max_vectors``);
- **jobs**: numbered requests of other jobs from random senders (they must not fill the request
  table);
- **peer** (the copy): a key holder speaking as the bucket's primary (its epoch, lease and
  sender id, read from a status): prepares far ahead of the log or of NaN deltas, forwarded
  client headers of garbage, commits beyond anything prepared, snapshots of the wrong size,
  messages of other senders, epochs and leases, and mutations of them;
- **unread** (one socket per role but the copy): requests whose replies are never read (the
  server must drop them past its high-water mark).

Meanwhile an honest client keeps a ledger: on the ps it pushes ones into a named vector
``ledger`` (created first, so the name flood cannot take its place) after every chunk and reads
it back at the end, which must equal the count of its pushes exactly (with copies, both servers
must also end at the same version of every shard); on the data server it reads a batch after
every chunk and checks it against the idx files.

Reported (one JSON line): messages sent per role and in all; crashes per role (the process
exited, or a role left a message unanswered for 10 s); peak resident memory per role against
its bound (its resident memory once started plus the stated bounds: the replies its router keeps
per socket, ``ps.max_vectors`` shard-sized vectors per shard, 64 MiB of request table); errors
counted by each role (its status), writes that failed after their acknowledgement and buckets
stopped by them (``stopped``), and the ledger check. Targets: 0 crashes, every peak within its
bound, an exact ledger, nothing stopped. The full run sends 10^6 messages; ``--quick`` 4,000,
for the tests.

Run: ``python bench/figures/adversary.py --out bench/results/adversary.json`` (``--quick`` for a
smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.hostile_frames import mutate, with_seq
from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, stamp
from hogwild.data.server import MAX_REPLY_BYTES
from hogwild.net.wire import NO_BASIS, DType, Header, MsgType, job_id, pack_header
from hogwild.net.wire import unpack_header as decode

READY = re.compile(r"^hogwild [a-z]+: serving .* on (\S+)$")
WINDOW = 64  # hostile requests in flight per socket (a client's window)
SOCKETS = 3  # hostile sockets per role that read their replies
UNREAD = 3000  # requests the unread socket sends per role
MiB = 2**20


class Role:
    """A role's process (``hogwild ARGS``), its address, and its peak resident memory."""

    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hogwild.cli", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.address = None
        ready = threading.Event()

        def read() -> None:
            for line in self.process.stderr:
                self.lines.append(line.rstrip())
                found = READY.match(line.strip())
                if found and not ready.is_set():
                    self.address = found.group(1)
                    ready.set()
            ready.set()  # its stderr ended: it exited before saying where it serves

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or self.address is None:
            self.stop()
            raise RuntimeError(f"{name} did not start: {self.lines[-5:]}")
        self.baseline = self.rss()
        self.peak = self.baseline
        self._watching = True
        threading.Thread(target=self._watch, daemon=True).start()

    def rss(self) -> int:
        try:
            return psutil.Process(self.process.pid).memory_info().rss
        except psutil.Error:
            return 0

    def _watch(self) -> None:
        while self._watching and self.process.poll() is None:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.address}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        self._watching = False
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def ps_hostile(rng: np.random.Generator, job: int, n_shards: int, shard: int) -> list[bytes]:
    """One hostile message for the parameter server."""
    kind = rng.integers(0, 5)
    target = int(rng.integers(0, n_shards + 2))
    n = int(rng.integers(1, 64))
    delta = rng.standard_normal(n).astype(np.float32)
    push = Header(MsgType.PUSH_DELTAS, job=job, target=target, shape=(n,), dtype=DType.FLOAT32,
                  frames=1, flags=NO_BASIS)  # fmt: skip
    if kind == 0:  # mutated
        return mutate([pack_header(push), delta.tobytes()], rng)
    if kind == 1:  # hostile values
        bad = rng.integers(0, 4)
        if bad == 0:
            delta[int(rng.integers(0, n))] = rng.choice([np.nan, np.inf, -np.inf])
            return [pack_header(push._replace(target=target % n_shards)), delta.tobytes()]
        if bad == 1:
            offset = [2**32 - 1, 2**64 - 1, shard, shard - 1][int(rng.integers(0, 4))]
            return [pack_header(push._replace(offset=offset)), delta.tobytes()]
        if bad == 2:
            h = Header(MsgType.PULL, job=job, target=target, offset=int(rng.integers(0, 2**63)),
                       aux=int(rng.integers(0, 2**32)))  # fmt: skip
            return [pack_header(h)]
        h = Header(
            MsgType.VECTOR_OP,
            job=job,
            target=target % n_shards,
            code=3,
            a=float(rng.choice([1e308, -1e308, 3e38])),
            dtype=DType.UINT8,
            shape=(6,),
            frames=1,
        )  # fmt: skip  (scale: x *= alpha, overflowing to infinity)
        return [pack_header(h), b"hostil"]
    if kind == 2:  # names: reads of random names, fills of new ones
        name = f"n{int(rng.integers(0, 10**9))}".encode()
        if rng.integers(0, 2):
            text, code = name + b"," + name, 1  # dot
        else:
            text, code = name, 6  # fill
        h = Header(MsgType.VECTOR_OP, job=job, target=target % n_shards, code=code,
                   dtype=DType.UINT8, shape=(len(text),), frames=1)  # fmt: skip
        return [pack_header(h), text]
    if kind == 3:  # other jobs, random senders
        other = int.from_bytes(rng.bytes(8), "little") | 1
        h = push._replace(job=other, sender=int(rng.integers(0, 2**32)))
        return [pack_header(h), delta.tobytes()]
    return [pack_header(Header(MsgType.STATUS, job=job))]


def copy_hostile(rng: np.random.Generator, job: int, peer: Header, shard_floats: int,
                 ahead: int) -> list[bytes]:  # fmt: skip
    """One hostile message for a copy, from a key holder speaking as its primary (``peer``: the
    primary's epoch, lease and sender id) or as anyone else."""
    kind = rng.integers(0, 6)
    delta = np.ones(shard_floats, np.float32)
    push = Header(MsgType.PUSH_DELTAS, job=job, sender=int(rng.integers(0, 2**31)), seq=1,
                  target=peer.target, shape=(shard_floats,), dtype=DType.FLOAT32, frames=1,
                  flags=NO_BASIS)  # fmt: skip
    prepare = pack_header(peer._replace(version=ahead + int(rng.integers(0, 2**40))))
    if kind == 0:  # a prepare far ahead of the log (a gap), or of NaN deltas
        if rng.integers(0, 2):
            delta[int(rng.integers(0, shard_floats))] = np.nan
        return [prepare, pack_header(push), delta.tobytes()]
    if kind == 1:  # a forwarded client header that is garbage or of another kind
        return [prepare, rng.bytes(int(rng.integers(0, 120))), delta.tobytes()]
    if kind == 2:  # a commit beyond anything prepared
        upto = [2**64 - 1, ahead, 2**63][int(rng.integers(0, 3))]
        return [pack_header(peer._replace(type=MsgType.COMMIT, version=upto, frames=0))]
    if kind == 3:  # a snapshot of the wrong size
        n = shard_floats - int(rng.integers(1, 4))
        head = peer._replace(type=MsgType.SNAPSHOT, version=ahead, dtype=DType.FLOAT32,
                             shape=(shard_floats,), frames=5)  # fmt: skip
        return [pack_header(head), np.zeros(n, np.float32).tobytes(), b"", b"", b"", b""]
    if kind == 4:  # another sender, epoch or lease: fenced at the gate
        other = peer._replace(sender=int(rng.integers(0, 2**32)), aux=int(rng.integers(0, 2**32)),
                              lease=int(rng.integers(0, 2**63)), version=ahead)  # fmt: skip
        return [pack_header(other), pack_header(push), delta.tobytes()]
    return mutate([prepare, pack_header(push), delta.tobytes()], rng)


def data_hostile(rng: np.random.Generator, data_id: int, count: int) -> list[bytes]:
    """One hostile message for the data server."""
    kind = rng.integers(0, 4)
    n = int(rng.integers(1, 32))
    idx = rng.integers(0, count, n).astype(np.int64)
    batch = Header(MsgType.BATCH, job=data_id, target=0, aux=int(rng.integers(0, 4)),
                   dtype=DType.INT64, shape=(n,), frames=1)  # fmt: skip
    if kind == 0:
        return mutate([pack_header(batch), idx.tobytes()], rng)
    if kind == 1:
        bad = rng.integers(0, 3)
        if bad == 0:
            idx[int(rng.integers(0, n))] = [-1, count, 2**63 - 1][int(rng.integers(0, 3))]
            return [pack_header(batch), idx.tobytes()]
        if bad == 1:
            return [pack_header(batch._replace(aux=[2**31, 2**32 - 1][int(rng.integers(0, 2))]))]
        big = 2**24
        return [pack_header(batch._replace(shape=(big,))), b""]
    if kind == 2:
        text = json.dumps({"op": rng.choice(["describe", "status", "x" * 50]),
                           "n": float(rng.choice([1e308, -0.0]))}).encode()  # fmt: skip
        h = Header(MsgType.CONTROL, job=[0, data_id, 7][int(rng.integers(0, 3))], dtype=DType.UINT8,
                   shape=(len(text),), frames=1)  # fmt: skip
        return [pack_header(h), text]
    return [pack_header(batch._replace(job=int.from_bytes(rng.bytes(8), "little") | 1))]


def drive(endpoint: str, make, messages: int, seed: int, result: dict) -> None:
    """Send ``messages`` from ``make(rng)`` with a window in flight; count replies."""
    rng = np.random.default_rng(seed)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent = replies = 0
    try:
        while sent < messages:
            # a fresh number: duplicates are their own test
            sock.send_multipart(with_seq(make(rng), sent + 1 + (seed << 40)))
            sent += 1
            while replies < sent - WINDOW or (sent == messages and replies < sent):
                if not sock.poll(10_000):
                    result["silent"] = result.get("silent", 0) + 1
                    result.update(sent=sent, replies=replies)
                    return
                decode(sock.recv_multipart()[0])  # every reply is well formed
                replies += 1
        result.update(sent=sent, replies=replies)
    except Exception as exc:  # noqa: BLE001 - a malformed reply is a finding: record it
        result.update(sent=sent, replies=replies, failed=f"{type(exc).__name__}: {exc}")
    finally:
        sock.close(linger=0)
        ctx.term()


def unread(endpoint: str, frames: list[bytes]) -> int:
    """Send ``UNREAD`` requests and never read a reply (the socket is closed unread)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 65536)
    sock.connect(endpoint)
    for k in range(UNREAD):
        head = bytearray(frames[0])
        head[28:36] = (k + 1 + (99 << 40)).to_bytes(8, "little")
        sock.send_multipart([bytes(head), *frames[1:]])
    time.sleep(1.0)
    sock.close(linger=0)
    ctx.term()
    return UNREAD


def attack(role: Role, make, messages: int, honest, seed: int) -> dict:
    """``messages`` hostile messages on ``SOCKETS`` sockets in chunks, the honest check after
    each chunk."""
    per_socket = max(1, messages // SOCKETS)
    chunks = max(1, min(20, per_socket // 1000))
    results = [dict() for _ in range(SOCKETS)]
    for c in range(chunks):
        parts: list[dict] = [{} for _ in range(SOCKETS)]
        threads = [
            threading.Thread(target=drive, args=(role.endpoint, make, per_socket // chunks,
                                                 seed + 1000 * c + s, parts[s]))
            for s in range(SOCKETS)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for total, part in zip(results, parts, strict=True):
            for key, value in part.items():
                total[key] = total.get(key, 0) + value if isinstance(value, int) else value
        if not role.alive():
            break
        honest()
    return {
        "sent": sum(r.get("sent", 0) for r in results),
        "replies": sum(r.get("replies", 0) for r in results),
        "silent": sum(r.get("silent", 0) for r in results),
        "malformed": [r["failed"] for r in results if "failed" in r],
    }


def status(endpoint: str, job: int) -> dict:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(pack_header(Header(MsgType.STATUS, job=job)))
        if not sock.poll(10_000):
            return {}
        return json.loads(sock.recv_multipart()[1])
    finally:
        sock.close(linger=0)
        ctx.term()


class Ledger:
    """The honest client's ledger on the parameter servers: ones pushed into the named vector
    ``ledger`` (created first, so a flood of names cannot take its place) after every chunk,
    and their sum read back at the end: exact, or an update was lost or applied twice."""

    def __init__(self, client) -> None:
        from hogwild_plugins.ps.sandblaster.vectors import ShardVectors

        self.client, self.vectors = client, ShardVectors(client)
        self.vectors.fill("ledger", 0.0)
        self.ones = np.ones(client.layout.n_params, np.float32)
        self.pushes = 0

    def push(self) -> None:
        self.client.push_deltas(self.ones, into="ledger")
        self.pushes += 1

    def found(self) -> float:
        return self.vectors.asum("ledger")

    @property
    def expected(self) -> float:
        return float(self.pushes * self.ones.size)


def ps_bound(role: Role, first_status: dict, layout) -> int:
    """A parameter server's memory bound: its baseline, what its sockets may buffer, every
    named vector it may hold (``ps.max_vectors`` per shard), and some slack."""
    shard_bytes = 4 * layout.shard_floats
    vectors = first_status.get("max_vectors", 32) * shard_bytes * layout.n_shards
    return role.baseline + 128 * MiB * (SOCKETS + 1) + vectors + 64 * MiB


def row(found: dict, role: Role, crashes: int, bound: int, errors: dict, **more) -> dict:
    """One role's figures: what the attack found, its crashes (a silent request counts as
    one), its peak memory against ``bound``, the errors it counted, and ``more``."""
    return {
        **found,
        "crashes": crashes + int(found["silent"] > 0),
        "peak_rss_mib": round(role.peak / MiB, 1),
        "bound_mib": round(bound / MiB, 1),
        "within_bound": role.peak <= bound,
        "errors_counted": errors,
        **more,
    }


def run_ps(messages: int) -> dict:
    from hogwild_plugins.ps.client import PSClient

    role = Role("ps", ["ps", "serve", "--port", "0", "--threads", "1", "--ps.shard_kib=256"])
    job = job_id("adam_mnist")
    try:
        with PSClient([role.address], "adam_mnist", client_id=1, timeout_s=10.0) as client:
            layout = client.layout
            ledger = Ledger(client)
            first = status(role.endpoint, job)
            unread_sent = unread(role.endpoint, [pack_header(Header(MsgType.PULL, job=job))])
            found = attack(role, lambda r: ps_hostile(r, job, layout.n_shards,
                                                      layout.shard_floats), messages, ledger.push,
                           seed=1)  # fmt: skip
            total = ledger.found() if role.alive() else None
            final = status(role.endpoint, job) if role.alive() else {}
        return row(
            found, role, int(not role.alive()), ps_bound(role, first, layout),
            final.get("errors", {}), unread_sent=unread_sent, nonfinite=final.get("nonfinite"),
            failed_after_ack=final.get("failed_after_ack"),
            buckets_stopped=final.get("buckets_stopped"),
            vectors_per_shard_max=max((s["vectors"] for s in final.get("shards", [])),
                                      default=None),
            ledger={"pushes": ledger.pushes, "expected": ledger.expected, "found": total,
                    "exact": total == ledger.expected},
        )  # fmt: skip
    finally:
        role.stop()


def run_copy(messages: int) -> dict:
    """Two servers keeping two copies of every bucket (etcd on loopback); the hostile messages go
    to the copy of one bucket, speaking as its primary; the ledger is checked on the primaries
    and both servers must end at the same version of every shard."""
    from hogwild_plugins.ps.client import PSClient
    from hogwild_plugins.ps.etcd import EtcdProcess
    from hogwild_plugins.ps.replication.peer_link import PEER_SENDER

    from hogwild.net.ports import free_ports

    addresses = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    job = job_id("adam_mnist")
    with EtcdProcess() as etcd:
        roles = []
        try:
            for i in range(2):
                roles.append(Role(f"copy {i}", [
                    "ps", "serve", "--servers", addresses, "--index", str(i), "--threads", "1",
                    "--copies", "2", "--etcd", etcd.address, "--lease-s", "1",
                    "--ps.shard_kib=256"]))  # fmt: skip
            with PSClient(addresses.split(","), "adam_mnist", client_id=1, timeout_s=10.0,
                          etcd=etcd.address) as client:  # fmt: skip
                layout = client.layout
                ledger = Ledger(client)
                ledger.push()
                found_roles = [status(r.endpoint, job)["replication"] for r in roles]
                bucket = layout.bucket_of(0)
                [p] = [i for i, r in enumerate(found_roles)
                       if r["roles"][str(bucket)]["role"] == "primary"]  # fmt: skip
                copy = roles[1 - p]
                epoch = found_roles[p]["roles"][str(bucket)]["epoch"]
                peer = Header(MsgType.PREPARE, job=job, sender=PEER_SENDER + p, target=0,
                              lease=found_roles[p]["lease"], aux=epoch, a=1.0,
                              frames=2)  # fmt: skip
                first = status(copy.endpoint, job)
                ahead = 2**32 + max(s["version"] for s in first["shards"])
                found = attack(copy, lambda r: copy_hostile(r, job, peer, layout.shard_floats,
                                                            ahead), messages, ledger.push,
                               seed=3)  # fmt: skip
                alive = all(r.alive() for r in roles)
                total = ledger.found() if alive else None
                time.sleep(2.0)  # the last commits reach the copy
                finals = [status(r.endpoint, job) if r.alive() else {} for r in roles]
            versions = [{s["shard"]: s["version"] for s in f.get("shards", [])} for f in finals]
            agree = versions[0] == versions[1]
            return row(
                found, copy, sum(int(not r.alive()) for r in roles), ps_bound(copy, first, layout),
                finals[1 - p].get("errors", {}), unread_sent=0,
                copies_agree=agree and bool(versions[0]),
                failed_after_ack=sum(f.get("failed_after_ack", 0) for f in finals),
                buckets_stopped=sum(f.get("buckets_stopped", 0) for f in finals),
                ledger={"pushes": ledger.pushes, "expected": ledger.expected, "found": total,
                        "exact": total == ledger.expected and agree},
            )  # fmt: skip
        finally:
            for r in roles:
                r.stop()


def run_data(messages: int, source: str) -> dict:
    from hogwild.data.mnist import load_mnist
    from hogwild.data.remote import RemoteReader

    role = Role("data", ["data", "serve", source, "--port", "0"])
    try:
        reader = RemoteReader([role.address], "train", timeout_s=10.0)
        data_id, count = reader.data_id, reader.count
        truth = load_mnist(source)
        idx = np.array([0, 7, count - 1], np.int64)
        checks = {"reads": 0, "exact": True}

        def honest() -> None:
            out = np.empty((3, *reader.shape), np.uint8)
            labels = np.empty(3, np.int32)
            reader.read(idx, out, labels)
            checks["reads"] += 1
            checks["exact"] &= bool(
                (out.reshape(3, 28, 28) == truth.train_images[idx]).all()
                and (labels == truth.train_labels[idx]).all()
            )

        unread_sent = unread(role.endpoint, [pack_header(Header(
            MsgType.BATCH, job=data_id, target=0, dtype=DType.INT64, shape=(8192,), frames=1)),
            np.arange(8192, dtype=np.int64).tobytes()])  # fmt: skip
        found = attack(role, lambda r: data_hostile(r, data_id, count), messages, honest, seed=2)
        final = status(role.endpoint, data_id) if role.alive() else {}
        reader.close()
        bound = role.baseline + 128 * MAX_REPLY_BYTES + 128 * MiB * SOCKETS + 64 * MiB
        return row(found, role, int(not role.alive()), bound, final.get("errors", {}),
                   unread_sent=unread_sent, ledger=checks)  # fmt: skip
    finally:
        role.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="hostile messages, all")
    parser.add_argument("--quick", action="store_true", help="4,000 messages: a smoke run")
    parser.add_argument("--out", help="write the JSON line here too")
    parser.add_argument(
        "--data",
        default=os.environ.get("HOGWILD_DATA")
        or (str(SHARED_MNIST) if SHARED_MNIST.is_dir() else "mnist"),
        help="the MNIST idx files the data server serves (default: $HOGWILD_DATA, else "
        "../shared/datasets/mnist beside the checkout, else mnist: downloaded)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    messages = 4000 if args.quick else args.messages
    source = args.data
    third = messages // 3
    roles = {
        "ps": run_ps(third),
        "copy": run_copy(third),
        "data": run_data(messages - 2 * third, source),
    }
    record = {
        "benchmark": "adversary",
        "messages_sent": sum(r["sent"] + r["unread_sent"] for r in roles.values()),
        "crashes": {name: r["crashes"] for name, r in roles.items()},
        "within_bounds": all(r["within_bound"] for r in roles.values()),
        "ledger_exact": all(r["ledger"]["exact"] for r in roles.values()),
        "roles": roles,
        "quick": args.quick,
        "machine": describe_machine(),
        "versions": versions(),
    }
    record["malformed_replies"] = sum(len(r["malformed"]) for r in roles.values())
    # no hostile message may make a server fail a write it acknowledged (it would stop a bucket)
    record["stopped"] = sum(
        (r.get("failed_after_ack") or 0) + (r.get("buckets_stopped") or 0) for r in roles.values()
    )
    record["ok"] = (
        not any(record["crashes"].values())
        and record["within_bounds"]
        and record["ledger_exact"]
        and not record["malformed_replies"]
        and not record["stopped"]
    )
    emit_record(stamp(record, __file__, argv if argv is not None else sys.argv[1:], started),
                args.out)  # fmt: skip
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
