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

__all__ = ["PAPER_JOB", "PAPER_OVERRIDES"]


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
