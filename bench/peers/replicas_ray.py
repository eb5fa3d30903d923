"""Adam's MNIST model on a Ray actor parameter server: a peer of Adam Fig. 11's race.

It stands beside ``bench/figures/adam_fig11_replicas.py``.

Ray's documented asynchronous parameter-server example ("Parameter Server", Ray examples): a
``ParameterServer`` actor holds the model and an ``optim.SGD`` at the example's settings
(learning rate 0.01; the workers' loaders give batches of 128) with ``apply_gradients(*grads)``
(one step, returns the new weights) and ``get_weights()``; ``--trainers`` ``DataWorker`` actors
each ``compute_gradients(weights)`` on the next minibatch of their own shuffled pass over MNIST;
the driver keeps one gradient in flight per worker, and as each arrives (``ray.wait``) applies it
and hands the worker the new weights. What differs from the example: the model is Project Adam's
MNIST network (conv 5x5 10 maps, maxpool 2, conv 5x5 20 maps, maxpool 2, fc 400, fc 400, 10-way
softmax, as ``hogwild/configs/adam_mnist.toml``), the data are the MNIST idx files
as :mod:`bench.peers.torch_mnist` reads them (normalised as the config does), and every process runs
one torch thread.

The driver evaluates the weights on the whole test set every ``--eval-every`` examples and stops
at the first evaluation reaching ``--target``, or after ``--bound-s`` seconds (then
``seconds_to_target`` is null and ``test_accuracy`` is the best seen). Times are measured from
``--launched-at`` (a ``time.time()`` the caller took just before starting this script; default:
this script's start), so they include starting Ray. Ray runs on this machine only (a local
instance, no dashboard) and is shut down on every exit.

Run: ``python bench/peers/replicas_ray.py --data ../shared/datasets/mnist [--trainers 2]
[--target 0.985] [--bound-s 240] [--eval-every 20000]``; prints one JSON line
``{"peer": "ray", "seconds_to_target", "test_accuracy", "examples_per_s", ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run by path (``python bench/peers/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.peers.torch_mnist import accuracy, adam_mnist_net, load_split, race_arguments
from bench.support.paths import REPO

LAUNCHED = time.time()
BATCH, LR = 128, 0.01  # Ray's parameter-server example
WAIT_S = 60.0  # the longest a gradient may take to come back


class ParameterServer:
    """Ray's example's server: the model and its SGD; a step per gradient that arrives."""

    def __init__(self, lr: float, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.model = adam_mnist_net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

    def apply_gradients(self, *gradients) -> list[np.ndarray]:
        import torch

        summed = [np.stack(layer).sum(axis=0) for layer in zip(*gradients, strict=True)]
        self.optimizer.zero_grad()
        for p, g in zip(self.model.parameters(), summed, strict=True):
            p.grad = torch.from_numpy(g)
        self.optimizer.step()
        return self.get_weights()

    def get_weights(self) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for p in self.model.parameters()]


class DataWorker:
    """Ray's example's worker: the gradients of its next minibatch at the weights it is given."""

    def __init__(self, data: str, batch: int, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.images, self.labels = load_split(data, "train")
        self.model = adam_mnist_net()
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.order, self.at = self.rng.permutation(len(self.labels)), 0

    def compute_gradients(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        import torch
        import torch.nn.functional as F

        if self.at + self.batch > len(self.order):  # a new pass, reshuffled
            self.order, self.at = self.rng.permutation(len(self.labels)), 0
        batch = self.order[self.at : self.at + self.batch]
        self.at += self.batch
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), weights, strict=True):
                p.copy_(torch.tensor(w))
        self.model.zero_grad()
        images, labels = torch.from_numpy(self.images[batch]), torch.from_numpy(self.labels[batch])
        F.cross_entropy(self.model(images), labels).backward()
        return [p.grad.numpy().copy() for p in self.model.parameters()]


def run(args) -> dict:
    """Start Ray, the server and the workers; train until the target or the bound; shut down."""
    import ray
    import torch

    torch.set_num_threads(1)
    test_images, test_labels = load_split(args.data, "test")
    evaluator = adam_mnist_net()
    # The actors call bench.peers.torch_mnist by name; a Ray worker's sys.path holds only the
    # driver's script folder and working directory, so it gets the repository root this way
    # (the local Ray started here, and its workers, inherit this environment).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    ray.init(
        num_cpus=args.trainers + 1,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=True,
    )
    try:
        server = ray.remote(num_cpus=1)(ParameterServer).remote(LR, args.seed)
        worker_class = ray.remote(num_cpus=1)(DataWorker)
        workers = [
            worker_class.remote(args.data, BATCH, args.seed + rank + 1)
            for rank in range(args.trainers)
        ]
        deadline = args.launched_at + args.bound_s
        weights = server.get_weights.remote()
        in_flight = {worker.compute_gradients.remote(weights): worker for worker in workers}
        evaluations, examples, next_eval, reached, first_step = [], 0, args.eval_every, None, None
        while reached is None and time.time() < deadline:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=WAIT_S)
            if not ready:
                raise RuntimeError(f"no gradient came back within {WAIT_S:.0f} s")
            worker = in_flight.pop(ready[0])
            weights = server.apply_gradients.remote(ready[0])
            in_flight[worker.compute_gradients.remote(weights)] = worker
            examples += BATCH
            first_step = first_step or time.time()
            if examples >= next_eval:
                next_eval = examples + args.eval_every
                with torch.no_grad():
                    for p, w in zip(evaluator.parameters(), ray.get(weights), strict=True):
                        p.copy_(torch.tensor(w))
                acc = accuracy(evaluator, test_images, test_labels)
                now = time.time() - args.launched_at
                evaluations.append({"seconds": now, "examples": examples, "accuracy": acc})
                if acc >= args.target:
                    reached = now
        trained_s = time.time() - (first_step or time.time())
    finally:
        ray.shutdown()
    best = max((e["accuracy"] for e in evaluations), default=None)
    return {
        "peer": "ray",
        "seconds_to_target": reached,
        "test_accuracy": evaluations[-1]["accuracy"] if reached else best,
        "examples_per_s": examples / trained_s if trained_s else 0.0,
        "examples": examples,
        "target": args.target,
        "bound_s": args.bound_s,
        "trainers": args.trainers,
        "batch": BATCH,
        "lr": LR,
        "optimizer": f"SGD(lr={LR}) in the ParameterServer actor, asynchronous",
        "eval_every": args.eval_every,
        "evaluations": evaluations,
        "ray": ray.__version__,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    args = race_arguments(__doc__, LAUNCHED, argv)
    try:
        record = run(args)
    except RuntimeError as exc:
        print(f"peer_replicas_ray: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
