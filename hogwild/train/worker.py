"""The worker process: pin, attach the arena, allocate a training context once, then train.

A worker is started by the trainer with spawn or forkserver (never a bare fork: numba and the
arena's mappings are not fork-safe). It pins itself to its core *before* allocating its training
context, so first touch places the context on that core's NUMA node, loads the kernels the parent
already compiled (numba's on-disk cache), and then serves the parent's commands:

* ``("train", epoch, lr, start, stop, seed)``: train on ``order[start:stop]`` of the shared
  permutation, writing every update straight into the shared parameters; stop early if the parent
  closes the epoch. Reports ``("trained", worker, epoch, examples, loss, correct)``.
* ``("eval", start, stop)``: loss and accuracy of test examples ``start:stop`` with the current
  shared weights. Reports ``("evaluated", worker, examples, loss, correct)``.
* ``("stop",)``: detach and exit.

The worker ignores SIGINT (the parent owns shutdown) and asks the kernel for SIGTERM when its
parent dies; an orphaned worker then removes the job's arena itself, so a SIGKILLed parent leaves
neither processes nor segments behind.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import traceback

PR_SET_PDEATHSIG = 1
COMMAND_POLL_S = 0.5


def worker_main(
    worker: int,
    arena_name: str,
    layout_json: str,
    config: dict,
    placement,
    commands,
    results,
) -> None:
    """Entry point of a worker process (the target the trainer starts)."""
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _die_with_parent()
    arena = None
    try:
        from hogwild.numa.pinning import pin_worker

        pin_worker(placement)  # before the context is allocated: first touch places it
        # Imported only now: numba loads after the process is pinned and its environment is set.
        from hogwild.config import config_from_dict
        from hogwild.model.network import build_network
        from hogwild.shm.arena import Arena, ArenaLayout
        from hogwild.train.context import TrainingContext

        job = config_from_dict(config, origin="<job>")
        network = build_network(job.model)
        arena = Arena.attach(arena_name, ArenaLayout.from_json(layout_json))
        context = TrainingContext.allocate(network, job.train.batch)
        results.put(("ready", worker, os.getpid(), context.nbytes))
        _serve(worker, job, network, arena, context, commands, results, parent)
    except SystemExit:
        pass
    except BaseException:  # report anything else to the parent rather than dying silently
        results.put(("error", worker, traceback.format_exc()))
    finally:
        if arena is not None:
            orphaned = os.getppid() != parent
            arena.close()
            if orphaned:
                from hogwild.shm.sweeper import unlink_segment

                unlink_segment(arena_name)


def _serve(worker, job, network, arena, context, commands, results, parent) -> None:
    from hogwild.model.engine import evaluate_range, train_chunk
    from hogwild.model.random import seed_kernels
    from hogwild.optim.rules import RULE_CODES
    from hogwild.train.job import CONTROL_EPOCH, STAT_CORRECT, STAT_EXAMPLES, STAT_LOSS

    params, velocity = arena.array("params"), arena.array("velocity")
    control, stats = arena.array("control"), arena.array("stats")
    order = arena.array("order")
    train_images, train_labels = arena.array("train_images"), arena.array("train_labels")
    test_images, test_labels = arena.array("test_images"), arena.array("test_labels")
    optim, train, data = job.optim, job.train, job.data
    rule = RULE_CODES[optim.rule]
    mu = optim.momentum if optim.rule == "momentum" else 0.0
    my_stats = stats[worker]
    while True:
        try:
            command = commands.get(timeout=COMMAND_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        kind = command[0]
        if kind == "stop":
            return
        if kind == "train":
            _, epoch, lr, start, stop, seed = command
            seed_kernels(seed)
            done, loss, correct = 0, 0.0, 0
            for lo in range(start, stop, train.chunk):
                if control[CONTROL_EPOCH] != epoch or os.getppid() != parent:
                    break
                hi = min(lo + train.chunk, stop)
                chunk_loss, chunk_correct = train_chunk(
                    network.ops,
                    params,
                    velocity,
                    context.grad,
                    context.act,
                    context.dact,
                    context.aux,
                    context.scratch,
                    context.targets,
                    train_images,
                    train_labels,
                    order,
                    lo,
                    hi,
                    train.batch,
                    lr,
                    mu,
                    optim.weight_decay,
                    rule,
                    data.mean,
                    data.std,
                )
                done += hi - lo
                loss += chunk_loss
                correct += chunk_correct
                my_stats[STAT_EXAMPLES] += hi - lo
                my_stats[STAT_LOSS] += chunk_loss
                my_stats[STAT_CORRECT] += chunk_correct
            results.put(("trained", worker, epoch, done, loss, correct))
        elif kind == "eval":
            _, start, stop = command
            loss, correct = evaluate_range(
                network.ops,
                params,
                context.act,
                context.aux,
                context.scratch,
                test_images,
                test_labels,
                start,
                stop,
                data.mean,
                data.std,
            )
            results.put(("evaluated", worker, stop - start, loss, correct))


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent exits (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the worker still notices the parent's death when it polls
