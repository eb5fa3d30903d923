"""One partition process: a dataflow loop over the replica's in-flight examples.

Adam section 3.2.5: a partition works on whichever example's inputs have arrived, so a slow
partition stalls nobody until every in-flight slot waits on it. The shared arena
(:mod:`hogwild.partition.runtime` lays it out) holds, per in-flight *slot*, one activation row
that every partition writes its slices into in place, one error row per partition, and a row of
int64 counters:

* ``GEN``: the generation of the example in the slot (the feeder bumps it when it loads one);
* ``FWD(b)``: how many producers wrote their slice of boundary ``b``'s input block; a segment after
  the boundary runs once it equals the number of producers (the all-gather is this counter: the
  values are already where the reader reads them);
* ``BWD(b)``: how many contributors wrote their partial error over that block; a partition then
  sums the partials over its own slice (:meth:`PartitionStages.reduce`) and goes on backward;
* ``DONE``: partitions finished with the example; the last one counts it as completely processed
  (Adam's epoch rule), and the feeder may then load the slot again.

Partition 0 is also the feeder: it loads the next example of the order into every slot whose
example all partitions finished. The parent hands out work as a running total: ``COUNT`` is how
many examples to feed in all (``FED`` how many were), the ``order`` region a ring read at
``fed % len(order)``; a ``CLOSE`` the parent raises makes the feeder cut ``COUNT`` to what it fed
and answer ``CLOSED`` (only the feeder knows what it fed). Each partition applies the update rule
to its own rows of the whole model's parameter vector, without locks: with ``optim.rule = "sgd"``
its fully connected rows as each segment's backward pass streams them (as the unpartitioned
engine does at batch 1), the rest once the example's backward pass is done
(:func:`~hogwild.partition.compute.fc_update_mode`).

In a cluster job (:mod:`hogwild.cluster.partitioned`) each partition also exchanges its own rows,
and only those, with the parameter servers: an :class:`~hogwild.store.exchange.Exchanger` of
the store's home (opened through the parameter-store registry, never a plugin import) pushes the
rows' progress every ``n_push`` examples and pulls them every ``n_fetch`` on its thread; when the
parent raises ``FLUSH`` (all of a portion's examples complete) it pushes what remains and
answers ``FLUSHED``.

With partitions on other hosts (``model.partition_hosts``) a partition also sends, after each
counter it advances, the block that counter announces to the hosts where a partition reads it
(:class:`~hogwild.partition.sending.PartitionLink`); there the link's receiver writes the block
into the same row of that host's arena and advances the same counter, so this loop is the same
on every host. The feeder's LOAD carries each example to the other hosts; a partition's DONE
goes to the leader's host.

The loop does no waiting of its own: when nothing can advance it backs off (yield, then short
sleeps) and checks that the parent still runs and has not asked it to stop.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
import unicodedata

START_TIMEOUT_S = 600.0  # a partition attaches and loads its kernels from numba's cache
PROCESS_NAME = "hogwild-wpart"  # + the partition; hogwild.numa.claims counts "hogwild-w*"
# control words (int64, one 64-byte line each)
STOP, EPOCH, COUNT, FED = 0, 8, 16, 24  # EPOCH: the epoch under way, 1-based (informative)
READY, PINNED = 32, 32 + 8 * 64  # + 8 * partition
MAX_PARTITIONS = 64
CLOSE = PINNED + 8 * MAX_PARTITIONS  # the parent's close requests, numbered
CLOSED = CLOSE + 8  # the last close the feeder carried out
FLUSH = CLOSE + 16  # the parent's flush requests, numbered
FLUSHED = CLOSE + 24  # + 8 * partition: the last flush it carried out
TAKEN = FLUSHED + 8 * MAX_PARTITIONS  # the host's takes of the servers' model (host_rows)
CONTROL_WORDS = TAKEN + 8
SAID_BYTES = 1024  # of a stopped partition's line kept in the arena's ``said`` row for its parent
# float controls: the epoch's rate; with optim.smooth the rate it ends at, and the examples fed
# before it and in it (the feeder moves each example's rate along that line)
LR, LR_END, SMOOTH, EPOCH_FIRST, EPOCH_N = 0, 1, 2, 3, 4
# per-partition statistics (float64 row each, 8 wide)
STAT_EXAMPLES, STAT_LOSS, STAT_CORRECT, STAT_BEAT, STAT_STORE_WAIT = 0, 1, 2, 3, 4
GEN, DONE = 0, 1


def fwd_column(b: int) -> int:
    """Counter column of boundary ``b`` (1-based, before segment ``b``), forward."""
    return 2 + 2 * (b - 1)


def bwd_column(b: int) -> int:
    return 3 + 2 * (b - 1)


def slot_width(n_segments: int) -> int:
    """Counters per slot, padded to a 64-byte line."""
    return (2 + 2 * max(0, n_segments - 1) + 7) // 8 * 8


def partition_main(setup: dict) -> None:
    """Entry point of partition ``setup["partition"]`` (started by the runtime, from the
    forkserver or with spawn: ``train.start_method``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sets STOP
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from hogwild.shm.naming import process_alive
    from hogwild.signals import die_with_parent, die_with_process

    die_with_parent(signal.SIGTERM)
    if os.getppid() != setup["parent_pid"]:  # forked by the forkserver, whose death is not ours
        die_with_process(setup["parent_pid"], signal.SIGTERM)
    if not process_alive(setup["parent_pid"], setup["parent_started"]):
        return  # gone before its death could be watched: nobody to serve
    try:  # a worker's name (hogwild.numa.claims): other jobs plan around the CPU it is pinned to
        with open("/proc/self/comm", "w") as comm:
            comm.write(f"{PROCESS_NAME}{setup['partition']}")
    except OSError:
        pass
    arena = None
    try:
        from hogwild.numa.pinning import pin_worker
        from hogwild.shm.arena import Arena, ArenaLayout
        from hogwild.shm.atomics import atomic_store

        pin_worker(setup["placement"])  # before anything is allocated: first touch places it
        arena = Arena.attach(setup["arena"], ArenaLayout.from_json(setup["layout"]))
        atomic_store(arena.array("control"), PINNED + 8 * setup["partition"], 1)
        PartitionLoop(setup, arena).run()
    except SystemExit:
        pass
    except BaseException as exc:
        from hogwild.errors import EXIT_STOPPED, StoppedError, cause_of

        stopped = cause_of(exc, StoppedError)
        if stopped is not None:  # its parameter server stopped the bucket: no restart helps
            sys.stderr.write(f"hogwild: partition {setup['partition']}: {stopped}\n")
            sys.stderr.flush()
            if arena is not None:  # the parent's error names the server, bucket and failure
                write_said(arena, setup["partition"], str(stopped))
            os._exit(EXIT_STOPPED)  # the parent raises a StoppedError naming this partition
        sys.stderr.write(f"partition {setup['partition']} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)  # the parent names this partition and stops the replica
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below must run to its end
        if arena is not None:
            arena.close()
            if not process_alive(setup["parent_pid"], setup["parent_started"]):
                from hogwild.shm.sweeper import unlink_segment

                unlink_segment(setup["arena"])  # the parent was killed: nobody else will


def count_example(exchanger, takes) -> None:
    """A partition's example ended: its exchanger counts it (and pushes when due), its pushes
    first stamped with the versions of the host's take if one came since its last example
    (:class:`~hogwild.partition.takes.Takes`): the take rewrote its rows' ``base``."""
    versions = takes.since()
    if versions is not None:
        exchanger.adopt(versions)
    exchanger.trained(1, None)


def write_said(arena, p: int, text: str) -> None:
    """Partition ``p``'s last words (why it stopped), cut to ``SAID_BYTES``, for its parent.
    Control characters (a newline in a server's error message, say) become spaces: the parent
    puts the text in its own one-line error, where they could forge another line."""
    said = arena.array("said")[p]
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    data = text.encode("utf-8", "replace")[:SAID_BYTES]
    said[:] = 0
    said[: len(data)] = memoryview(data)


def read_said(arena, p: int) -> str:
    """What partition ``p`` wrote with :func:`write_said` ("" if nothing)."""
    return bytes(arena.array("said")[p]).rstrip(b"\0").decode("utf-8", "replace")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


class PartitionLoop:
    """Partition ``p``'s state: its stages, private buffers and per-slot progress."""

    def __init__(self, setup: dict, arena):
        import numpy as np

        from hogwild.config import config_from_dict
        from hogwild.model.network import build_network
        from hogwild.optim.rules import RULE_CODES
        from hogwild.partition.compute import PartitionStages, fc_update_mode
        from hogwild.partition.plan import plan_partitions

        config = config_from_dict(setup["config"], origin="<job>")
        self.setup, self.p = setup, setup["partition"]
        network = build_network(config.model, setup["n_classes"])
        self.plan = plan = plan_partitions(network, config.model.partitions)
        self.k, self.n_slots = plan.k, config.train.in_flight
        self.stages = PartitionStages(plan, self.p)
        self.ops = plan.ops[self.p]
        self.params, self.velocity = arena.array("params"), arena.array("velocity")
        self.act, self.dact = arena.array("act"), arena.array("dact")
        self.sync, self.control = arena.array("sync"), arena.array("control")
        self.floats, self.stats = arena.array("floats"), arena.array("stats")
        self.slot_label, self.slot_loss = arena.array("slot_label"), arena.array("slot_loss")
        self.slot_lr = arena.array("slot_lr")
        self.images, self.labels, self.order = (
            arena.array("images"),
            arena.array("labels"),
            arena.array("order"),
        )
        size = network.act_size
        self.aux = np.zeros((self.n_slots, size), dtype=np.int32)
        self.grad = np.zeros(network.n_params, dtype=np.float32)
        self.scratch = np.zeros(plan.scratch_floats[self.p], dtype=np.float32)
        n_seg = len(plan.segments)
        self.schedule = [("F", i) for i in range(n_seg)] + [("B", i) for i in range(n_seg)][::-1]
        self.width = slot_width(n_seg)
        self.producers = [len(b.producers) for b in plan.boundaries]
        self.contributors = [len(b.contributors) for b in plan.boundaries]
        self.is_producer = [self.p in b.producers for b in plan.boundaries]
        self.is_contributor = [self.p in b.contributors for b in plan.boundaries]
        self.out_off = int(network.ops[-1, 2])  # COL_OUT of the softmax
        self.n_classes = setup["n_classes"]
        self.mean, self.std = setup["mean"], setup["std"]
        optim = config.optim
        self.rule = RULE_CODES[optim.rule]
        self.mu = optim.momentum if optim.rule == "momentum" else 0.0
        self.wd = optim.weight_decay
        self.fc_mode, self.fc_after_pass = fc_update_mode(optim.rule)
        self.gen = [0] * self.n_slots
        self.stage = [len(self.schedule)] * self.n_slots
        self.fed, self.next_gen, self.closes = 0, 1, 0
        self.flushes = 0
        self.exchanger = self._exchanger(setup.get("home"), network, arena, config)
        self.takes = None  # the host's takes of the servers' model, with a home (host_rows)
        if self.exchanger is not None:
            from hogwild.partition.takes import Takes

            self.takes = Takes(arena, TAKEN)
        self.link = self._link(setup.get("link"))
        from hogwild.model.random import seed_kernels, worker_seed

        seed_kernels(worker_seed(config.train.seed, 0, self.p))  # this partition's dropout masks

    def _exchanger(self, home: dict | None, network, arena, config):
        """This partition's exchange of its own rows with the store's home (None: no home)."""
        if not home:
            return None
        import numpy as np

        from hogwild.store.exchange import Exchanger
        from hogwild.store.protocol import WorkerSpec
        from hogwild.store.registry import store_class

        spec = WorkerSpec(home["store"], self.p, home["values"])
        opened = store_class(home["store"]).open_home(spec, arena, network, config)
        owned = np.array(self.plan.param_rows(self.p), dtype=np.int64).reshape(-1, 2)
        return Exchanger(
            opened,
            self.params,
            arena.array("base"),
            home["n_push"],
            home["n_fetch"],
            1,
            name=f"partition {self.p}'s exchange",
            owned=owned,
        )

    def _link(self, link: dict | None):
        """What this partition sends to partitions on other hosts (None: all on this one)."""
        if not link:
            return None
        from hogwild.partition.hosts import HostGroups
        from hogwild.partition.sending import PartitionLink

        groups = HostGroups(tuple(link["addresses"]), tuple(link["group_of"]))
        roles = tuple(link.get("roles", ()))
        return PartitionLink(self.plan, groups, self.p, link["keys"] or None, roles)

    def run(self) -> None:
        from hogwild.shm.atomics import atomic_store

        atomic_store(self.control, READY + 8 * self.p, 1)
        try:
            self._loop()
        finally:
            if self.exchanger is not None:
                self.exchanger.close()
            if self.link is not None:  # before the arena closes: queued frames are views of it
                self.link.close()

    def _loop(self) -> None:
        from hogwild.shm.atomics import atomic_load
        from hogwild.shm.naming import process_alive

        idle, last_check = 0, time.monotonic()
        while True:
            progressed = self.feed() if self.p == 0 else False
            for s in range(self.n_slots):
                progressed |= self.advance(s)
            if self.exchanger is not None:
                self.flush_when_asked()
            now = time.monotonic()
            if now - last_check > 0.05:  # busy or not: a stop mid-epoch is seen at once
                last_check = now
                self.stats[self.p, STAT_BEAT] = now
                if atomic_load(self.control, STOP):
                    return
                if not process_alive(self.setup["parent_pid"], self.setup["parent_started"]):
                    return
            if progressed:
                idle = 0
                continue
            idle += 1
            if idle < 2000:  # a yield costs nothing when no other process wants the core
                os.sched_yield()
            else:
                time.sleep(0.0002 if idle < 20000 else 0.002)

    def flush_when_asked(self) -> None:
        """Push what this partition's rows hold unpushed once the parent asks (a portion's
        end: every example of it is complete), and say so."""
        from hogwild.shm.atomics import atomic_load, atomic_store

        asked = atomic_load(self.control, FLUSH)
        if asked == self.flushes:
            return
        self.exchanger.finish()
        self.flushes = asked
        self.stats[self.p, STAT_STORE_WAIT] = self.exchanger.wait_s
        atomic_store(self.control, FLUSHED + 8 * self.p, asked)

    def feed(self) -> bool:
        """Partition 0: load the next examples of the order into the slots every partition is
        done with, up to ``COUNT`` in all; carry out a close. Returns whether it loaded any."""
        from hogwild.model.passes import load_example
        from hogwild.shm.atomics import atomic_load, atomic_store

        close = atomic_load(self.control, CLOSE)
        if close != self.closes:  # feed nothing more of what was handed out
            self.closes = close
            atomic_store(self.control, COUNT, self.fed)
            atomic_store(self.control, CLOSED, close)
        count = atomic_load(self.control, COUNT)
        loaded = False
        w = self.width
        for s in range(self.n_slots):
            if self.fed >= count:
                break
            busy = atomic_load(self.sync, s * w + GEN) != 0 and (
                atomic_load(self.sync, s * w + DONE) != self.k
            )
            if busy:
                continue
            for col in range(1, w):
                atomic_store(self.sync, s * w + col, 0)
            index = self.order[self.fed % len(self.order)]
            load_example(self.images[index], self.act[s], self.mean, self.std)
            self.slot_label[s] = self.labels[index]
            self.slot_lr[s] = lr = self.rate()
            self.fed += 1
            atomic_store(self.control, FED, self.fed)
            atomic_store(self.sync, s * w + GEN, self.next_gen)  # publishes the example
            if self.link is not None:  # and to the other hosts
                self.link.load(s, self.next_gen, self.images[index], self.labels[index], lr)
            self.next_gen += 1
            loaded = True
        return loaded

    def rate(self) -> float:
        """The learning rate of the example fed next: the epoch's, or with ``optim.smooth`` on
        the line from it to the next epoch's, by how much of the epoch was fed before it."""
        from hogwild.optim.schedule import rate_within

        floats = self.floats
        if not floats[SMOOTH]:
            return float(floats[LR])
        first, n = int(floats[EPOCH_FIRST]), int(floats[EPOCH_N])
        return rate_within(float(floats[LR]), float(floats[LR_END]), self.fed - first, n)

    def advance(self, s: int) -> bool:
        """Run every stage of slot ``s``'s example that can run now."""
        from hogwild.shm.atomics import atomic_load

        base = s * self.width
        if self.stage[s] == len(self.schedule):
            g = atomic_load(self.sync, base + GEN)
            if g == 0 or g == self.gen[s]:
                return False
            self.gen[s], self.stage[s] = g, 0
        ran = False
        while self.stage[s] < len(self.schedule):
            kind, i = self.schedule[self.stage[s]]
            if kind == "F":
                if i > 0 and self.stages.runs[i]:
                    if atomic_load(self.sync, base + fwd_column(i)) != self.producers[i - 1]:
                        return ran
                self.forward(s, i)
            else:
                last = len(self.plan.segments) - 1
                if i < last:
                    if atomic_load(self.sync, base + bwd_column(i + 1)) != self.contributors[i]:
                        return ran
                self.backward(s, i)
            self.stage[s] += 1
            ran = True
        return ran

    def forward(self, s: int, i: int) -> None:
        from hogwild.model.layer_kernels import argmax, cross_entropy
        from hogwild.shm.atomics import atomic_add

        act = self.act[s : s + 1]
        self.stages.forward(i, self.params, act, self.aux[s : s + 1], self.scratch, True)
        last = len(self.plan.segments) - 1
        if i < last and self.is_producer[i]:
            atomic_add(self.sync, s * self.width + fwd_column(i + 1), 1)
            if self.link is not None:
                self.link.forward(s, self.gen[s], i + 1, self.act[s])
        if i == last and self.stages.runs[i]:  # the softmax's owner: the example's loss
            label = int(self.slot_label[s])
            self.slot_loss[s, 0] = cross_entropy(self.act[s], self.out_off, label)
            guess = argmax(self.act[s], self.out_off, self.n_classes)
            self.slot_loss[s, 1] = 1.0 if guess == label else 0.0

    def backward(self, s: int, i: int) -> None:
        from hogwild.model.update import apply_update
        from hogwild.shm.atomics import atomic_add

        last = len(self.plan.segments) - 1
        if i < last:
            self.stages.reduce(i + 1, self.dact[:, s, :])
        label = int(self.slot_label[s])
        lr = float(self.slot_lr[s])  # the rate the feeder gave this example
        self.stages.backward(
            i,
            self.params,
            self.act[s : s + 1],
            self.dact[self.p, s : s + 1],
            self.aux[s : s + 1],
            self.scratch,
            self.grad,
            label,
            self.fc_mode,
            lr,
            self.wd,
        )
        base = s * self.width
        if i > 0 and self.is_contributor[i - 1]:
            atomic_add(self.sync, base + bwd_column(i), 1)
            if self.link is not None:
                self.link.backward(s, self.gen[s], i, self.dact[self.p, s])
        if i == 0:  # sgd updated the fully connected rows in the pass; other rules do it here
            apply_update(
                self.ops,
                self.params,
                self.velocity,
                self.grad,
                lr,
                1.0,
                self.mu,
                self.wd,
                self.rule,
                self.fc_after_pass,
            )
            if atomic_add(self.sync, base + DONE, 1) == self.k - 1:  # the last one: complete
                self.stats[self.p, STAT_LOSS] += self.slot_loss[s, 0]
                self.stats[self.p, STAT_CORRECT] += self.slot_loss[s, 1]
                self.stats[self.p, STAT_EXAMPLES] += 1
            if self.link is not None:
                self.link.done(s, self.gen[s])
            if self.exchanger is not None:
                count_example(self.exchanger, self.takes)
