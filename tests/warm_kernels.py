"""Compile the kernels the suite's jobs run into numba's on-disk cache, beside the first tests.

Run by ``tests/conftest.py`` as a background process, once per run (``python -m
tests.warm_kernels PYTEST_PID FOLDER``; it dies with that process, however that ends). It
compiles the parameter servers' kernels first and touches ``FOLDER/ps.done``, then the rest and
touches ``FOLDER/all.done``; the tests that need a stage wait for it, and the tests that need
none run meanwhile (:mod:`tests.schedule`). From a cold cache, as CI runs, the engine's kernels
take about a minute and a half to compile on one core, and the first multi-process test would
otherwise compile them while its roles wait.

It compiles what a job's processes compile, in the same way and under the same host locks
(:func:`hogwild.model.compile.compile_lock`, the parameter servers' and the data servers'): a job
that starts meanwhile waits for the lock and then loads, instead of compiling the same code on the
same cores. Unit tests that call a kernel in process take no lock: one that gets there first
compiles it too (the same code, twice). The default job's network stands for every network: the
kernels are typed by dtype, not by layer sizes. Nothing here is checked: a test that needs a
kernel compiles it itself when this did not.

Then a Sandblaster replica's portion gradient, called as its roles call it: it runs the training
loop (``train_chunk``) with the job's types, which the engine's stage compiled, so it loads that
rather than compiling a kernel of its own. The unit tests that call it (marked ``warmed_kernels``,
with the ones calling the jobs' kernels in process: the finite-difference checks among them, which
run the jobs' float32 passes) wait for the whole warm-up and load what it compiled. No test
compiles a float type the jobs do not run: the kernels' float64 variants cost a compile as long as
the float32 ones (about a minute of CPU from cold), for tests only.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

from hogwild.config import default_config_path, load_config
from hogwild.data.feed import compile_data_kernels
from hogwild.model.compile import compile_kernels, compile_lock
from hogwild.model.loops import LABEL_DTYPE
from hogwild.model.network import build_network
from hogwild.signals import die_with_parent
from hogwild.training.api import TrainedModel
from tests.schedule import ALL, PS, done_file


def main() -> None:
    die_with_parent(signal.SIGKILL)  # a killed pytest takes this along
    if len(sys.argv) > 1 and os.getppid() != int(sys.argv[1]):
        return  # the session ended before the death signal was asked for
    folder = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    try:
        from hogwild_plugins.ps import kernels
    except ImportError:  # the cluster extra is not installed: no parameter servers to run
        kernels = None
    if kernels is not None:
        with compile_lock(kernels="ps-kernels"):
            kernels.compile_kernels()
    _done(folder, PS)
    config = load_config(default_config_path())
    network = build_network(config.model)
    with compile_lock():
        compile_kernels(network, config.train.batch, config.train.update_every)
        model = TrainedModel(config, network, np.zeros(network.n_params, np.float32))
        model.predict_proba(np.zeros((1, network.input_size), np.uint8))
    with compile_lock(kernels="data-kernels"):
        compile_data_kernels()
    if kernels is not None:
        compile_portion_gradient(network)
    _done(folder, ALL)


def _done(folder: Path | None, stage: int) -> None:
    """Tell the waiting tests (:mod:`tests.schedule`) that ``stage`` is compiled."""
    if folder is not None:
        done_file(folder, stage).touch()


def compile_portion_gradient(network) -> None:
    """A Sandblaster replica's summed gradient of a portion, called as its roles call it (at
    their first portion, under no lock): the training loop :func:`compile_kernels` compiled
    just before, loaded with the job's types, not a kernel of its own."""
    from hogwild_plugins.ps.sandblaster.replica import Examples, PortionGradient

    images = np.zeros((1, network.input_size), np.uint8)  # a batch: uint8 rows, the jobs' labels
    examples = Examples(images, np.zeros(1, LABEL_DTYPE), np.zeros(1, np.int64), portion=1)
    PortionGradient(network, examples)(np.zeros(network.n_params, np.float32), 0)


if __name__ == "__main__":
    main()
