"""Shared-memory mechanics: the parameter arena, segment naming and the sweeper of dead segments."""
