"""The single-node engine: trainer (parent), worker loop, epochs, evaluation, checkpoints, metrics."""
