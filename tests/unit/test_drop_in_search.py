"""``bench/figures/drop_in_search.py`` without training: every recipe is a valid ``drop_in.py``
command and a valid hogwild job, recipes differ, the log resumes and summarises per recipe.

The training it drives is ``drop_in.run_hogwild``, run by ``tests/proc/test_bench_drop_in.py``.
"""

from __future__ import annotations

import json

import pytest

import hogwild
from bench.figures import drop_in
from bench.figures import drop_in_search as search


def job_of(flags: list[str]) -> dict:
    """The hogwild job ``drop_in.py`` trains with ``flags``: its optim and train sections."""
    args = drop_in.parse_args(flags)
    config = hogwild.load_config(
        overrides={
            "optim.rule": args.rule,
            "optim.lr": args.lr,
            "optim.schedule": args.schedule,
            "optim.smooth": args.smooth,
            "optim.warmup_epochs": args.warmup_epochs,
            "optim.weight_decay": args.weight_decay,
            "optim.momentum": args.momentum,
            "optim.beta2": args.beta2,
            "train.batch": args.batch,
            "train.epochs": args.hogwild_epochs,
        }
    )
    job = config.to_dict()
    return {"optim": job["optim"], "train": job["train"]}


def test_every_recipe_is_a_valid_job_and_no_two_are_the_same():
    jobs = {}
    for name, flags in search.RECIPES.items():
        jobs[name] = json.dumps(job_of(flags), sort_keys=True)
        # the name's rule, batch and epochs are the flags'
        rule, batch, epochs = name.split("-")[:3]
        args = drop_in.parse_args(flags)
        assert (args.rule, f"b{args.batch}", f"e{args.hogwild_epochs}") == (rule, batch, epochs)
    assert len(set(jobs.values())) == len(jobs)


def test_unknown_recipes_and_a_tiny_control_are_refused(capsys):
    with pytest.raises(SystemExit):
        search.parse_args(["--recipes", "adam-b32-e1", "no-such-recipe"])
    assert "no-such-recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        search.parse_args(["--control", "10"])
    assert "--control" in capsys.readouterr().err


def run(recipe, seed, curve, reached, ratio=None, error=None) -> dict:
    if error:
        return {"recipe": recipe, "seed": seed, "error": error}
    return {
        "recipe": recipe,
        "seed": seed,
        "test_accuracy_per_epoch": curve,
        "examples_to_target": reached,
        "expected_ratio": ratio,
    }


def test_the_log_resumes_and_the_summary_needs_every_seed_at_the_target(tmp_path):
    log = tmp_path / "search.jsonl"
    assert search.read_log(log) == []
    runs = [
        run("adam-b32-e2", 1, [0.985, 0.9905], 120_000, 2.2),
        run("adam-b32-e2", 2, [0.986, 0.9912], 120_000, 1.8),
        run("adam-b32-e1", 1, [0.9901], 60_000, 4.0),
        run("adam-b32-e1", 2, [0.9893], None),
        run("adam-b16-e1", 1, None, None, error="RuntimeError('x')"),
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in runs) + "\n", encoding="utf-8")
    assert search.read_log(log) == runs  # blank lines skipped, order kept

    rows = {row["recipe"]: row for row in search.summarise(search.read_log(log))}
    assert set(rows) == {"adam-b32-e2", "adam-b32-e1"}  # a failed run has no curve
    two = rows["adam-b32-e2"]
    assert two["seeds"] == [1, 2] and two["seeds_reached"] == 2
    assert two["min_accuracy_per_epoch"] == [0.985, 0.9905]
    assert two["examples_to_target"] == 120_000
    assert two["mean_expected_ratio"] == pytest.approx(2.0)
    one = rows["adam-b32-e1"]
    assert one["seeds_reached"] == 1 and one["examples_to_target"] is None  # one seed only
    assert one["min_accuracy_per_epoch"] == [0.9893]
