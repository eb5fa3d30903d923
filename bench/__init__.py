"""The benchmarks: scripts that reproduce the papers' figures and the README's measured claims.

``bench/figures/`` holds the scripts a reader runs (each prints one JSON line), ``bench/peers/``
the yardsticks they stand beside (PyTorch, Ray, raw pyzmq, controls), ``bench/support/`` what
they share (the record, the machine, plots, job handling, leak checks), and ``bench/results/``
the committed runs. bench/README.md says how to run them and how they import each other.
"""
