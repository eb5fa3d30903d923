"""The ways into a partitioned job refuse what it cannot honour before any data is read.

``hogwild.train`` does not train a job with ``model.partitions > 1`` whole, unpartitioned: it
names the partitioned trainer. That trainer refuses a TensorBoard directory (which it does not
write) by name, and names an unwritable metrics file before MNIST is looked for
(``HOGWILD_DATA`` points nowhere in these tests: reading data would fail with another error). An
update rule the partitions do not apply (adam, adamw) is refused with the config itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import hogwild
from hogwild.errors import ConfigError, HogwildError
from hogwild.partition.runtime import train_partitioned

PARTITIONED = {"model.partitions": 2}


@pytest.fixture(autouse=True)
def no_data(monkeypatch, tmp_path):
    monkeypatch.setenv("HOGWILD_DATA", str(tmp_path / "nowhere"))


def test_tensorboard_is_refused_by_the_partitioned_trainer(tmp_path):
    with pytest.raises(ConfigError, match="output.tensorboard"):
        train_partitioned(overrides={**PARTITIONED, "output.tensorboard": str(tmp_path / "tb")})


def test_an_unwritable_metrics_file_is_named_before_the_data_is_read(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    with pytest.raises(HogwildError, match="metrics file"):
        train_partitioned(overrides={**PARTITIONED, "output.metrics": str(blocker / "m.jsonl")})


def test_train_points_a_partitioned_job_at_its_trainer_instead_of_training_it_whole():
    x, y = np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.int64)
    with pytest.raises(ConfigError, match="train_partitioned"):
        hogwild.train(data=(x, y), test_data=(x, y), overrides=PARTITIONED)


@pytest.mark.parametrize("rule", ["adam", "adamw"])
def test_an_update_rule_the_partitions_do_not_apply_is_refused_by_name(rule):
    """Adam's moments are not kept per partition: such a job would train with plain SGD."""
    with pytest.raises(ConfigError, match=f"optim.rule = '{rule}'.*'sgd' or 'momentum'"):
        train_partitioned(overrides={**PARTITIONED, "optim.rule": rule})
    with pytest.raises(ConfigError, match="model.partitions > 1"):  # the CLI's config too
        hogwild.load_config(None, {**PARTITIONED, "optim.rule": rule})
