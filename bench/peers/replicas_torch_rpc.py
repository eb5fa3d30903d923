"""Adam's MNIST model on PyTorch's RPC parameter server: a peer of Adam Fig. 11's race.

It stands beside ``bench/figures/adam_fig11_replicas.py``.

The pattern of PyTorch's parameter-server example (``pytorch/examples``,
``distributed/rpc/parameter_server``, and the tutorial "Implementing a Parameter Server Using
Distributed RPC Framework"): rank ``ps`` holds the model and an ``optim.SGD`` at the example's
settings (batch 32, learning rate 0.03); each of ``--trainers`` trainer ranks fetches the
parameters (``rpc_sync(get_weights)``), computes the gradients of one minibatch of its own shuffled
pass over MNIST, and sends them with ``rpc_async(apply_gradients)``; the server applies them under
a lock as they come (asynchronous SGD). What differs from the example: the model is Project
Adam's MNIST network (conv 5x5 10 maps, maxpool 2, conv 5x5 20 maps, maxpool 2, fc 400, fc 400,
10-way softmax: 756,000 connections, as ``hogwild/configs/adam_mnist.toml``), the data are the MNIST
idx files as :mod:`bench.peers.torch_mnist` reads them (normalised as the config does), and every
process runs one torch thread.

The server rank evaluates a snapshot of the weights on the whole test set every ``--eval-every``
examples (training goes on meanwhile) and stops the trainers at the first evaluation reaching
``--target``, or after ``--bound-s`` seconds (then ``seconds_to_target`` is null and
``test_accuracy`` is the best seen). Times are measured from ``--launched-at`` (a ``time.time()``
the caller took just before starting this script; default: this script's start).

Run: ``python bench/peers/replicas_torch_rpc.py --data ../shared/datasets/mnist
[--trainers 2] [--target 0.985] [--bound-s 240] [--eval-every 20000]``; prints one JSON line
``{"peer": "torch_rpc", "seconds_to_target", "test_accuracy", "examples_per_s", ...}``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

if not __package__:  # run by path (``python bench/peers/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.peers.torch_mnist import accuracy, adam_mnist_net, load_split, race_arguments

LAUNCHED = time.time()
BATCH, LR = 32, 0.03  # PyTorch's RPC parameter-server example
RPC_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 60.0


# -- the server rank ------------------------------------------------------------------------------


class _Server:
    """The model, its optimiser and the counters, in the server rank (module state for RPC)."""

    def __init__(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.model = adam_mnist_net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.lock = threading.Lock()
        self.examples = 0
        self.first_step: float | None = None  # time.time() of the first update
        self.stop = False


_server: _Server | None = None


def get_weights():
    """RPC (on the server): the current parameters, copied."""
    with _server.lock:
        return [p.detach().clone() for p in _server.model.parameters()]


def apply_gradients(gradients, examples: int) -> bool:
    """RPC (on the server): one SGD step with a trainer's gradients; True once told to stop."""
    with _server.lock:
        for p, g in zip(_server.model.parameters(), gradients, strict=True):
            p.grad = g
        _server.optimizer.step()
        _server.examples += examples
        if _server.first_step is None:
            _server.first_step = time.time()
        return _server.stop


def _serve(args, out) -> None:
    """Rank 0: hold the model, evaluate every ``eval_every`` examples, stop the trainers."""
    import torch

    test_images, test_labels = load_split(args.data, "test")
    evaluator = adam_mnist_net()
    started = time.time()
    deadline = args.launched_at + args.bound_s
    evaluations, next_eval, reached = [], args.eval_every, None
    while reached is None and time.time() < deadline:
        if _server.examples < next_eval:
            time.sleep(0.05)
            continue
        with _server.lock:
            seen = _server.examples
            evaluator.load_state_dict(_server.model.state_dict())
        next_eval = seen + args.eval_every
        acc = accuracy(evaluator, test_images, test_labels)
        now = time.time()
        evaluations.append({"seconds": now - args.launched_at, "examples": seen, "accuracy": acc})
        if acc >= args.target:
            reached = now - args.launched_at
    with _server.lock:
        _server.stop = True
        examples = _server.examples
        trained_s = time.time() - (_server.first_step or started)
    best = max((e["accuracy"] for e in evaluations), default=None)
    out.put(
        {
            "peer": "torch_rpc",
            "seconds_to_target": reached,
            "test_accuracy": evaluations[-1]["accuracy"] if reached else best,
            "examples_per_s": examples / trained_s if trained_s else 0.0,
            "examples": examples,
            "target": args.target,
            "bound_s": args.bound_s,
            "trainers": args.trainers,
            "batch": BATCH,
            "lr": LR,
            "optimizer": f"SGD(lr={LR}) on the server, asynchronous",
            "eval_every": args.eval_every,
            "evaluations": evaluations,
            "torch": torch.__version__,
        }
    )


