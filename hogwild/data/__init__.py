"""Data sources: MNIST idx files (with download and checksums) and the data directory."""
