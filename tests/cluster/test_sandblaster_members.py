"""A worker group's replicas as processes of their own, reaching the board as messages.

The same harness as tests/cluster/test_sandblaster.py (two real parameter servers, four shards,
L2-regularised softmax regression on the first 400 MNIST images, the coordinator's L-BFGS through
shard operations), with the replicas as ``hogwild cluster member`` processes started as a
launcher starts them (:func:`hogwild.cluster.roles.spawn_role`), each with its own parameter-server
client, talking to the coordinator's :class:`~hogwild_plugins.ps.sandblaster.board_service.
BoardService` over a real control server, and learning which examples make the batch from it:

* Sandblaster: the steps are ``torch.optim.LBFGS``'s, as with replica threads in one process;
* AllReduce's synchronous SGD (a new batch of examples each step on one board, a step
  ``axpy(-lr, grad, params)``): the parameters equal those of the same steps taken with replica
  threads on the in-process board, step for step;
* a new board (the next mini-batch) makes every member join again and compute on its examples.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import deque
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.sandblaster import (
    BatchObjective,
    Board,
    PortionScheduler,
    SandblasterLBFGS,
    ShardVectors,
)
from hogwild_plugins.ps.sandblaster.batch import replica_vector
from hogwild_plugins.ps.sandblaster.board_service import BoardService
from hogwild_plugins.ps.sandblaster.group import LBFGSGroup
from hogwild_plugins.ps.sandblaster.lbfgs import PARAMS
from hogwild_plugins.ps.sandblaster.replica import Examples, PortionGradient, SandblasterReplica
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.cluster.roles import spawn_role, tee_stderr
from hogwild.config import config_from_dict
from hogwild.data.mnist import MnistData, load_mnist
from hogwild.model.loops import LABEL_DTYPE
from hogwild.model.network import build_network
from hogwild.net.control import ControlServer
from hogwild.net.ports import free_ports
from hogwild.training.job import epoch_permutation
from tests.cluster.test_sandblaster import (
    L2,
    MEAN,
    N_EXAMPLES,
    PORTION,
    STD,
    close,
    fixed_step,
    params_of,
)
from tests.unit.test_sandblaster_lbfgs import SoftmaxRegression, reference_lbfgs

pytest.importorskip("torch")

JOB = "sbm"
LAYERS = [{"type": "fc", "units": 10}, {"type": "softmax"}]


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    data = load_mnist(mnist_dir, download=False, progress=False)
    images = np.ascontiguousarray(data.train_images[:N_EXAMPLES].reshape(N_EXAMPLES, -1))
    return images, data.train_labels[:N_EXAMPLES].astype(LABEL_DTYPE)


@pytest.fixture(scope="module")
def network():
    model = {"input": [1, 28, 28], "layers": LAYERS}
    return build_network(config_from_dict({"model": model}).model)


def regression(network, images, labels) -> SoftmaxRegression:
    """The float64 oracle: regularised softmax regression on ``images``."""
    X = (images / 255.0 - MEAN) / STD
    bias = network.param("fc1.bias").offset
    return SoftmaxRegression(X, labels, 10, L2, bias=bias, n_params=network.n_params)


@pytest.fixture(scope="module")
def oracle(mnist, network) -> SoftmaxRegression:
    return regression(network, *mnist)


@contextmanager
def servers_and_client(network):
    servers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    with ExitStack() as stack:
        for i in range(2):
            stack.enter_context(
                local_server(
                    ModelGeometry(network.n_params),
                    job=JOB,
                    servers=servers,
                    index=i,
                    shard_kib=8,
                    threads=1,
                )  # fmt: skip
            )
        client = stack.enter_context(PSClient(servers, JOB, client_id=1))
        assert client.layout.n_shards == 4
        yield servers, client


@contextmanager
def spawn_members(config, n, coordinator, tmp_path, mnist_dir, closed):
    """``n`` member processes of group 0 of the job ``config``, talking to ``coordinator`` (a
    control server's address), yielded once each is ready; ``closed()`` (the board service
    closed) lets them leave by themselves, then they must have (a member killed by the test exits
    by SIGKILL)."""
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(config.to_dict()))
    processes, logs = [], []
    try:
        for i in range(n):
            argv = ("cluster", "--config", str(config_file), "--data", str(mnist_dir), "member",
                    "--index", str(i), "--coordinator", coordinator)  # fmt: skip
            process = spawn_role(argv)
            ready, lines = threading.Event(), deque(maxlen=20)
            reader = tee_stderr(process, tmp_path / f"member-{i}.log", lines,
                                lambda _a, ready=ready: ready.set())  # fmt: skip
            processes.append((process, reader, lines))
            logs.append(ready)
        for (process, _, lines), ready in zip(processes, logs, strict=True):
            deadline = time.monotonic() + 120
            while not ready.wait(0.05):
                assert process.poll() is None and time.monotonic() < deadline, list(lines)
        yield [process for process, _, _ in processes]
        closed()  # their next request is answered stop: they leave by themselves
        for process, _, lines in processes:
            assert process.wait(30) in (0, -signal.SIGKILL), list(lines)
    finally:
        closed()
        for process, reader, _ in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            reader.join(5)
            process.stderr.close()


@contextmanager
def member_processes(servers, n, tmp_path, mnist_dir, silence_s=60.0):
    """``n`` member processes of group 0 and the coordinator's board service they talk to (a
    control server of the job), yielded with the processes."""
    service = BoardService(range(n), silence_s=silence_s)
    control = ControlServer("127.0.0.1:0", JOB, service.answer)
    address = control.start()
    config = config_from_dict({
        "model": {"input": [1, 28, 28], "layers": LAYERS},
        "data": {"mean": MEAN, "std": STD},
        "ps": {"servers": servers, "job": JOB},
        "cluster": {"framework": "sandblaster", "replicas": 1, "workers_per_replica": n},
    })  # fmt: skip
    try:
        with spawn_members(config, n, address, tmp_path, mnist_dir, service.close) as processes:
            yield service, processes
    finally:
        control.stop()


def test_member_processes_take_the_steps_of_torch_lbfgs(mnist, network, oracle, tmp_path,
                                                        mnist_dir):  # fmt: skip
    """Two member processes, full batches: torch's steps, as replica threads take them."""
    iterations = 4
    x0, options = fixed_step(oracle)
    want = oracle.torch_steps(x0, iterations, history=options.history, lr=1.0)
    with servers_and_client(network) as (servers, client):
        with member_processes(servers, 2, tmp_path, mnist_dir) as (service, _):
            board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
            service.install(board, np.arange(N_EXAMPLES), PORTION)
            objective = BatchObjective(ShardVectors(client), board, N_EXAMPLES, PORTION, l2=L2)
            lbfgs = SandblasterLBFGS(ShardVectors(client), objective, options)
            for k, b in enumerate(want, 1):
                it = lbfgs.step()
                assert it.stop is None and it.evaluations == 1
                assert it.loss == pytest.approx(oracle(b)[0], rel=1e-4), k
                got = params_of(client)
                assert close(got, b), (k, float(np.abs(got - b).max()))
            stats = board.scheduler.stats
            assert stats.portions == (iterations + 1) * 16  # each portion's gradient once
            # both joined; which of them answers each portion first is the machine's timing (on
            # a loaded host one member answered all 80), so the sum is what is checked
            assert sorted(service.joined) == [0, 1]
            assert sum(service.kept.values()) == stats.portions
            assert all(ShardVectors(client).amax(replica_vector(m)) == 0.0 for m in (0, 1))
            # a new board (the next mini-batch: the first half of the examples) for the same
            # members: they join again, take its examples from the service, and the gradient
            # is the half batch's
            half = np.arange(N_EXAMPLES // 2)
            board.close()
            board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
            service.install(board, half, PORTION)
            objective = BatchObjective(ShardVectors(client), board, len(half), PORTION, l2=L2)
            loss = objective()
            assert board.scheduler.stats.portions == 8 and service.generation == 2
            x = params_of(client).astype(np.float64)
            images, labels = mnist
            on_half = regression(network, images[: len(half)], labels[: len(half)])
            assert loss == pytest.approx(on_half(x)[0], rel=1e-4)


def sgd_steps(client, board_of, batches, lr: float) -> list[np.ndarray]:
    """AllReduce's group: on one board, a batch pass per batch (``board_of(batch)`` sets its
    examples before it begins), then ``axpy(-lr, grad, params)``; the parameters after each."""
    v = ShardVectors(client)
    board, set_examples = board_of
    objective = BatchObjective(v, board, len(batches[0]), PORTION, l2=L2, grad="sgd.grad0")
    out = []
    for batch in batches:
        set_examples(batch)
        objective.n_examples, objective.n_portions = len(batch), -(-len(batch) // PORTION)
        objective()
        v.axpy(-lr, "sgd.grad0", PARAMS)
        out.append(params_of(client))
    return out


def test_allreduce_with_member_processes_equals_its_one_process_run(mnist, network, tmp_path,
                                                                    mnist_dir):  # fmt: skip
    """Synchronous SGD, four batches of 100 in the epoch's shuffled order, two replicas: the
    parameters after every step are those of the same steps with replica threads."""
    images, labels = mnist
    order = np.random.default_rng(7).permutation(N_EXAMPLES)
    batches = [order[i : i + 100] for i in range(0, N_EXAMPLES, 100)]
    lr, start = 0.5, np.random.default_rng(3).normal(0, 0.01, network.n_params)
    start = start.astype(np.float32)

    # one process: replica threads on the in-process board
    with servers_and_client(network) as (servers, client):
        client.assign(start)
        board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
        workers, threads = [], []
        for i in range(2):
            rc = PSClient(servers, JOB, client_id=10 + i)
            examples = Examples(images, labels, batches[0], PORTION, MEAN, STD)
            workers.append(SandblasterReplica(i, rc, board, PortionGradient(network, examples)))
            threads.append(threading.Thread(target=workers[-1].run, daemon=True))
            threads[-1].start()

        def use(batch):
            for w in workers:
                w.gradient.examples = Examples(images, labels, batch, PORTION, MEAN, STD)

        try:
            threaded = sgd_steps(client, (board, use), batches, lr)
        finally:
            board.close()
            for t, w in zip(threads, workers, strict=True):
                t.join(10)
                w.client.close()

    # member processes through the board service
    with servers_and_client(network) as (servers, client):
        client.assign(start)
        with member_processes(servers, 2, tmp_path, mnist_dir) as (service, _):
            board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
            service.install(board, batches[0], PORTION)
            processes = sgd_steps(
                client, (board, lambda b: service.set_examples(b, PORTION)), batches, lr
            )
            # each portion's gradient counted once; both members asked for work (which one
            # computes how much is the machine's business)
            assert sum(service.kept.values()) == len(batches) * 4 and sorted(service.seen) == [0, 1]

    assert len(threaded) == len(processes) == len(batches)
    for k, (a, b) in enumerate(zip(threaded, processes, strict=True), 1):
        # the same float32 terms, summed in an order the pushes' timing decides
        assert close(a, b, rel=1e-5), (k, float(np.abs(a - b).max()))
    assert not close(threaded[0], start) and not close(threaded[-1], threaded[0])


def test_a_member_process_killed_mid_run_is_taken_for_gone_and_the_steps_do_not_change(
    mnist, network, oracle, tmp_path, mnist_dir
):
    """Member 1 is SIGKILLed after the first step (wherever it was: computing, pushing, idle):
    member 0 takes its stripe's portions, the steps stay torch's, and once it has been silent
    for ``silence_s`` it leaves the board (whatever it had pushed half-way zeroed, its
    outstanding portions computed again)."""
    iterations = 4
    x0, options = fixed_step(oracle)
    want = oracle.torch_steps(x0, iterations, history=options.history, lr=1.0)
    with servers_and_client(network) as (servers, client):
        with member_processes(servers, 2, tmp_path, mnist_dir, silence_s=2.0) as (service, ps):
            board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
            service.install(board, np.arange(N_EXAMPLES), PORTION)
            objective = BatchObjective(ShardVectors(client), board, N_EXAMPLES, PORTION, l2=L2)
            lbfgs = SandblasterLBFGS(ShardVectors(client), objective, options)
            for k, b in enumerate(want, 1):
                if k == 2:
                    ps[1].send_signal(signal.SIGKILL)
                lbfgs.step()
                got = params_of(client)
                assert close(got, b), (k, float(np.abs(got - b).max()))
            deadline = time.monotonic() + 30  # member 0, asking for work, lets it be seen
            while not service.reaped and time.monotonic() < deadline:
                time.sleep(0.1)
            assert service.reaped == 1 and sorted(board.scheduler.replicas) == [0]
            assert any("silent for more than 2 s" in f for f in board.failures)
            assert ps[1].wait(10) == -signal.SIGKILL


def test_the_warm_start_takes_sgd_steps_then_hands_their_parameters_to_lbfgs(
    mnist, oracle, tmp_path, mnist_dir
):
    """A worker-group role (its members as processes) with ``cluster.lbfgs_warm_start =
    200`` trains its first share of 400: two SGD steps of 100 (``axpy(-lr, grad, params)`` on the
    shards), then L-BFGS with no history from where they left the parameters, two iterations on
    the other 200. The float64 oracle takes the same SGD steps and the reference L-BFGS from the
    point they reach."""
    images, labels = mnist
    lr, warm, batch = 0.5, 200, 100
    servers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    config = config_from_dict({
        "model": {"input": [1, 28, 28], "layers": [{"type": "fc", "units": 10},
                                                   {"type": "softmax"}]},
        "train": {"batch": batch, "seed": 3, "stall_s": 20.0},
        "optim": {"lr": lr, "schedule": "constant", "weight_decay": L2},
        "cluster": {"framework": "sandblaster", "workers_per_group": 2, "lbfgs_batch": 200,
                    "lbfgs_iterations": 2, "lbfgs_warm_start": warm},
        "data": {"mean": MEAN, "std": STD},
        "ps": {"servers": servers, "job": "sb"},
    })  # fmt: skip
    square = images.reshape(-1, 28, 28)
    data = MnistData(square, labels.astype(np.uint8), square[:10], labels[:10], "<memory>")
    order = epoch_permutation(3, 0, N_EXAMPLES)
    x = np.zeros(oracle.n_params)  # the servers start at zero
    for first in range(0, warm, batch):  # SGD, in the epoch's order
        x = x - lr * part(oracle, order[first : first + batch])(x)[1]
    rest = part(oracle, np.sort(order[warm:]))  # L-BFGS's batch, from the SGD's end point
    want, losses, _ = reference_lbfgs(rest, x, 2, history=10, lr=1.0, line_search="armijo")
    with ExitStack() as stack:
        geometry = ModelGeometry(build_network(config.model).n_params)
        for i in range(2):
            stack.enter_context(local_server(geometry, job="sb", servers=servers, index=i,
                                             shard_kib=8, threads=1))  # fmt: skip
        group = LBFGSGroup("sandblaster", config, data, 0)
        stack.callback(group.release)
        group.start()  # as the role does before it says ready: its client, its board service
        control = ControlServer("127.0.0.1:0", "sb", group.answer)  # the role's control channel
        stack.callback(control.stop)
        coordinator = control.start()
        stack.enter_context(
            spawn_members(
                config, group.workers, coordinator, tmp_path, mnist_dir, group.service.close
            )
        )
        assert [group.warm_examples(0, s, 200) for s in (0, 100, 200)] == [200, 100, 0]
        assert group.warm_examples(1, 0, N_EXAMPLES) == 0  # the job's first examples only
        group.commands.put(SimpleNamespace(epoch=0, start=0, stop=N_EXAMPLES, lr=lr))
        group.step()
        got = params_of(group.clients[0])
        status = group.status()
    counters = status["sandblaster"]
    assert (counters["warm_steps"], counters["iterations"]) == (2, 2)
    assert status["state"] == "done" and status["examples"] == N_EXAMPLES
    assert close(got, want[-1], rel=1e-4), float(np.abs(got - want[-1]).max())
    assert counters["loss"] == pytest.approx(losses[-1], rel=5e-4)


def part(oracle: SoftmaxRegression, rows) -> SoftmaxRegression:
    """The oracle's objective on ``rows`` of its examples (their mean loss)."""
    return SoftmaxRegression(oracle.X[rows], oracle.labels[rows], oracle.classes, oracle.l2,
                             bias=oracle.bias, n_params=oracle.n_params)  # fmt: skip
