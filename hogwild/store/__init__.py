"""Parameter stores: where a worker's parameters come from and where its progress goes."""
