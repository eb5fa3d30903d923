"""What the processes that call no kernel cost to start, beside what loading numba would add.

A data server of idx files without augmentation, the cluster's driver up to its first evaluation,
``hogwild info`` and ``hogwild config show`` run no numba kernel, so they load neither numba nor
SciPy (``tests/proc/test_processes_without_kernels.py``). Each is started ``--repeats`` times and
its CPU seconds (user + system, from the rusage of the children this script waited for) are taken:
the data server until it says it serves, then SIGTERM; the driver as far as its plan and the plugins
it opens at start. The controls, from the same run: a bare interpreter, and one that loads the data
kernels from numba's cache as every data server did at its start (numba's import, its compiler's
target and the kernels: what each of these processes paid when it loaded numba). ``python
bench/figures/light_processes.py --repeats 10 --out bench/results/light_processes.json`` prints one
JSON line: the medians, every trial, the machine and the versions.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

TIMEOUT_S = 300.0
SERVING = re.compile(r"^hogwild data: serving ")

DRIVER = """
import sys
from hogwild.cli_flags import apply_flags
from hogwild.cluster.driver import ClusterDriver
from hogwild.cluster.launcher import launcher_class
from hogwild.config import load_config
from hogwild.data.plan import load_data, with_source
from hogwild.entry_points import load
from hogwild.store.registry import store_class

config = apply_flags(load_config(None), {}, {"cluster.replicas": "1", "output.progress": "false"})
data = load_data(config, sys.argv[1])
ClusterDriver(with_source(config, data), data)
launcher_class("local"), store_class("ps")
load("hogwild.controllers", "etcd"), load("hogwild.server_groups", "ps")
"""

NUMBA = """
from hogwild.data.feed import compile_data_kernels

compile_data_kernels()
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("HOGWILD_DATA", "mnist"),
                        help="MNIST idx files (default: $HOGWILD_DATA, or 'mnist')")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=10, help="starts of each (default 10)")
    parser.add_argument("--out", help="also write the JSON line here")
    return parser.parse_args(argv)


def cpu_of(command: list[str], until: re.Pattern | None = None) -> float:
    """CPU seconds of ``command`` (SIGTERMed once a stderr line matches ``until``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as process:  # fmt: skip
        tail = []
        for line in process.stderr:
            tail = [*tail[-20:], line]
            if until is not None and until.match(line):
                process.send_signal(signal.SIGTERM)
        code = process.wait(TIMEOUT_S)
    if code not in (0, 143 if until is not None else 0):
        raise RuntimeError(f"{' '.join(command[:4])}... exited with {code}: {''.join(tail)}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(args) -> dict:
    python, cli = sys.executable, [sys.executable, "-m", "hogwild.cli"]
    kinds = {
        "data_server": (
            [*cli, "data", "serve", args.data, "--bind", "127.0.0.1", "--port", "0"],
            SERVING,
        ),
        "driver_start": ([python, "-c", DRIVER, args.data], None),
        "info": ([*cli, "info"], None),
        "config_show": ([*cli, "config", "show"], None),
        "control_python": ([python, "-c", "pass"], None),
        "control_numba": ([python, "-c", NUMBA], None),
    }
    cpu_of(kinds["control_numba"][0])  # the kernels into numba's cache: later starts load them
    trials: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.repeats):  # kinds interleaved: a load that changes hits them alike
        for kind, (command, until) in kinds.items():
            trials[kind].append(round(cpu_of(command, until), 3))
    medians = {kind: statistics.median(values) for kind, values in trials.items()}
    numba_cost = medians["control_numba"] - medians["control_python"]
    return {"cpu_s": medians, "numba_and_data_kernels_s": numba_cost, "trials": trials}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return measured_and_emitted(
        __file__,
        argv,
        lambda: {"figure": "light_processes", "repeats": args.repeats, **measure(args)},
        args.out,
    )


if __name__ == "__main__":
    raise SystemExit(main())