# -- the trainer ranks ----------------------------------------------------------------------------


def _train(rank: int, args) -> None:
    """A trainer: fetch the weights, compute one minibatch's gradients, send them; until told."""
    import torch
    import torch.nn.functional as F

    images, labels = load_split(args.data, "train")
    model = adam_mnist_net()
    rng = np.random.default_rng(args.seed + rank)
    deadline = time.time() + args.bound_s + RPC_TIMEOUT_S
    pending = None
    while time.time() < deadline:
        order = rng.permutation(len(labels))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            if pending is not None and pending.wait():  # the server said stop
                return
            weights = torch.distributed.rpc.rpc_sync("ps", get_weights, timeout=RPC_TIMEOUT_S)
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights, strict=True):
                    p.copy_(w)
            batch = order[start : start + BATCH]
            model.zero_grad()
            loss = F.cross_entropy(
                model(torch.from_numpy(images[batch])), torch.from_numpy(labels[batch])
            )
            loss.backward()
            gradients = [p.grad for p in model.parameters()]
            pending = torch.distributed.rpc.rpc_async(
                "ps", apply_gradients, args=(gradients, BATCH), timeout=RPC_TIMEOUT_S
            )
            if time.time() > deadline:
                break
    if pending is not None:
        pending.wait()


def _rank(rank: int, port: int, args, out) -> None:
    """One process of the job: the server (rank 0) or a trainer."""
    import torch
    import torch.distributed.rpc as rpc

    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=8, init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=RPC_TIMEOUT_S
    )
    name = "ps" if rank == 0 else f"trainer{rank}"
    if rank == 0:  # before init_rpc: a trainer's first call may come at once
        global _server
        _server = _Server(args.seed)
    rpc.init_rpc(name, rank=rank, world_size=args.trainers + 1, rpc_backend_options=options)
    try:
        if rank == 0:
            _serve(args, out)
        else:
            _train(rank, args)
    except BaseException as exc:  # tell the parent rather than leave it waiting
        out.put({"error": f"{name}: {type(exc).__name__}: {exc}"})
        raise
    finally:
        rpc.shutdown()  # waits for every rank's outstanding work


def run(args) -> dict:
    """Start the server and trainer ranks, wait (bounded) for the server's answer, stop them."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The ranks come from a fork server that imported torch (and this module) once: three spawned
    # ranks each imported both, a second and a half of CPU apiece before any training. A rank is
    # still a fresh process of its own (forked from a server that started no thread and holds no
    # model), as a spawned one was, and the race's clock starts before the server does.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "torch.distributed.rpc"])
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(rank, port, args, out), daemon=True)
        for rank in range(args.trainers + 1)
    ]
    try:
        for proc in procs:
            proc.start()
        deadline = time.time() + args.bound_s + 2 * RPC_TIMEOUT_S
        while True:
            try:
                answer = out.get(timeout=0.5)
                break
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank exited with code {dead[0].exitcode}") from None
                if time.time() > deadline:
                    raise RuntimeError("no answer from the server rank in time") from None
        if "error" in answer:
            raise RuntimeError(answer["error"])
        for proc in procs:
            proc.join(JOIN_TIMEOUT_S)
        return answer
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        out.close()
        out.join_thread()


def main(argv: list[str] | None = None) -> int:
    args = race_arguments(__doc__, LAUNCHED, argv)
    try:
        record = run(args)
    except RuntimeError as exc:
        print(f"peer_replicas_torch_rpc: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
