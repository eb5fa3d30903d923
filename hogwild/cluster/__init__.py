"""hogwild cluster: one job's model replicas, parameter servers, data servers and launchers."""
