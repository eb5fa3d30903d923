"""The partition plan: unit ranges, boundaries, bytes crossing, owned rows, bad K (no kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.model.network import build_network
from hogwild.numa.caches import CacheLevel, parse_size, read_caches
from hogwild.partition.plan import plan_partitions, split_units


def test_split_units_is_contiguous_and_even_when_possible():
    assert split_units(10, 2) == ((0, 5), (5, 10))
    assert split_units(10, 3) == ((0, 4), (4, 7), (7, 10))
    assert split_units(7, 7) == tuple((i, i + 1) for i in range(7))


def test_adam_model_boundaries_and_bytes_crossing():
    network = build_network(load_config().model)
    plan = plan_partitions(network, 3)
    names = [plan.layers[b.layer].name for b in plan.boundaries]
    assert names == ["conv2", "fc1", "fc2", "fc3", "softmax"]
    conv2 = plan.boundaries[0]
    assert conv2.slices == ((0, 576), (576, 1008), (1008, 1440))  # 10 maps of 12x12: 4, 3, 3
    assert conv2.forward_bytes == conv2.backward_bytes == 4 * 2 * 1440  # (K-1) x the block
    softmax = plan.boundaries[-1]
    assert softmax.contributors == (0,)  # its owner alone computes the errors of the scores
    assert softmax.forward_bytes == softmax.backward_bytes == 4 * 6  # the 6 scores it lacks
    assert plan.bytes_per_example == sum(
        b.forward_bytes + b.backward_bytes for b in plan.boundaries
    )
    assert plan.segments[0] == (0, conv2.layer) and plan.segments[-1][1] == len(network.layers)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_partitions_own_disjoint_rows_that_cover_every_parameter(k):
    network = build_network(load_config().model)
    plan = plan_partitions(network, k)
    owner = np.full(network.n_params, -1)
    for p in range(k):
        for lo, hi in plan.param_rows(p):
            assert (owner[lo:hi] == -1).all(), f"partition {p} shares rows with another"
            owner[lo:hi] = p
    for spec in network.params:
        assert (owner[spec.offset : spec.offset + spec.size] >= 0).all(), spec.name
    assert plan.bytes_per_example == 0 if k == 1 else plan.bytes_per_example > 0


def test_more_partitions_than_a_layer_has_units_is_refused_by_name():
    network = build_network(load_config().model)
    with pytest.raises(
        ConfigError, match=r"model.partitions = 11 exceeds the 10 output maps of conv1"
    ):
        plan_partitions(network, 11)
    with pytest.raises(ConfigError, match="positive"):
        plan_partitions(network, 0)


def test_a_layer_before_the_first_weighted_one_is_refused_by_name():
    from hogwild.config import config_from_dict

    layers = [{"type": "relu"}, {"type": "fc", "units": 10}, {"type": "softmax"}]
    model = config_from_dict({"model": {"input": [1, 28, 28], "layers": layers}}).model
    with pytest.raises(ConfigError, match=r"needs a conv or fc layer first; model.layers\[0\]"):
        plan_partitions(build_network(model), 2)


def test_caches_are_read_from_sysfs_without_instruction_caches(tmp_path):
    caches = tmp_path / "devices/system/cpu/cpu3/cache"
    for index, (level, kind, size, shared) in enumerate(
        [(1, "Data", "48K", "3"), (1, "Instruction", "32K", "3"), (2, "Unified", "2048K", "2-3"),
         (3, "Unified", "96M", "0-15")]
    ):  # fmt: skip
        folder = caches / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{value}\n")
        (folder / "shared_cpu_list").write_text(shared + "\n")
    found = read_caches(3, tmp_path)
    assert found == (
        CacheLevel(1, "Data", 48 << 10, 1),
        CacheLevel(2, "Unified", 2 << 20, 2),
        CacheLevel(3, "Unified", 96 << 20, 16),
    )
    assert read_caches(4, tmp_path) == ()  # a CPU sysfs does not describe


def test_describe_names_partitions_boundaries_and_caches():
    plan = plan_partitions(build_network(load_config().model), 2)
    text = plan.describe((CacheLevel(2, "Unified", 1 << 20, 1),))
    assert "boundary before fc1" in text and "bytes crossing per example" in text
    assert "fits in L2" in text
    assert parse_size("32K") == 32768 and parse_size("1M") == 1 << 20
    assert all(c.size > 0 and c.kind != "Instruction" for c in read_caches())


def test_hogwild_info_prints_the_plan(capsys):
    from hogwild.cli import main

    assert main(["info", "--partitions", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "Model partitioned over 2 partitions" in out and "bytes crossing per example: 20,520" in out
    )
    assert main(["info", "--partitions", "11"]) == 2
    assert "exceeds the 10 output maps of conv1" in capsys.readouterr().err
