"""Processes that call no kernel load neither numba nor SciPy.

Loading numba (and SciPy's BLAS with it) is a large part of a process's start-up, paid before any
work: a cost the processes that compute nothing with a kernel must not pay. One child process runs,
in turn, the start path of each such process far enough to have imported what it runs: the command
line's parser (every subcommand, the plugins' included) and ``hogwild config show``, ``hogwild
info``, the modules of ``hogwild cluster status``, ``hogwild ps status`` and ``hogwild plot``, a
data server of MNIST idx files without augmentation (loaded, started on loopback, stopped), and the
cluster's driver (its modules, its data, its plan, and the plugins it opens at start: the launcher,
the parameter servers' store, controller and server groups), and the modules of a replica and of
``hogwild train``'s parent (which load the kernels only to compile them when numba's cache lacks
them, or for a store's epoch-end merge). After each, the child says whether numba or SciPy is loaded
and, if so, the chain of imports that first brought it. The processes that do call kernels
(parameter servers, the workers of a replica or of ``hogwild train``, a data server that augments or
reads an LMDB cache, ``hogwild eval``, the driver once it evaluates) are not checked here, except
that a data server which augments still loads its kernel at start (last, once the others are
checked).
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import io, json, sys, traceback, contextlib

first = {}  # numba / scipy -> the hogwild frames of the import that first asked for it


class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ("numba", "scipy") and top not in first:
            first[top] = [
                f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                for f in traceback.extract_stack()
                if ("/hogwild/" in f.filename or "/plugins/" in f.filename)
            ]
        return None


sys.meta_path.insert(0, Watch())
mnist, steps = sys.argv[1], []


def step(name, run):
    with contextlib.redirect_stdout(io.StringIO()):
        run()
    loaded = {m: first.get(m, []) for m in ("numba", "scipy") if m in sys.modules}
    steps.append({"step": name, "loaded": loaded})


def cli(*argv):
    from hogwild.cli import main

    status = main(list(argv))
    assert status == 0, (argv, status)


def data_server(augment=None):
    from hogwild.data.resident import Delivery, load_source
    from hogwild.data.server import DataServer
    from hogwild.net.address import parse_address

    delivery = Delivery(load_source(mnist), augment=augment)
    server = DataServer(delivery, parse_address("127.0.0.1:0"))
    server.start()
    server.stop()


def augmenting_data_server():
    from hogwild.data.augment import AugmentSpec

    data_server(AugmentSpec(rotate=10))
    from hogwild.data.warp import warp_kernel

    assert warp_kernel.signatures, "an augmenting data server started without its warp kernel"


def driver():
    from hogwild.cli_flags import apply_flags
    from hogwild.cluster.driver import ClusterDriver
    from hogwild.config import load_config
    from hogwild.data.plan import load_data, with_source

    overrides = {"cluster.replicas": "1", "output.progress": "false"}
    config = apply_flags(load_config(None), {}, overrides)
    data = load_data(config, mnist)
    ClusterDriver(with_source(config, data), data)
    from hogwild.cluster.launcher import launcher_class
    from hogwild.entry_points import load
    from hogwild.store.registry import store_class

    launcher_class("local"), store_class("ps")
    load("hogwild.controllers", "etcd"), load("hogwild.server_groups", "ps")


step("hogwild config show (the parser, plugins' commands included)", lambda: cli("config", "show"))
step("hogwild info", lambda: cli("info"))
step("hogwild cluster status", lambda: __import__("hogwild.cluster.status"))
step("hogwild ps status", lambda: __import__("hogwild.net.channel"))
step("hogwild plot", lambda: __import__("hogwild.training.curves"))
step("hogwild data serve (idx files, no augmentation)", data_server)
step("hogwild cluster (the driver, until it evaluates)", driver)
step(
    "a replica and hogwild train's parent, until they compile (their workers run the kernels)",
    lambda: (__import__("hogwild.cluster.replica"), __import__("hogwild.training.api")),
)
step("hogwild data serve (augmenting: runs the warp kernel)", augmenting_data_server)
print(json.dumps(steps))
"""


def test_processes_that_call_no_kernel_load_neither_numba_nor_scipy(mnist_dir):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(mnist_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    *without_kernels, augmenting = steps
    assert len(without_kernels) == 8 and "numba" in augmenting["loaded"]
    loaded = [s for s in without_kernels if s["loaded"]]
    assert loaded == [], "\n".join(
        f"{s['step']}: {m} imported through {' <- '.join(reversed(chain))}"
        for s in loaded[:1]
        for m, chain in s["loaded"].items()
    )
