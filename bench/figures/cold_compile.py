"""The engine's cold compile: seconds and compilations, beside numba's per-constant default.

A fresh install, a fresh ``NUMBA_CACHE_DIR`` and every cluster role started with an empty cache
compile the engine's kernels before the first example trains. Each trial runs a child process
with a cache of its own that compiles what a ``hogwild train`` worker calls
(:func:`hogwild.model.compile.compile_kernels` for Adam's MNIST model at ``--batch``, then with
``--feed`` at batch 32 with the data kernels a feed runs), twice:

- ``per_type``: as the engine ships (:func:`hogwild.jit.kernel`: one compilation per set
  of argument types);
- ``per_constant``: the yardstick, numba's default, in which a kernel called with a constant
  (an offset of 0, ``training`` True) is compiled again for each constant's literal type (the
  child takes the engine's kernels back to ``numba.njit``'s call typing before compiling);

then loads what it compiled in a second child (a warm start: what every later start costs).
Trials alternate the two, ``--repeats`` times each. ``python bench/figures/cold_compile.py --repeats
3 --out bench/results/compile.json`` prints one JSON line: the medians and every trial's seconds and
compilation count, with the machine and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

MODES = ("per_type", "per_constant")
CHILD_TIMEOUT_S = 1800.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/cold_compile.py", description=__doc__
    )
    add = parser.add_argument
    add("--repeats", type=int, default=1, help="trials of each mode (default 1)")
    add("--batch", type=int, default=1, help="the training batch compiled first (default 1)")
    add("--feed", action="store_true", help="also batch 32 and the data feed's kernels")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    add("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch < 1:
        parser.error("--repeats and --batch must be at least 1")
    return args


def child(mode: str, batch: int, feed: bool) -> dict:
    """In a child with its own cache: compile (or load) the kernels; seconds and compilations."""
    from numba.core import event

    from hogwild.config import load_config
    from hogwild.jit import compiled_per_type
    from hogwild.model.compile import compile_kernels
    from hogwild.model.network import build_network

    if mode == "per_constant":
        for dispatcher in compiled_per_type():
            del dispatcher.get_call_template  # the class's: numba's literal typing again
    compilations = []

    class Count(event.Listener):
        def on_start(self, ev) -> None:
            pass

        def on_end(self, ev) -> None:
            compilations.append(ev.data["dispatcher"].py_func.__name__)

    event.register("numba:compile", Count())
    network = build_network(load_config(None).model)
    started = time.perf_counter()
    compile_kernels(network, batch)
    if feed:
        compile_kernels(network, 32, feed=True)
    return {"seconds": time.perf_counter() - started, "compilations": len(compilations)}


def run_child(mode: str, args, cache: str) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--batch", str(args.batch)]
    command += ["--feed"] if args.feed else []
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    trials = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix="hogwild-bench-compile-") as cache:
                cold = run_child(mode, args, cache)
                warm = run_child(mode, args, cache)
            trials[mode].append(
                {
                    "cold_s": round(cold["seconds"], 2),
                    "compilations": cold["compilations"],
                    "warm_s": round(warm["seconds"], 2),
                }
            )
            print(f"compile: {mode}: {trials[mode][-1]}", file=sys.stderr, flush=True)

    def median(mode: str, key: str) -> float:
        return statistics.median(t[key] for t in trials[mode])

    return {
        "benchmark": "compile",
        "batch": args.batch,
        "feed": args.feed,
        "cold_s": {mode: median(mode, "cold_s") for mode in MODES},
        "warm_s": {mode: median(mode, "warm_s") for mode in MODES},
        "compilations": {mode: median(mode, "compilations") for mode in MODES},
        "cold_speedup": round(median("per_constant", "cold_s") / median("per_type", "cold_s"), 2),
        "trials": trials,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.feed)))
        return 0
    return measured_and_emitted(__file__, argv, lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
