"""Figure scripts: each reproduces a paper's figure or table, or a claim the README measures, and
prints one JSON line (the same line goes to ``--out``). Run from the repository root as
``python bench/figures/NAME.py ...`` (or ``python -m bench.figures.NAME ...``)."""
