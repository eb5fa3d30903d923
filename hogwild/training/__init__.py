"""The single-node engine: trainer, worker loop, epochs, evaluation, checkpoints, metrics."""
