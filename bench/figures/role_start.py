"""What starting a cluster job's roles costs: forked from the job's role server, against spawn.

``cluster.start_method = "forkserver"`` forks every role of a local cluster job (parameter
servers, data servers, replicas) from one server that imported numba, ZeroMQ and the roles'
modules once (:mod:`hogwild.cluster.role_server`); ``"spawn"``, the control, starts each role as
a fresh interpreter through the launcher's shim. The job is small (``--subset`` examples, one
epoch) so that starting and stopping its processes is most of what is measured.

The ``roles`` scenario measures the start alone: ``--roles`` data servers started side by side
by the local launcher (:class:`hogwild.cluster.local.LocalLauncher`, as a driver starts them),
each waited for until it serves, then all stopped, in a process of its own per trial.

The measure is CPU seconds (user + system) of the job's whole process tree, from the rusage of
the children this script waited for: the driver waits for its roles (spawn) or for the role
server, which waits for the roles it forked, and each replica for its workers, so every process
is counted, whoever started it. Trials alternate the two methods, ``--repeats`` each, after one
untimed job that fills numba's cache. ``python bench/figures/role_start.py --repeats 5 --out
bench/results/role_start.json`` prints one JSON line: the median per scenario and method, their
ratio, every trial, the machine and the versions.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

METHODS = ("forkserver", "spawn")
SCENARIOS = ("job", "roles")
CHILD_TIMEOUT_S = 1800.0

ROLES = """
import sys
from pathlib import Path
from hogwild.cluster.local import LocalLauncher
from hogwild.cluster.roles import RoleSpec
from hogwild.config import load_config
data, count, method, run_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
config = load_config(None, {"cluster.start_method": method})
specs = [RoleSpec("data", i, ("data", "serve", data, "--bind", "127.0.0.1", "--port", "0"))
         for i in range(count)]
with LocalLauncher(config, run_dir) as launcher:
    launcher.start_all(specs)
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/role_start.py", description=__doc__)
    add = parser.add_argument
    add("--data", default=os.environ.get("HOGWILD_DATA", "mnist"), help="MNIST's directory")
    add("--replicas", type=int, default=2, help="replica roles (default 2)")
    add("--ps", type=int, default=2, help="parameter-server roles (default 2)")
    add("--data-servers", type=int, default=1, help="data-server roles (default 1)")
    add("--roles", type=int, default=4, help="data servers in the roles scenario (default 4)")
    add("--subset", type=int, default=500, help="training examples per job (default 500)")
    add("--repeats", type=int, default=3, help="trials of each method (default 3)")
    add("--quick", action="store_true", help="one trial of each method: a smoke run")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    if min(args.replicas, args.ps, args.subset, args.repeats, args.roles) < 1:
        parser.error("--replicas, --ps, --subset, --roles and --repeats must be at least 1")
    if args.data_servers < 0:
        parser.error("--data-servers must be at least 0")
    return args


def job_command(args, method: str, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "hogwild.cli", "cluster", "--data", args.data]
    command += ["--checkpoint-dir", str(run_dir), "--no-progress", "--epochs", "1"]
    command += ["--subset", str(args.subset), "--replicas", str(args.replicas)]
    command += ["--ps", str(args.ps), "--data-servers", str(args.data_servers)]
    command += ["--workers-per-replica", "1", f"--cluster.start_method={method}"]
    return command


def roles_command(args, method: str, run_dir: Path) -> list[str]:
    return [sys.executable, "-c", ROLES, args.data, str(args.roles), method, str(run_dir)]


def cpu_of(command: list[str]) -> float:
    """CPU seconds (user + system) of ``command``'s whole process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    if "not forked" in done.stderr:  # the server could not be used: no peer measured
        raise RuntimeError(f"the roles were not forked: {done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(args, folder: Path) -> dict:
    commands = {"job": job_command, "roles": roles_command}
    trials = {s: {m: [] for m in METHODS} for s in SCENARIOS}
    cpu_of(job_command(args, "spawn", folder / "warm"))  # numba's cache filled first
    for trial in range(args.repeats):
        for method in METHODS:
            for scenario in SCENARIOS:
                run_dir = folder / f"{scenario}-{method}-{trial}"
                cpu = cpu_of(commands[scenario](args, method, run_dir))
                trials[scenario][method].append(round(cpu, 3))
                print(f"role_start: {scenario} {method}: {cpu:.2f} CPU-s",
                      file=sys.stderr, flush=True)  # fmt: skip
    medians = {s: {m: statistics.median(trials[s][m]) for m in METHODS} for s in SCENARIOS}
    return {
        "benchmark": "role_start",
        "job": {
            "replicas": args.replicas,
            "ps": args.ps,
            "data_servers": args.data_servers,
            "subset": args.subset,
        },
        "roles": args.roles,
        "cpu_s": medians,
        "spawn_over_forkserver": {
            s: round(medians[s]["spawn"] / medians[s]["forkserver"], 2) for s in SCENARIOS
        },
        "trials": trials,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)

    def in_a_folder() -> dict:
        with tempfile.TemporaryDirectory(prefix="role-start-") as folder:
            return measure(args, Path(folder))

    return measured_and_emitted(__file__, argv, in_a_folder, args.out)


if __name__ == "__main__":
    sys.exit(main())
