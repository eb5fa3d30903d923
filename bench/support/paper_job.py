"""The job this project's benchmarks beside peers were measured with: Adam's model as the paper
gives it, on the schedule that was the default before Table 1's (``bench/results/table1.md``).

The bundled default job adds dropout, a warm-up and a 60-epoch cosine schedule to reach its best
accuracy. The benchmarks that train beside peers (PyTorch's Hogwild and RPC parameter server and
a Ray actor train the dropout-free model) or against their own committed figures apply
:data:`PAPER_OVERRIDES` (in process) or :data:`PAPER_JOB` (on the command line, before their own
settings, which win), so a new run measures the work the committed figures and the peers did.
Epoch counts are the benchmarks' own.
"""

from __future__ import annotations

import hogwild

__all__ = ["PAPER_JOB", "PAPER_OVERRIDES", "REPLICATED_JOB_ARGS"]


def _layers_without_dropout() -> str:
    """The bundled layer stack without its dropout layers, as one TOML inline array."""
    model = hogwild.load_config().model.without_dropout()
    tables = []
    for layer in model.layers:
        keys = ", ".join(
            f"{key} = {value!r}".replace("'", '"') for key, value in layer.to_dict().items()
        )
        tables.append("{" + keys + "}")
    return "[" + ", ".join(tables) + "]"


PAPER_OVERRIDES: dict[str, object] = {
    "model.layers": _layers_without_dropout(),
    "optim.lr": 0.003,
    "optim.schedule": "step",
    "optim.decay": 0.5,
    "optim.decay_every": 3,
    "optim.weight_decay": 0.0005,
    "optim.warmup_epochs": 0,
}
PAPER_JOB = [f"--{key}={value}" for key, value in PAPER_OVERRIDES.items()]

# The replicated ``hogwild cluster`` job the fault benchmarks (chaos_cluster.py, partitions.py)
# train: three servers, two replicas, a data server, a driver that restarts whatever dies.
# Exchanges every 64 examples, not the ps store's 512: eight times the updates in flight when a
# server dies (the harder case for failover), enough of them in a quick run's short job for the
# faults to find updates flowing, and the cadence the committed figures were measured at.
REPLICATED_JOB_ARGS = [
    "--ps", "3", "--replicas", "2", "--data-servers", "1", "--cluster.restarts=1000",
    "--train.n_push=64", "--train.n_fetch=64",
]  # fmt: skip
