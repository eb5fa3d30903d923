"""Machine topology and the placement of worker processes on cores."""
