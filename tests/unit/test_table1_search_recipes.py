"""``bench/figures/table1_search.py`` without training: its recipes resolve to valid jobs that
differ from the default in what their names say, its log's resume key, and its summary.

The runs themselves are checked in ``tests/proc/test_bench_table1_search.py``.
"""

from __future__ import annotations

import json

import pytest

import hogwild
from bench.figures import table1_search as search


def overrides_of(args: tuple[str, ...]) -> dict[str, str]:
    """A recipe's ``--section.key=value`` arguments as ``load_config`` overrides (flags such as
    ``--sync`` are the CLI's, not config keys)."""
    pairs = [a[2:].split("=", 1) for a in args if "=" in a]
    return dict(pairs)


def test_every_recipe_is_a_valid_job_that_differs_from_the_default():
    default = hogwild.load_config().to_dict()
    for recipe in search.recipes().values():
        config = hogwild.load_config(overrides=overrides_of(recipe.args)).to_dict()
        changed = config != default or "--sync" in recipe.args or recipe.epochs_factor != 1
        changed = changed or recipe.command != "train"  # the same job through the cluster
        assert changed == (recipe.name != search.DEFAULT_RECIPE), recipe.name
        assert recipe.command in ("train", "cluster") and recipe.why


def test_dropout_recipes_change_only_the_dropout_they_name():
    recipes = search.recipes()
    base = [layer.to_dict() for layer in hogwild.load_config().model.layers]

    def layers(name):
        config = hogwild.load_config(overrides=overrides_of(recipes[name].args))
        return [layer.to_dict() for layer in config.model.layers]

    conv = layers("conv-dropout-0.4")
    assert [x for x in conv if x != base[conv.index(x)]] == [{"type": "dropout", "p": 0.4}]
    assert conv[conv.index({"type": "dropout", "p": 0.4}) - 1]["type"] == "maxpool"
    pool1 = layers("pool1-dropout-0.1")
    first_pool = next(i for i, x in enumerate(base) if x["type"] == "maxpool")
    assert pool1[first_pool + 1] == {"type": "dropout", "p": 0.1}
    assert pool1[: first_pool + 1] + pool1[first_pool + 2 :] == base
    fc = layers("fc-dropout-0.3")
    assert [x["p"] for x in fc if x["type"] == "dropout"] == [0.25, 0.3, 0.3]


def test_the_summary_pairs_each_recipe_with_the_default_over_shared_seeds():
    runs = [
        {"recipe": "default", "epochs": 6, "seed": 1, "test_accuracy": 0.990},
        {"recipe": "default", "epochs": 6, "seed": 2, "test_accuracy": 0.992},
        {"recipe": "lr-0.01", "epochs": 6, "seed": 2, "test_accuracy": 0.995},
        {"recipe": "lr-0.01", "epochs": 6, "seed": 3, "test_accuracy": 0.980},
        {"recipe": "lr-0.01", "epochs": 12, "seed": 2, "test_accuracy": 0.996},
        {"recipe": "sync", "epochs": 6, "seed": 1, "test_accuracy": None, "error": "x"},
    ]
    rows = {(r["recipe"], r["epochs"]): r for r in search.summarise(runs)}
    assert set(rows) == {("default", 6), ("lr-0.01", 6), ("lr-0.01", 12)}  # failed: no mean
    assert rows["default", 6]["mean"] == pytest.approx(0.991)
    assert "vs_default" not in rows["default", 6]
    assert rows["lr-0.01", 6]["mean"] == pytest.approx(0.9875)
    assert rows["lr-0.01", 6]["vs_default"] == pytest.approx(0.003)  # seed 2 only
    assert rows["lr-0.01", 6]["vs_default_seeds"] == [2]
    assert "vs_default" not in rows["lr-0.01", 12]  # no default at that length


def test_a_torn_log_line_is_an_error_naming_it(tmp_path):
    log = tmp_path / "search.jsonl"
    good = {"recipe": "default", "args": [], "seed": 1, "epochs": 6, "extra": []}
    log.write_text(json.dumps(good) + "\n" + '{"recipe": "sync", "ar\n')
    with pytest.raises(SystemExit, match=r"search.jsonl:2: not a search run"):
        search.read_log(log)


def test_unknown_recipes_and_bad_lengths_are_refused(capsys):
    with pytest.raises(SystemExit):
        search.parse_args(["--data", "x", "--recipes", "default", "no-such-recipe"])
    assert "unknown recipe 'no-such-recipe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        search.parse_args(["--data", "x", "--epochs", "-1"])
    assert "--epochs -1" in capsys.readouterr().err


def test_the_named_table1_config_is_the_default_job_with_the_screens_recipe(repo_root):
    named = hogwild.load_config(repo_root / "hogwild" / "configs" / "adam_table1.toml")
    recipe = search.recipes()["init-xavier"]
    assert named.to_dict() == hogwild.load_config(overrides=overrides_of(recipe.args)).to_dict()
    assert named.to_dict() != hogwild.load_config().to_dict()
