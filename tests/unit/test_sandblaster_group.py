"""What a Sandblaster worker group refuses before a job starts, and how it cuts a batch."""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.sandblaster.group import (
    MIN_PORTION,
    check_job,
    lbfgs_batch_size,
    portion_size,
)

from hogwild.config import config_from_dict
from hogwild.data.mnist import MnistData
from hogwild.errors import ConfigError
from tests.config_cases import small


def mnist(n: int = 4) -> MnistData:
    images, labels = np.zeros((n, 8, 8), np.uint8), np.zeros(n, np.uint8)
    return MnistData(images, labels, images, labels, "<memory>")


def config(**sections):
    data = small(**sections)
    data.setdefault("cluster", {})["framework"] = "sandblaster"
    return config_from_dict(data)


def test_a_group_trains_from_mnist_arrays():
    check_job(config(), mnist())


@pytest.mark.parametrize(
    ("sections", "data", "says"),
    [
        ({"cluster": {"data_servers": 1}}, mnist(), "data servers: not built"),
        ({"data": {"servers": ["127.0.0.1:5000"]}}, mnist(), "data servers: not built"),
        ({"data": {"augment": "mnist"}}, mnist(), "line search compares losses"),
        ({}, object(), "image cache"),
    ],
)
def test_what_a_group_cannot_train_from_is_refused(sections, data, says):
    with pytest.raises(ConfigError, match=says):
        check_job(config(**sections), data)


def test_allreduce_needs_a_batch_it_can_split_over_its_workers():
    data = small(cluster={"framework": "allreduce", "workers_per_group": 2})
    with pytest.raises(ConfigError, match="train.batch = 1 is too small; e.g. --train.batch=256"):
        check_job(config_from_dict(data), mnist(), "allreduce")
    data["train"] = {"batch": 32}
    check_job(config_from_dict(data), mnist(), "allreduce")


def test_a_warm_start_needs_a_batch_it_can_split_over_its_workers():
    data = small(cluster={"framework": "sandblaster", "workers_per_group": 2,
                          "lbfgs_warm_start": 1000})  # fmt: skip
    with pytest.raises(ConfigError, match="lbfgs_warm_start = 1000 steps once per batch"):
        check_job(config_from_dict(data), mnist())
    data["train"] = {"batch": 32}
    check_job(config_from_dict(data), mnist())


def test_growing_lbfgs_batches_reach_the_share_and_stay_there():
    assert [lbfgs_batch_size(5000, 1.5, e, 60_000) for e in range(8)] == [
        5000, 7500, 11250, 16875, 25312, 37969, 56953, 60_000
    ]  # fmt: skip
    assert lbfgs_batch_size(5000, 2.0, 10_000, 60_000) == 60_000  # no overflow, the share
    assert lbfgs_batch_size(5000, 1.0, 50, 60_000) == 5000  # a fixed batch
    assert lbfgs_batch_size(0, 1.0, 3, 60_000) == 60_000  # the full batch
    assert lbfgs_batch_size(5000, 1.5, 0, 1000) == 1000  # never more than the share


def test_portions_are_much_smaller_than_a_workers_share():
    assert portion_size(1000, 2) == 63  # 16 portions: 8 per worker
    assert portion_size(60_000, 4) == 1875
    assert portion_size(50, 4) == MIN_PORTION  # never below the minimum
